#include "tessel/dit/wan_lora_bank.h"

#include <tuple>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "tessel/core/error.h"
#include "tessel/core/random.h"
#include "tessel/dit/ops.h"
#include "tessel/dit/wan_weights.h"
#include "wan_lora_rows.h"

namespace tessel {
namespace {

// The modules the bank can hold: every linear layer (a weight of two or more dimensions, the patch
// embedding's Conv3d kernel being a GEMM here too, beside a bias), by name, with its weight's shape.
// Norms and modulation tables are vectors or biasless.
std::map<std::string, Shape> linear_layers(const WanConfig& config) {
  std::map<std::string, Shape> weights;
  std::set<std::string> biases;
  const auto strip = [](const std::string& name, const std::string& suffix) {
    return name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0
               ? name.substr(0, name.size() - suffix.size())
               : std::string();
  };
  for (const WeightSpec& spec : wan_weight_specs(config)) {
    if (const std::string module = strip(spec.name, ".bias"); !module.empty()) biases.insert(module);
    if (const std::string module = strip(spec.name, ".weight"); !module.empty() && spec.shape.size() >= 2) weights.emplace(module, spec.shape);
  }
  std::erase_if(weights, [&](const auto& entry) { return !biases.count(entry.first); });
  return weights;
}

// (rows, cols) fp32 -> (cols, rows) fp32.
Tensor transposed(const Tensor& matrix) {
  const int64_t rows = matrix.size(0), cols = matrix.size(1);
  Tensor out = Tensor::empty({cols, rows}, DType::kF32);
  const float* src = matrix.data_as<float>();
  float* dst = out.data_as<float>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * rows + r] = src[r * cols + c];
  return out;
}

}  // namespace

struct WanLoraBank::Impl {
  WanConfig config;
  Device device = Device::cpu();
  std::vector<std::string> names;
  std::vector<std::string> summaries;
  std::map<std::string, std::vector<Pair>> modules;  // diffusers module -> one pair per adapter
  int64_t max_rank = 0;
  size_t bytes = 0;

  // Adapter `index` (of `count`) changes `module` by scale * up (out, rank) @ down (rank, in), fp32
  // CPU: kept in the device's layout. `origin` names the pair in errors.
  void add_pair(const std::string& module, int64_t index, int64_t count, const Tensor& down, const Tensor& up, double scale,
                const std::string& origin) {
    std::vector<Pair>& pairs = modules[module];
    pairs.resize(static_cast<size_t>(count));
    Pair& pair = pairs[static_cast<size_t>(index)];
    // WanLora keeps one pair per module and file, and a bank adapter is one file.
    if (pair.rank != 0) fail_argument(origin, "one low-rank pair per module", "a second one for " + module);
    pair.rank = down.size(0);
    pair.scale = static_cast<float>(scale);
    if (device.is_cuda()) {
      pair.down = down.to(DType::kBF16).to(device);
      pair.up = up.to(DType::kBF16).to(device);
    } else {
      pair.down = transposed(down);
      pair.up = transposed(up);
    }
    bytes += pair.down.nbytes() + pair.up.nbytes();
    max_rank = std::max(max_rank, pair.rank);
  }
};

WanLoraBank::WanLoraBank() : impl_(std::make_unique<Impl>()) {}
WanLoraBank::~WanLoraBank() = default;
WanLoraBank::WanLoraBank(WanLoraBank&&) noexcept = default;
WanLoraBank& WanLoraBank::operator=(WanLoraBank&&) noexcept = default;

