#include "tessel/dit/wan_transformer_file.h"

#include <cmath>
#include <optional>
#include <set>

#include "tessel/core/error.h"
#include "tessel/core/finite_check.h"
#include "tessel/core/float8.h"
#include "tessel/core/io/safetensors.h"
#include "tessel/core/parallel.h"
#include "tessel/dit/wan_lora.h"
#include "tessel/dit/wan_weights.h"

namespace tessel {
namespace {

constexpr const char* kComfyScale = ".scale_weight";
constexpr const char* kComfyInputScale = ".scale_input";
constexpr const char* kLightX2VScale = ".weight_scale";
constexpr const char* kComfyMarker = "scaled_fp8";

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string key_text(const std::string& path, const std::string& key) { return path + ": " + quoted_excerpt(key, 120); }

std::string listed(const std::vector<std::string>& keys) {
  std::string out;
  for (size_t i = 0; i < keys.size() && i < 6; ++i) out += (i ? ", " : "") + quoted_excerpt(keys[i], 120);
  if (keys.size() > 6) out += detail::concat(" and ", keys.size() - 6, " more");
  return out;
}

// A scale tensor's values in fp32 (stored fp32, fp16 or bf16), each finite and > 0.
std::vector<float> scale_values(const Checkpoint& file, const std::string& key) {
  const SafetensorsEntry& entry = *file.find(key);
  if (entry.float8_e4m3 || (entry.dtype != DType::kF32 && entry.dtype != DType::kF16 && entry.dtype != DType::kBF16))
    fail_argument(key_text(file.directory(), key) + " dtype", "fp32, fp16 or bf16 (a scale)",
                  entry.float8_e4m3 ? "float8 e4m3" : std::string(dtype_name(entry.dtype)));
  Tensor values = Tensor::empty(entry.shape, DType::kF32);
  copy_convert(file.view(key), values.view());
  std::vector<float> out(values.data_as<float>(), values.data_as<float>() + values.numel());
  for (size_t i = 0; i < out.size(); ++i)
    if (!(std::isfinite(out[i]) && out[i] > 0.0f))
      fail_argument(key_text(file.directory(), key) + detail::concat(" value ", i), "a finite scale > 0", out[i]);
  return out;
}

// The original Wan key of a diffusers tensor name.
std::string original_key(const std::map<std::string, std::string>& original_of, const std::string& tensor) {
  for (const char* parameter : {".weight", ".bias"})
    if (ends_with(tensor, parameter)) {
      const auto found = original_of.find(tensor.substr(0, tensor.size() - std::char_traits<char>::length(parameter)));
      if (found != original_of.end()) return found->second + parameter;
    }
  const auto found = original_of.find(tensor);  // a bare parameter (modulation, emb_pos)
  return found == original_of.end() ? tensor : found->second;
}

}  // namespace

WanFp8FileFormat parse_wan_fp8_file_format(const std::string& text, const std::string& what) {
  if (text == "comfyui") return WanFp8FileFormat::kComfyUi;
  if (text == "lightx2v") return WanFp8FileFormat::kLightX2V;
  fail_argument(what, "comfyui or lightx2v", quoted_excerpt(text));
}

WanTransformerFile WanTransformerFile::open(const std::string& path, const WanConfig& config) {
  WanTransformerFile out;
  out.checkpoint_ = Checkpoint::open_file(path);
  const Checkpoint& file = out.checkpoint_;
  std::map<std::string, Shape> shapes;
  for (const WeightSpec& spec : wan_weight_specs(config)) shapes.emplace(spec.name, spec.shape);
  const std::map<std::string, std::string> modules = wan_module_spellings(config);
  std::map<std::string, std::string> original_of;  // for naming missing tensors as the file would
  for (const auto& [diffusers, original] : wan_lora_module_aliases(config)) original_of[diffusers] = original;
  // A key without its prefix and parameter -> the diffusers tensor ("" when nothing matches).
  const auto resolve = [&](const std::string& name, const std::string& parameter) -> std::string {
    const auto found = modules.find(name);
    if (found == modules.end()) return "";
    const std::string tensor = parameter.empty() ? found->second : found->second + parameter;
    return shapes.count(tensor) ? tensor : "";
  };

  std::vector<std::string> unknown;
  std::map<std::string, std::string> comfy_scales, lightx2v_scales;  // tensor -> the scale's key
  bool marker = false;
  for (const std::string& key : file.tensor_names()) {
    const std::string name = strip_wan_key_prefixes(key);
    const SafetensorsEntry& stored = *file.find(key);
    if (name == kComfyMarker) {
      if (!stored.float8_e4m3 || shape_numel(stored.shape) > 2)
        fail_argument(key_text(path, key), "ComfyUI's scaled_fp8 marker: an e4m3 tensor of at most 2 values",
                      detail::concat(stored.float8_e4m3 ? "e4m3" : dtype_name(stored.dtype), " ", shape_str(stored.shape)));
      marker = true;
      continue;
    }
    bool matched = false;
    for (const auto& [suffix, scales] : {std::pair{kComfyScale, &comfy_scales}, std::pair{kLightX2VScale, &lightx2v_scales}})
      if (ends_with(name, suffix)) {
        const std::string tensor = resolve(name.substr(0, name.size() - std::char_traits<char>::length(suffix)), ".weight");
        if (tensor.empty()) fail_argument(key_text(path, key), "the scale of a weight this model has", "none of that name");
        (*scales)[tensor] = key;
        matched = true;
      }
    if (!matched && ends_with(name, kComfyInputScale)) {
      const std::string tensor = resolve(name.substr(0, name.size() - std::char_traits<char>::length(kComfyInputScale)), ".weight");
      if (tensor.empty()) fail_argument(key_text(path, key), "the input scale of a linear layer this model has", "none of that name");
      if (shape_numel(stored.shape) != 1) fail_argument(key_text(path, key) + " shape", "one value", shape_str(stored.shape));
      (void)scale_values(file, key);  // its dtype and value checked
      continue;  // activations are quantised per token on the fly instead
    }
    if (matched) continue;
    std::string tensor;
    for (const char* parameter : {".weight", ".bias"})
      if (tensor.empty() && ends_with(name, parameter))
        tensor = resolve(name.substr(0, name.size() - std::char_traits<char>::length(parameter)), parameter);
    if (tensor.empty()) tensor = resolve(name, "");  // a bare parameter: modulation, emb_pos
    if (tensor.empty()) {
      unknown.push_back(key);
      continue;
    }
    const auto [it, inserted] = out.entries_.emplace(tensor, Entry{key, {}});
    if (!inserted)
      fail_argument(key_text(path, key), "one key per tensor", detail::concat("a second key for ", tensor, " beside \"", it->second.key, "\""));
  }
  if (!unknown.empty())
    throw Error(detail::concat(path, ": ", unknown.size(), " key(s) that are no tensor of this Wan transformer (config from the model directory): ",
                               listed(unknown)));
  std::vector<std::string> missing;
  for (const auto& [tensor, shape] : shapes) {
    const auto found = out.entries_.find(tensor);
    if (found == out.entries_.end()) {
      missing.push_back(original_key(original_of, tensor));
      continue;
    }
    const SafetensorsEntry& stored = *file.find(found->second.key);
    if (stored.shape != shape)
      throw Error(detail::concat(key_text(path, found->second.key), " has shape ", shape_str(stored.shape), ", the model's ", tensor,
                                 " is ", shape_str(shape)));
    if (stored.float8_e4m3) {
      if (shape.size() != 2)
        fail_argument(key_text(path, found->second.key), "bf16, fp16 or fp32 (e4m3 is read for the weight matrices of linear layers only)",
                      "float8 e4m3");
    } else if (stored.dtype != DType::kF32 && stored.dtype != DType::kF16 && stored.dtype != DType::kBF16) {
      fail_argument(key_text(path, found->second.key) + " dtype", "fp32, fp16, bf16 or (a linear weight) float8 e4m3",
                    dtype_name(stored.dtype));
    }
  }
  if (!missing.empty())
    throw Error(detail::concat(path, ": missing ", missing.size(), " tensor(s) the model needs: ", listed(missing)));

  // Each e4m3 weight takes exactly one scale; each scale belongs to an e4m3 weight.
  int64_t float8_count = 0;
  for (auto& [tensor, entry] : out.entries_) {
    const auto comfy = comfy_scales.find(tensor), lightx2v = lightx2v_scales.find(tensor);
    const bool has_comfy = comfy != comfy_scales.end(), has_lightx2v = lightx2v != lightx2v_scales.end();
    if (!file.find(entry.key)->float8_e4m3) {
      if (has_comfy || has_lightx2v)
        fail_argument(key_text(path, has_comfy ? comfy->second : lightx2v->second), "the scale of an e4m3 weight",
                      detail::concat("a scale of \"", entry.key, "\", stored as ", dtype_name(file.find(entry.key)->dtype)));
      continue;
    }
    if (!has_comfy && !has_lightx2v)
      fail_argument(key_text(path, entry.key), "a scale beside the e4m3 weight (scale_weight, ComfyUI, or weight_scale, LightX2V)", "none");
    if (has_comfy && has_lightx2v)
      fail_argument(key_text(path, entry.key), "one scale", "both \"" + comfy->second + "\" and \"" + lightx2v->second + "\"");
    const std::string& scale_key = has_comfy ? comfy->second : lightx2v->second;
    const int64_t rows = shapes.at(tensor)[0];
    const Shape scale_shape = file.find(scale_key)->shape;
    const int64_t count = shape_numel(scale_shape);
    const bool per_channel = count == rows && (scale_shape == Shape{rows} || scale_shape == Shape{rows, 1});
    if (count != 1 && (has_comfy || !per_channel))
      fail_argument(key_text(path, scale_key) + " shape",
                    has_comfy ? std::string("one value (a per-tensor scale)")
                              : detail::concat("(", rows, ", 1) or (", rows, ") (one per output channel), or one value"),
                    shape_str(scale_shape));
    const std::vector<float> values = scale_values(file, scale_key);
    entry.row_scales = Tensor::empty({rows}, DType::kF32);
    for (int64_t r = 0; r < rows; ++r) entry.row_scales.data_as<float>()[r] = values[count == 1 ? 0 : static_cast<size_t>(r)];
    ++float8_count;
  }
  out.format_ = float8_count == 0 ? "no e4m3 tensors"
                                  : detail::concat(float8_count, " e4m3 weights, ", !comfy_scales.empty() ? "ComfyUI scale_weight" : "",
                                                   !comfy_scales.empty() && !lightx2v_scales.empty() ? " and " : "",
                                                   !lightx2v_scales.empty() ? "LightX2V weight_scale" : "", marker ? ", scaled_fp8 marker" : "");
  return out;
}

const WanTransformerFile::Entry& WanTransformerFile::entry(const std::string& tensor) const {
  const auto found = entries_.find(tensor);
  if (found == entries_.end()) fail_argument(path() + ": tensor", "a tensor of the model", quoted_excerpt(tensor, 120));
  return found->second;
}

bool WanTransformerFile::float8(const std::string& tensor) const { return entry(tensor).row_scales.defined(); }

WanStoredTensor WanTransformerFile::stored(const std::string& tensor) const {
  const Entry& e = entry(tensor);
  WanStoredTensor out{checkpoint_.view(e.key), {}};
  if (!e.row_scales.defined()) {
    check_finite(out.values, key_text(path(), e.key), "the checkpoint is damaged or was saved with overflowed values");
    return out;
  }
  const uint8_t* bytes = out.values.data_as<const uint8_t>();
  int64_t nan_count = 0, first = -1;
  const int64_t n = out.values.numel();
#pragma omp parallel for reduction(+ : nan_count) schedule(static)
  for (int64_t i = 0; i < n; ++i) nan_count += e4m3_is_nan(bytes[i]);
  if (nan_count > 0) {
    for (int64_t i = 0; i < n && first < 0; ++i)
      if (e4m3_is_nan(bytes[i])) first = i;
    throw Error(detail::concat(key_text(path(), e.key), ": ", nan_count, " NaN e4m3 byte(s) (0x7f / 0xff; first at element ", first,
                               "): the checkpoint is damaged"));
  }
  out.row_scales = e.row_scales.view();
  return out;
}

Tensor WanTransformerFile::dequantised(const std::string& tensor) const {
  const WanStoredTensor s = stored(tensor);
  Tensor out = Tensor::empty(s.values.shape(), DType::kF32);
  if (!s.row_scales.data()) {
    copy_convert(s.values, out.view());
    return out;
  }
  const int64_t rows = s.values.size(0), cols = s.values.numel() / rows;
  const uint8_t* bytes = s.values.data_as<const uint8_t>();
  const float* scales = s.row_scales.data_as<const float>();
  float* values = out.data_as<float>();
  float decoded[256];
  for (int b = 0; b < 256; ++b) decoded[b] = e4m3_to_float(static_cast<uint8_t>(b));
  parallel_for(rows, [&](int64_t r) {
    for (int64_t c = 0; c < cols; ++c) values[r * cols + c] = decoded[bytes[r * cols + c]] * scales[r];
  });
  return out;
}

std::string WanTransformerFile::describe() const { return path() + " (" + format_ + ")"; }

void write_wan_fp8_transformer_file(const Checkpoint& source, const WanConfig& config, const std::string& path,
                                    WanFp8FileFormat format) {
  const std::vector<WeightSpec> specs = wan_weight_specs(config);
  check_checkpoint(source, specs);
  std::map<std::string, std::string> original_of;
  for (const auto& [diffusers, original] : wan_lora_module_aliases(config)) original_of[diffusers] = original;
  const bool comfy = format == WanFp8FileFormat::kComfyUi;
  // Per tensor: its entry, and where the scale entry of an fp8 weight follows it.
  std::vector<SafetensorsEntry> entries;
  std::vector<const WeightSpec*> spec_of;  // null for a scale or the marker
  for (const WeightSpec& spec : specs) {
    const std::string key = original_key(original_of, spec.name);
    const bool fp8 = wan_fp8_weight(spec.name);
    entries.push_back({key, fp8 ? DType::kU8 : source.find(spec.name)->dtype, spec.shape, 0, 0, fp8});
    spec_of.push_back(&spec);
    if (!fp8) continue;
    const std::string module = key.substr(0, key.size() - std::char_traits<char>::length(".weight"));
    entries.push_back({module + (comfy ? kComfyScale : kLightX2VScale), DType::kF32, comfy ? Shape{} : Shape{spec.shape[0], 1}, 0, 0, false});
    spec_of.push_back(nullptr);
  }
  if (comfy) {
    entries.push_back({kComfyMarker, DType::kU8, Shape{0}, 0, 0, true});
    spec_of.push_back(nullptr);
  }
  Tensor values, bytes, scales;
  write_safetensors_streamed(path, entries, {{"format", "pt"}}, [&](size_t i) -> TensorView {
    if (spec_of[i] == nullptr) return entries[i].name == kComfyMarker ? TensorView(nullptr, DType::kU8, Device::cpu(), {0}) : scales.view();
    const WeightSpec& spec = *spec_of[i];
    const TensorView stored = source.view(spec.name);
    if (!wan_fp8_weight(spec.name)) return stored;
    // The bf16 values WanWeightPrecision::kFp8 quantises, in fp32.
    const Tensor rounded = Tensor::empty(spec.shape, DType::kBF16);
    copy_convert(stored, rounded.view());
    values = Tensor::empty(spec.shape, DType::kF32);
    copy_convert(rounded.view(), values.view());
    check_finite(values.view(), source.directory() + ": tensor \"" + spec.name + "\"");
    const int64_t rows = spec.shape[0], cols = shape_numel(spec.shape) / rows;
    bytes = Tensor::empty(spec.shape, DType::kU8);
    scales = Tensor::empty(comfy ? Shape{} : Shape{rows, 1}, DType::kF32);
    if (comfy)
      quantize_rows_e4m3(values.data_as<float>(), 1, rows * cols, bytes.data_as<uint8_t>(), scales.data_as<float>());
    else
      quantize_rows_e4m3(values.data_as<float>(), rows, cols, bytes.data_as<uint8_t>(), scales.data_as<float>());
    return bytes.view();
  });
}

}  // namespace tessel
