#include "tessel/dit/wan_lora.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include "tessel/core/error.h"
#include "tessel/core/finite_check.h"
#include "tessel/core/io/bounded_read.h"
#include "tessel/core/io/limited_json.h"
#include "tessel/core/io/safetensors.h"
#include "tessel/core/parallel.h"
#include "tessel/dit/wan_weights.h"

namespace tessel {
namespace {

bool ends_with(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}
bool starts_with(std::string_view text, std::string_view prefix) { return text.substr(0, prefix.size()) == prefix; }

// The original Wan name of a diffusers module inside a block ("attn1.to_q" -> "self_attn.q"), or of
// a module outside the blocks; empty when the two namings agree.
std::string original_block_module(const std::string& name) {
  static const std::map<std::string, std::string> kBlock = {
      {"attn1.to_q", "self_attn.q"},       {"attn1.to_k", "self_attn.k"},          {"attn1.to_v", "self_attn.v"},
      {"attn1.to_out.0", "self_attn.o"},   {"attn1.norm_q", "self_attn.norm_q"},   {"attn1.norm_k", "self_attn.norm_k"},
      {"attn2.to_q", "cross_attn.q"},      {"attn2.to_k", "cross_attn.k"},         {"attn2.to_v", "cross_attn.v"},
      {"attn2.to_out.0", "cross_attn.o"},  {"attn2.norm_q", "cross_attn.norm_q"},  {"attn2.norm_k", "cross_attn.norm_k"},
      {"attn2.add_k_proj", "cross_attn.k_img"}, {"attn2.add_v_proj", "cross_attn.v_img"},
      {"attn2.norm_added_k", "cross_attn.norm_k_img"},
      {"norm2", "norm3"},  // the cross-attention norm (diffusers' norm2 is Wan's norm3)
      {"ffn.net.0.proj", "ffn.0"},         {"ffn.net.2", "ffn.2"},                 {"scale_shift_table", "modulation"}};
  const auto found = kBlock.find(name);
  return found == kBlock.end() ? "" : found->second;
}
std::string original_module(const std::string& name) {
  static const std::map<std::string, std::string> kTop = {
      {"condition_embedder.time_embedder.linear_1", "time_embedding.0"},
      {"condition_embedder.time_embedder.linear_2", "time_embedding.2"},
      {"condition_embedder.time_proj", "time_projection.1"},
      {"condition_embedder.text_embedder.linear_1", "text_embedding.0"},
      {"condition_embedder.text_embedder.linear_2", "text_embedding.2"},
      {"condition_embedder.image_embedder.ff.net.0.proj", "img_emb.proj.1"},
      {"condition_embedder.image_embedder.ff.net.2", "img_emb.proj.3"},
      {"condition_embedder.image_embedder.norm1", "img_emb.proj.0"},
      {"condition_embedder.image_embedder.norm2", "img_emb.proj.4"},
      {"condition_embedder.image_embedder.pos_embed", "img_emb.emb_pos"},  // FLF2V's position table
      {"proj_out", "head.head"},
      {"scale_shift_table", "head.modulation"},
      {"patch_embedding", "patch_embedding"}};
  if (starts_with(name, "blocks.")) {
    const size_t dot = name.find('.', 7);
    const std::string original = original_block_module(name.substr(dot + 1));
    return original.empty() ? name : name.substr(0, dot + 1) + original;
  }
  const auto found = kTop.find(name);
  return found == kTop.end() ? name : found->second;
}

// The module of a tensor name and the parameter: "blocks.0.attn1.to_q.weight" -> (module, "weight");
// a bare parameter ("blocks.0.scale_shift_table") is its own module with parameter "".
std::pair<std::string, std::string> split_parameter(const std::string& tensor) {
  for (const char* parameter : {"weight", "bias"})
    if (ends_with(tensor, std::string(".") + parameter))
      return {tensor.substr(0, tensor.size() - std::char_traits<char>::length(parameter) - 1), parameter};
  return {tensor, ""};
}

std::string underscored(std::string name) {
  std::replace(name.begin(), name.end(), '.', '_');
  return name;
}

enum class Part { kDown, kUp, kUpBias, kAlpha, kDiff, kDiffBias };
struct KeySuffix {
  const char* text;
  Part part;
};
constexpr KeySuffix kSuffixes[] = {{".lora_A.weight", Part::kDown},   {".lora_B.weight", Part::kUp},
                                   {".lora_B.bias", Part::kUpBias},   {".lora_down.weight", Part::kDown},
                                   {".lora_up.weight", Part::kUp},    {".alpha", Part::kAlpha},
                                   {".diff_b", Part::kDiffBias},      {".diff", Part::kDiff}};

// What one file holds for one module, before checks.
struct ModuleParts {
  std::map<Part, std::string> keys;  // part -> the file's key
};

struct Format {
  bool kohya = false, original_names = false, diffusers_names = false, low_rank = false, diffs = false;
  std::string describe() const {
    std::string text = kohya ? "kohya/musubi" : original_names ? "original Wan names (ComfyUI)" : "diffusers/PEFT";
    if (low_rank && diffs) return text + ", low-rank and full diffs";
    return text + (diffs ? ", full diffs (LightX2V)" : ", low-rank");
  }
};

// The file-wide alpha and rank of a diffusers- or PEFT-saved adapter, when it says.
struct FileAlpha {
  std::optional<double> alpha;
  std::optional<int64_t> rank;
  bool rank_stabilized = false;  // PEFT's use_rslora: alpha / sqrt(rank) instead of alpha / rank
};

std::optional<double> json_number(const nlohmann::json& json, const std::string& key) {
  for (const std::string& name : {key, "transformer." + key}) {
    const auto found = json.find(name);
    if (found != json.end() && found->is_number()) return found->get<double>();
  }
  return std::nullopt;
}

FileAlpha file_alpha(const SafetensorsFile& file, const std::string& path) {
  nlohmann::json config;
  std::string source;
  if (const auto found = file.metadata().find("lora_adapter_metadata"); found != file.metadata().end()) {
    source = path + ": metadata lora_adapter_metadata";
    config = parse_json_limited(found->second, JsonLimits{}, source);
  } else {
    const std::filesystem::path beside = std::filesystem::path(path).parent_path() / "adapter_config.json";
    if (std::filesystem::path(path).filename() != "adapter_model.safetensors" || !std::filesystem::exists(beside)) return {};
    source = beside.string();
    config = parse_json_limited(read_file_bounded(source, 1 << 20, "adapter_config.json"), JsonLimits{}, source);
  }
  if (!config.is_object()) fail_argument(source, "a JSON object", json_excerpt(config));
  for (const char* pattern : {"alpha_pattern", "rank_pattern"})
    for (const std::string& name : {std::string(pattern), std::string("transformer.") + pattern}) {
      const auto found = config.find(name);
      if (found != config.end() && !found->is_null() && !found->empty())
        fail_argument(source + ": " + name, "empty (per-module ranks or alphas are not supported)", json_excerpt(*found));
    }
  const auto flag = [&](const std::string& key) {
    for (const std::string& name : {key, "transformer." + key})
      if (const auto found = config.find(name); found != config.end() && found->is_boolean() && found->get<bool>()) return true;
    return false;
  };
  if (flag("use_dora")) fail_argument(source + ": use_dora", "false (DoRA adapters are not supported)", "true");
  FileAlpha result;
  result.rank_stabilized = flag("use_rslora");
  result.alpha = json_number(config, "lora_alpha");
  if (const auto rank = json_number(config, "r")) result.rank = static_cast<int64_t>(*rank);
  if (result.alpha && !(std::isfinite(*result.alpha) && *result.alpha > 0))
    fail_argument(source + ": lora_alpha", "a finite number > 0", *result.alpha);
  if (result.alpha && !result.rank) fail_argument(source + ": r", "the rank beside lora_alpha", "absent");
  return result;
}

Tensor load_checked(const SafetensorsFile& file, const std::string& key) {
  Tensor tensor = file.load(key).to(DType::kF32);
  check_finite(tensor.view(), file.path() + ": \"" + key + "\"", "the adapter file is damaged");
  return tensor;
}

std::string shape_text(const Shape& shape) {
  std::string text = "(";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + ")";
}

// One rule for a LoRA's weight wherever it becomes a LoraFile (parsed from text, or given whole):
// finite and within fp32's range, the precision the merge computes in.
void check_lora_scale(double scale, const std::string& what, const std::string& given) {
  if (!std::isfinite(scale) || std::abs(scale) > std::numeric_limits<float>::max())
    fail_argument(what, "a finite scale within fp32's range", given);
}

}  // namespace

LoraFile parse_lora_file(std::string_view text, const std::string& what) {
  LoraFile file{std::string(text), 1.0};
  if (const size_t colon = text.rfind(':'); colon != std::string_view::npos) {
    const std::string number(text.substr(colon + 1));
    char* end = nullptr;
    errno = 0;
    const double scale = number.empty() ? NAN : std::strtod(number.c_str(), &end);
    if (!number.empty() && end == number.c_str() + number.size() && errno == 0) {
      check_lora_scale(scale, what, std::string(text));
      file = {std::string(text.substr(0, colon)), scale};
    }
  }
  if (file.path.empty()) fail_argument(what, "path[:scale] with a path", std::string(text));
  return file;
}

std::pair<std::string, LoraFile> parse_lora_adapter(std::string_view text, const std::string& what) {
  const size_t equals = text.find('=');
  if (equals == std::string_view::npos) fail_argument(what, "name=path[:scale]", std::string(text));
  const std::string name(text.substr(0, equals));
  const bool name_ok = !name.empty() && name.size() <= 64 && std::all_of(name.begin(), name.end(), [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '-' || ch == '.';
  });
  if (!name_ok) fail_argument(what + " name", "1 to 64 letters, digits, '_', '-' or '.'", std::string(text));
  return {name, parse_lora_file(text.substr(equals + 1), what)};
}

std::vector<std::pair<std::string, std::string>> wan_lora_module_aliases(const WanConfig& config) {
  std::vector<std::pair<std::string, std::string>> aliases;
  std::set<std::string> seen;
  for (const WeightSpec& spec : wan_weight_specs(config)) {
    const std::string module = split_parameter(spec.name).first;
    if (seen.insert(module).second) aliases.emplace_back(module, original_module(module));
  }
  return aliases;
}

std::map<std::string, std::string> wan_module_spellings(const WanConfig& config) {
  std::map<std::string, std::string> by_name;
  for (const auto& [diffusers, original] : wan_lora_module_aliases(config)) {
    by_name[diffusers] = diffusers;
    by_name[original] = diffusers;
  }
  return by_name;
}

std::string strip_wan_key_prefixes(std::string name) {
  for (bool stripped = true; stripped;) {
    stripped = false;
    for (const char* prefix : {"base_model.model.", "model.diffusion_model.", "diffusion_model.", "transformer."})
      if (starts_with(name, prefix)) name = name.substr(std::char_traits<char>::length(prefix)), stripped = true;
  }
  return name;
}

// One delta of one tensor.
struct LoraDelta {
  bool low_rank = false;
  Tensor down, up;  // low rank: down (rank, rest) and up (rows, rank), contiguous
  Tensor full;      // otherwise: the tensor's shape
  int64_t rows = 0, rank = 0, rest = 0;
  double scale = 1.0;
  bool pair_bias = false;  // `full` is lora_B's bias of a low-rank pair (not a LightX2V diff)
  std::string origin;      // "file: \"key\"" of the tensor it came from
};

struct WanLora::Impl {
  std::map<std::string, std::vector<LoraDelta>> deltas;  // by diffusers tensor name
  std::vector<std::string> summary;
};

WanLora::WanLora() : impl_(std::make_unique<Impl>()) {}
WanLora::~WanLora() = default;
WanLora::WanLora(WanLora&&) noexcept = default;
WanLora& WanLora::operator=(WanLora&&) noexcept = default;
bool WanLora::empty() const { return impl_->deltas.empty(); }
bool WanLora::changes(const std::string& tensor) const { return impl_->deltas.count(tensor) > 0; }
const std::vector<std::string>& WanLora::summary() const { return impl_->summary; }

WanLora WanLora::load(const std::vector<LoraFile>& files, const WanConfig& config, bool ignore_unmatched) {
  std::map<std::string, Shape> shapes;
  for (const WeightSpec& spec : wan_weight_specs(config)) shapes.emplace(spec.name, spec.shape);
  // Every spelling of every module -> its diffusers name; kohya's names are the underscored ones.
  const std::map<std::string, std::string> by_name = wan_module_spellings(config);
  std::map<std::string, std::string> by_underscored;
  for (const auto& [spelling, diffusers] : by_name) by_underscored[underscored(spelling)] = diffusers;

  WanLora lora;
  for (const LoraFile& source : files) {
    const std::string& path = source.path;
    check_lora_scale(source.scale, path + ": scale", detail::concat(source.scale));
    require_regular_file(path, "LoRA file");
    const SafetensorsFile file = SafetensorsFile::open(path);
    const FileAlpha file_wide = file_alpha(file, path);
    Format format;
    std::map<std::string, ModuleParts> modules;
    std::vector<std::string> unmatched;
    for (const SafetensorsEntry& entry : file.entries()) {
      const std::string& key = entry.name;
      const KeySuffix* suffix = nullptr;
      for (const KeySuffix& candidate : kSuffixes)
        if (ends_with(key, candidate.text)) {
          suffix = &candidate;
          break;
        }
      if (!suffix) {
        unmatched.push_back(key);
        continue;
      }
      std::string name = key.substr(0, key.size() - std::char_traits<char>::length(suffix->text));
      std::optional<std::string> module;
      if (starts_with(name, "lora_unet_")) {
        const auto found = by_underscored.find(name.substr(10));
        if (found != by_underscored.end()) module = found->second, format.kohya = true;
      } else {
        name = strip_wan_key_prefixes(name);
        if (const auto found = by_name.find(name); found != by_name.end()) {
          module = found->second;
          (name == found->second ? format.diffusers_names : format.original_names) = true;
        }
      }
      if (!module) {
        unmatched.push_back(key);
        continue;
      }
      const bool full_diff = suffix->part == Part::kDiff || suffix->part == Part::kDiffBias;
      (full_diff ? format.diffs : format.low_rank) = true;
      if (!modules[*module].keys.emplace(suffix->part, key).second)
        fail_argument(path + ": \"" + key + "\"", "one tensor per module and part", "a second spelling of " + *module);
    }
    if (modules.empty())
      fail_argument(path, "a LoRA or diff for this Wan transformer (no key matched any of its modules)",
                    detail::concat(file.entries().size(), " keys, e.g. \"", file.entries().empty() ? "" : file.entries()[0].name, "\""));
    if (!unmatched.empty() && !ignore_unmatched) {
      std::string list;
      for (size_t i = 0; i < std::min<size_t>(unmatched.size(), 5); ++i) list += (i ? ", \"" : "\"") + unmatched[i] + "\"";
      fail_argument(path, "keys that all match this Wan transformer's modules (or ignore_unmatched: --lora-ignore-unmatched)",
                    detail::concat(unmatched.size(), " unmatched: ", list, unmatched.size() > 5 ? ", ..." : ""));
    }

    // Check every module's parts, then keep its deltas.
    std::map<std::string, std::vector<LoraDelta>> deltas;
    for (const auto& entry : modules) {
      // Named, not structured bindings: the lambdas below capture them (clang 15 refuses bindings).
      const std::string& module = entry.first;
      const ModuleParts& parts = entry.second;
      const auto key_of = [&](Part part) -> const std::string* {
        const auto found = parts.keys.find(part);
        return found == parts.keys.end() ? nullptr : &found->second;
      };
      const std::string* down_key = key_of(Part::kDown);
      const std::string* up_key = key_of(Part::kUp);
      const std::string* any_key = &parts.keys.begin()->second;
      if ((down_key == nullptr) != (up_key == nullptr))
        fail_argument(path + ": \"" + *any_key + "\"", "both halves of the low-rank pair (lora_A/lora_down and lora_B/lora_up)",
                      "only one");
      if (!down_key && (key_of(Part::kAlpha) || key_of(Part::kUpBias)))
        fail_argument(path + ": \"" + *any_key + "\"", "alongside a low-rank pair of its module", "without one");
      // The tensor a part changes; a bare parameter (scale_shift_table) is its own ".weight".
      const auto target = [&](const std::string& parameter, const std::string& key) {
        const std::string name = module + "." + parameter;
        if (shapes.count(name)) return name;
        if (parameter == "weight" && shapes.count(module)) return module;
        fail_argument(path + ": \"" + key + "\"", "a tensor this model has", "none named " + name);
      };
      if (down_key) {
        const std::string weight = target("weight", *down_key);
        const Shape& w = shapes.at(weight);
        Tensor down = load_checked(file, *down_key), up = load_checked(file, *up_key);
        const int64_t rank = down.shape().empty() ? 0 : down.size(0);
        const int64_t out = w[0], rest = shape_numel(w) / w[0];
        if (rank <= 0 || down.numel() != rank * rest || up.shape().empty() || up.size(0) != out || up.numel() != out * rank)
          fail_argument(path + ": \"" + *down_key + "\" and \"" + *up_key + "\"",
                        detail::concat("(rank, ", rest, ") and (", out, ", rank) for ", weight, " ", shape_text(w)),
                        shape_text(down.shape()) + " and " + shape_text(up.shape()));
        double scale = source.scale;
        if (const std::string* alpha_key = key_of(Part::kAlpha)) {
          const Tensor alpha = load_checked(file, *alpha_key);
          if (alpha.numel() != 1) fail_argument(path + ": \"" + *alpha_key + "\"", "one value", shape_text(alpha.shape()));
          scale *= static_cast<double>(alpha.data_as<float>()[0]) / static_cast<double>(rank);
        } else if (file_wide.alpha) {
          if (*file_wide.rank != rank)
            fail_argument(path + ": \"" + *down_key + "\" rank", detail::concat(*file_wide.rank, " (the adapter's r)"), rank);
          scale *= *file_wide.alpha / (file_wide.rank_stabilized ? std::sqrt(static_cast<double>(rank)) : static_cast<double>(rank));
        }
        LoraDelta delta;
        delta.low_rank = true;
        delta.down = std::move(down);
        delta.up = std::move(up);
        delta.rows = out, delta.rank = rank, delta.rest = rest;
        delta.scale = scale;
        delta.origin = path + ": \"" + *down_key + "\"";
        deltas[weight].push_back(std::move(delta));
        if (const std::string* bias_key = key_of(Part::kUpBias)) {
          const std::string bias = target("bias", *bias_key);
          Tensor full = load_checked(file, *bias_key);
          if (full.shape() != shapes.at(bias))
            fail_argument(path + ": \"" + *bias_key + "\"", shape_text(shapes.at(bias)), shape_text(full.shape()));
          LoraDelta bias_delta;
          bias_delta.full = std::move(full);
          bias_delta.scale = scale;
          bias_delta.pair_bias = true;
          bias_delta.origin = path + ": \"" + *bias_key + "\"";
          deltas[bias].push_back(std::move(bias_delta));
        }
      }
      for (const auto& [part, parameter] : {std::pair{Part::kDiff, "weight"}, std::pair{Part::kDiffBias, "bias"}}) {
        const std::string* key = key_of(part);
        if (!key) continue;
        const std::string tensor = target(parameter, *key);
        Tensor full = load_checked(file, *key);
        if (full.shape() != shapes.at(tensor))
          fail_argument(path + ": \"" + *key + "\"", "the shape of " + tensor + " " + shape_text(shapes.at(tensor)),
                        shape_text(full.shape()));
        LoraDelta delta;
        delta.full = std::move(full);
        delta.scale = source.scale;
        delta.origin = path + ": \"" + *key + "\"";
        deltas[tensor].push_back(std::move(delta));
      }
    }
    for (auto& [tensor, list] : deltas)
      for (LoraDelta& delta : list) lora.impl_->deltas[tensor].push_back(std::move(delta));
    lora.impl_->summary.push_back(detail::concat(path, " (scale ", source.scale, "): ", format.describe(), ", ", modules.size(),
                                                 " modules", unmatched.empty() ? "" : detail::concat(", ", unmatched.size(), " keys ignored")));
  }
  return lora;
}

std::vector<WanLoraFactors> WanLora::factors() const {
  // A contiguous fp32 tensor (a Conv3d's lora_down is (rank, C, pt, ph, pw)) as a (rows, cols) copy.
  const auto matrix = [](const Tensor& tensor, int64_t rows, int64_t cols) {
    Tensor copy = Tensor::empty({rows, cols}, DType::kF32);
    std::copy_n(tensor.data_as<float>(), rows * cols, copy.data_as<float>());
    return copy;
  };
  std::map<std::string, std::vector<WanLoraFactors>> by_module;  // pairs in file order per module
  std::map<std::string, std::vector<const LoraDelta*>> biases;   // lora_B biases in the same order
  for (const auto& [tensor, list] : impl_->deltas)
    for (const LoraDelta& delta : list) {
      if (!delta.low_rank && !delta.pair_bias)
        fail_argument(delta.origin, "a low-rank pair (a full diff only merges into the weights: --lora)",
                      "a full diff of " + tensor);
      const std::string module = split_parameter(tensor).first;
      if (delta.pair_bias) {
        biases[module].push_back(&delta);
        continue;
      }
      WanLoraFactors factors;
      factors.module = module;
      factors.down = matrix(delta.down, delta.rank, delta.rest);
      factors.up = matrix(delta.up, delta.rows, delta.rank);
      factors.scale = delta.scale;
      factors.origin = delta.origin;
      by_module[module].push_back(std::move(factors));
    }
  std::vector<WanLoraFactors> all;
  for (auto& [module, list] : by_module) {
    // A pair's bias came from the same file as the pair: the i-th bias of a module belongs to the
    // i-th pair that has one, matched by its scale's origin file.
    for (const LoraDelta* bias : biases[module])
      for (WanLoraFactors& factors : list)
        if (!factors.up_bias.defined() && factors.origin.substr(0, factors.origin.find(": \"")) ==
                                              bias->origin.substr(0, bias->origin.find(": \""))) {
          factors.up_bias = bias->full.clone();
          break;
        }
    for (WanLoraFactors& factors : list) all.push_back(std::move(factors));
  }
  return all;
}

Tensor WanLora::merged(const std::string& tensor, const TensorView& stored) const {
  Tensor out = Tensor::empty(stored.shape(), DType::kF32);
  copy_convert(stored, out.view());
  const auto found = impl_->deltas.find(tensor);
  if (found == impl_->deltas.end()) return out;
  float* w = out.data_as<float>();
  for (const LoraDelta& delta : found->second) {
    if (!delta.low_rank) {
      if (delta.full.shape() != stored.shape())
        fail_argument("LoRA delta of " + tensor, shape_text(delta.full.shape()), shape_text(stored.shape()));
      const float* d = delta.full.data_as<float>();
      for (int64_t i = 0; i < out.numel(); ++i) w[i] = static_cast<float>(w[i] + delta.scale * d[i]);
      continue;
    }
    // W (out, rest) += scale * up (out, r) @ down (r, rest), one output row per task, accumulated in
    // fp32 as diffusers' fuse does (its fp32 matmul), rounded once into the row.
    const int64_t rows = delta.rows, rank = delta.rank, rest = delta.rest;
    if (rows * rest != out.numel()) fail_argument("LoRA delta of " + tensor, shape_text(stored.shape()), "another shape");
    const float* up = delta.up.data_as<float>();
    const float* down = delta.down.data_as<float>();
    parallel_for(rows, [&](int64_t row) {
      std::vector<float> sum(static_cast<size_t>(rest), 0.0f);
      for (int64_t k = 0; k < rank; ++k) {
        const float u = up[row * rank + k];
        const float* d = down + k * rest;
        for (int64_t j = 0; j < rest; ++j) sum[static_cast<size_t>(j)] += u * d[j];
      }
      float* target = w + row * rest;
      for (int64_t j = 0; j < rest; ++j) target[j] = static_cast<float>(target[j] + delta.scale * sum[static_cast<size_t>(j)]);
    });
  }
  // A scale or delta large enough to overflow fp32 is the LoRA's fault: say so here, not as a
  // non-finite noise prediction after the first step.
  check_finite(out.view(), "tensor \"" + tensor + "\" after merging its LoRA deltas", "lower the LoRA's scale");
  return out;
}

}  // namespace tessel