WanLoraBank WanLoraBank::load(const std::vector<std::pair<std::string, LoraFile>>& adapters, const WanConfig& config, Device device,
                              bool ignore_unmatched) {
  const std::map<std::string, Shape> linear_weights = linear_layers(config);
  WanLoraBank bank;
  Impl& b = *bank.impl_;
  b.config = config;
  b.device = device;
  const int64_t count = static_cast<int64_t>(adapters.size());
  for (int64_t index = 0; index < count; ++index) {
    const auto& [name, file] = adapters[static_cast<size_t>(index)];
    if (name.empty()) fail_argument("LoRA adapter name", "a name requests can use", "empty (for " + file.path + ")");
    if (std::find(b.names.begin(), b.names.end(), name) != b.names.end())
      fail_argument("LoRA adapter name", "each name once", "\"" + name + "\" twice");
    b.names.push_back(name);
    const WanLora lora = WanLora::load({file}, config, ignore_unmatched);
    for (WanLoraFactors& factors : lora.factors()) {
      if (!linear_weights.count(factors.module))
        fail_argument(factors.origin, "a low-rank pair on a linear layer (a norm or modulation table only merges: --lora)",
                      "a pair on " + factors.module);
      if (factors.up_bias.defined())
        fail_argument(factors.origin, "a low-rank pair without lora_B bias (a bias only merges: --lora)", "a lora_B bias");
      b.add_pair(factors.module, index, count, factors.down, factors.up, factors.scale, factors.origin);
    }
    b.summaries.push_back("\"" + name + "\": " + (lora.summary().empty() ? file.path : lora.summary().front()));
  }
  return bank;
}

WanLoraBank WanLoraBank::random(const WanConfig& config, Device device, int64_t adapters, int64_t rank, uint64_t seed) {
  if (adapters < 1) fail_argument("random LoRA adapters", "at least 1", adapters);
  if (rank < 1) fail_argument("random LoRA rank", "at least 1", rank);
  WanLoraBank bank;
  Impl& b = *bank.impl_;
  b.config = config;
  b.device = device;
  for (int64_t index = 0; index < adapters; ++index) {
    b.names.push_back(std::to_string(index));
    b.summaries.push_back(detail::concat("\"", index, "\": random, rank ", rank, " on every linear layer"));
    for (const auto& [module, shape] : linear_layers(config)) {
      const int64_t out = shape[0], in = shape_numel(shape) / out;
      Tensor down = Tensor::empty({rank, in}, DType::kF32), up = Tensor::empty({out, rank}, DType::kF32);
      fill_uniform(down.view(), ++seed, -1.0 / std::sqrt(static_cast<double>(in)), 1.0 / std::sqrt(static_cast<double>(in)));
      fill_uniform(up.view(), ++seed, -1.0 / std::sqrt(static_cast<double>(rank)), 1.0 / std::sqrt(static_cast<double>(rank)));
      b.add_pair(module, index, adapters, down, up, 1.0, "random adapter " + b.names.back() + ", " + module);
    }
  }
  return bank;
}

int64_t WanLoraBank::size() const { return static_cast<int64_t>(impl_->names.size()); }
const std::string& WanLoraBank::name(int64_t adapter) const { return impl_->names.at(static_cast<size_t>(adapter)); }
Device WanLoraBank::device() const { return impl_->device; }
const WanConfig& WanLoraBank::config() const { return impl_->config; }
int64_t WanLoraBank::max_rank() const { return impl_->max_rank; }
size_t WanLoraBank::bytes() const { return impl_->bytes; }
std::vector<std::string> WanLoraBank::summary() const { return impl_->summaries; }

int32_t WanLoraBank::index(const std::string& name, const std::string& what) const {
  const auto found = std::find(impl_->names.begin(), impl_->names.end(), name);
  if (found != impl_->names.end()) return static_cast<int32_t>(found - impl_->names.begin());
  std::string known;
  for (const std::string& each : impl_->names) known += (known.empty() ? "\"" : ", \"") + each + "\"";
  fail_argument(what, known.empty() ? std::string("no adapter (none was loaded)") : "one of the loaded adapters " + known,
                "\"" + name + "\"");
}

const std::vector<WanLoraBank::Pair>* WanLoraBank::pairs(const std::string& module) const {
  const auto found = impl_->modules.find(module);
  return found == impl_->modules.end() ? nullptr : &found->second;
}

int64_t wan_lora_elements(const WanConfig& config, int64_t rank) {
  int64_t elements = 0;
  for (const auto& [module, shape] : linear_layers(config)) elements += rank * (shape[0] + shape_numel(shape) / shape[0]);
  return elements;
}

bool WanLoraSelection::any() const {
  return bank != nullptr && std::any_of(adapters.begin(), adapters.end(), [](int32_t adapter) { return adapter >= 0; });
}

namespace {

// What shapes a Wan transformer's weights: two configs that agree here have the same tensors.
auto weight_shapes(const WanConfig& c) {
  return std::tie(c.patch_size, c.num_attention_heads, c.attention_head_dim, c.in_channels, c.out_channels, c.text_dim, c.freq_dim,
                  c.ffn_dim, c.num_layers, c.cross_attn_norm, c.image_dim, c.added_kv_proj_dim, c.pos_embed_seq_len);
}

}  // namespace

std::vector<LoraRun> lora_runs(const WanLoraSelection& selection, const WanConfig& config, Device device, int64_t batch) {
  if (selection.bank == nullptr) fail_argument("WanLoraSelection::bank", "the adapters' bank", "null");
  const WanLoraBank& bank = *selection.bank;
  if (bank.device() != device) fail_argument("WanLoraSelection::bank device", device.str() + " (the model's)", bank.device().str());
  if (weight_shapes(bank.config()) != weight_shapes(config))
    fail_argument("WanLoraSelection::bank", "adapters loaded for this model's config", "a bank loaded for another Wan config");
  if (static_cast<int64_t>(selection.adapters.size()) != batch)
    fail_argument("WanLoraSelection::adapters", detail::concat("one entry per batch entry (", batch, ")"), selection.adapters.size());
  std::vector<LoraRun> runs;
  for (int64_t entry = 0; entry < batch; ++entry) {
    const int32_t adapter = selection.adapters[static_cast<size_t>(entry)];
    if (adapter < -1 || adapter >= bank.size())
      fail_argument(detail::concat("WanLoraSelection::adapters[", entry, "]"),
                    detail::concat("-1 (none) or an adapter index in [0, ", bank.size(), ")"), adapter);
    if (adapter < 0) continue;
    if (!runs.empty() && runs.back().adapter == adapter && runs.back().first_entry + runs.back().entries == entry)
      ++runs.back().entries;
    else
      runs.push_back(LoraRun{entry, 1, adapter});
  }
  return runs;
}

void add_lora_cpu(const ExecContext& ctx, const WanLoraBank& bank, const std::vector<LoraRun>& runs, int64_t batch,
                  const std::string& module, const float* x, int64_t rows, float* y) {
  const std::vector<WanLoraBank::Pair>* pairs = bank.pairs(module);
  if (pairs == nullptr || runs.empty()) return;
  const int64_t rows_per_entry = rows / batch;
  std::vector<float> shrunk, expanded;
  for (const LoraRun& run : runs) {
    const WanLoraBank::Pair& pair = (*pairs)[static_cast<size_t>(run.adapter)];
    if (pair.rank == 0) continue;
    const int64_t in = pair.down.size(0), out = pair.up.size(1), first = run.first_entry * rows_per_entry;
    const int64_t count = run.entries * rows_per_entry;
    shrunk.resize(static_cast<size_t>(count * pair.rank));
    expanded.resize(static_cast<size_t>(count * out));
    dit::linear(ctx, x + first * in, count, in, pair.down.data_as<float>(), nullptr, pair.rank, shrunk.data());
    dit::linear(ctx, shrunk.data(), count, pair.rank, pair.up.data_as<float>(), nullptr, out, expanded.data());
    float* target = y + first * out;
    for (int64_t i = 0; i < count * out; ++i) target[i] += pair.scale * expanded[static_cast<size_t>(i)];
  }
}

}  // namespace tessel
