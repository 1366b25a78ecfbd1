#include "tessel/diffusion/umt5_encoder.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "tessel/core/error.h"
#include "tessel/core/io/bounded_read.h"
#include "tessel/core/io/limited_json.h"
#include "tessel/core/finite_check.h"
#include "tessel/core/io/safetensors.h"
#include "tessel/core/parallel.h"
#include "transformers_files.h"

#ifdef TESSEL_WITH_CUDA
#include "cuda/umt5_cuda_encoder.h"
#endif

namespace tessel {
namespace {

constexpr int64_t kMaxSize = int64_t{1} << 20;

std::string block_prefix(int64_t layer) { return "encoder.block." + std::to_string(layer) + ".layer."; }

// out (rows, n) = in (rows, k) * W^T with W (n, k) as torch's Linear stores it.
void linear(const float* in, const float* weight, float* out, int64_t rows, int64_t k, int64_t n) {
  parallel_for(rows, [&](int64_t row) {
    const float* x = in + row * k;
    for (int64_t j = 0; j < n; ++j) {
      const float* w = weight + j * k;
      float sum = 0.0f;
      for (int64_t i = 0; i < k; ++i) sum += x[i] * w[i];
      out[row * n + j] = sum;
    }
  });
}

// T5's RMSNorm: x * rsqrt(mean(x^2) + eps) * weight.
void rms_norm(const float* in, const float* weight, float* out, int64_t rows, int64_t width, double eps) {
  for (int64_t row = 0; row < rows; ++row) {
    const float* x = in + row * width;
    double sum = 0.0;
    for (int64_t i = 0; i < width; ++i) sum += static_cast<double>(x[i]) * x[i];
    const float scale = static_cast<float>(1.0 / std::sqrt(sum / static_cast<double>(width) + eps));
    for (int64_t i = 0; i < width; ++i) out[row * width + i] = weight[i] * (x[i] * scale);
  }
}

float gelu_tanh(float x) {
  const double v = x;
  return static_cast<float>(0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v))));
}

}  // namespace

int64_t umt5_relative_position_bucket(int64_t relative_position, int64_t num_buckets, int64_t max_distance) {
  const int64_t half = num_buckets / 2;
  int64_t bucket = relative_position > 0 ? half : 0;
  const int64_t distance = std::abs(relative_position);
  const int64_t max_exact = half / 2;
  if (distance < max_exact) return bucket + distance;
  const float log_ratio = std::log(static_cast<float>(distance) / static_cast<float>(max_exact)) /
                          static_cast<float>(std::log(static_cast<double>(max_distance) / static_cast<double>(max_exact))) *
                          static_cast<float>(half - max_exact);
  return bucket + std::min(max_exact + static_cast<int64_t>(log_ratio), half - 1);
}

#ifndef TESSEL_WITH_CUDA
namespace {

[[noreturn]] void fail_without_cuda(Device device) {
  fail_argument("UMT5Encoder device", "cpu (tessel was built without CUDA)", device.str());
}

}  // namespace
#endif

void UMT5Config::validate() const {
  const std::pair<const char*, int64_t> sizes[] = {
      {"vocab_size", vocab_size}, {"d_model", d_model}, {"d_kv", d_kv}, {"d_ff", d_ff}, {"num_layers", num_layers},
      {"num_heads", num_heads}, {"relative_attention_num_buckets", relative_attention_num_buckets},
      {"relative_attention_max_distance", relative_attention_max_distance}};
  for (const auto& [name, value] : sizes)
    if (value < 1 || value > kMaxSize) fail_argument(name, detail::concat("an integer in [1, ", kMaxSize, "]"), value);
  if (relative_attention_num_buckets < 4)
    fail_argument("relative_attention_num_buckets", "at least 4 (two directions, exact and logarithmic)",
                  relative_attention_num_buckets);
  if (relative_attention_max_distance <= relative_attention_num_buckets / 4)
    fail_argument("relative_attention_max_distance", "more than relative_attention_num_buckets / 4",
                  relative_attention_max_distance);
  if (!(layer_norm_epsilon > 0.0 && layer_norm_epsilon < 1.0))
    fail_argument("layer_norm_epsilon", "a number in (0, 1)", layer_norm_epsilon);
}

UMT5Config parse_umt5_config(std::string_view json_text, const std::string& source) {
  const nlohmann::json json = parse_json_limited(json_text, JsonLimits{}, source);
  if (!json.is_object()) fail_argument(source, "a JSON object", json_excerpt(json));
  UMT5Config config;
  const std::pair<const char*, int64_t*> sizes[] = {
      {"vocab_size", &config.vocab_size}, {"d_model", &config.d_model}, {"d_kv", &config.d_kv}, {"d_ff", &config.d_ff},
      {"num_layers", &config.num_layers}, {"num_heads", &config.num_heads},
      {"relative_attention_num_buckets", &config.relative_attention_num_buckets},
      {"relative_attention_max_distance", &config.relative_attention_max_distance}};
  for (const auto& [key, field] : sizes) {
    const auto value = json.find(key);
    if (value == json.end()) continue;
    if (!value->is_number_integer()) fail_argument(source + ": " + key, "an integer", json_excerpt(*value));
    *field = value->get<int64_t>();
  }
  if (const auto eps = json.find("layer_norm_epsilon"); eps != json.end()) {
    if (!eps->is_number()) fail_argument(source + ": layer_norm_epsilon", "a number", json_excerpt(*eps));
    config.layer_norm_epsilon = eps->get<double>();
  }
  if (const auto ffn = json.find("feed_forward_proj"); ffn != json.end() && *ffn != "gated-gelu")
    fail_argument(source + ": feed_forward_proj", "\"gated-gelu\" (UMT5 as Wan uses it)", json_excerpt(*ffn));
  return validated_config(std::move(config), source);
}

std::vector<WeightSpec> umt5_weight_specs(const UMT5Config& c) {
  const int64_t inner = c.num_heads * c.d_kv;
  std::vector<WeightSpec> specs = {{"shared.weight", {c.vocab_size, c.d_model}},
                                   {"encoder.final_layer_norm.weight", {c.d_model}}};
  for (int64_t layer = 0; layer < c.num_layers; ++layer) {
    const std::string p = block_prefix(layer);
    for (const char* projection : {"q", "k", "v"})
      specs.push_back({p + "0.SelfAttention." + projection + ".weight", {inner, c.d_model}});
    specs.push_back({p + "0.SelfAttention.o.weight", {c.d_model, inner}});
    specs.push_back({p + "0.SelfAttention.relative_attention_bias.weight", {c.relative_attention_num_buckets, c.num_heads}});
    specs.push_back({p + "0.layer_norm.weight", {c.d_model}});
    specs.push_back({p + "1.DenseReluDense.wi_0.weight", {c.d_ff, c.d_model}});
    specs.push_back({p + "1.DenseReluDense.wi_1.weight", {c.d_ff, c.d_model}});
    specs.push_back({p + "1.DenseReluDense.wo.weight", {c.d_model, c.d_ff}});
    specs.push_back({p + "1.layer_norm.weight", {c.d_model}});
  }
  return specs;
}

UMT5Encoder::UMT5Encoder(UMT5Config config, const std::map<std::string, Tensor>& weights, Device device)
    : config_(std::move(config)), device_(device) {
  config_.validate();
  const std::vector<WeightSpec> specs = umt5_weight_specs(config_);
  for (const WeightSpec& spec : specs) {
    const auto found = weights.find(spec.name);
    if (found == weights.end()) fail_argument("UMT5 weights", "a tensor named " + spec.name, "none");
    if (found->second.shape() != spec.shape)
      fail_argument("UMT5 weight " + spec.name, shape_str(spec.shape), shape_str(found->second.shape()));
    if (device.is_cpu())
      weights_[spec.name] = found->second.dtype() == DType::kF32 ? found->second.clone() : found->second.to(DType::kF32);
  }
  if (device.is_cuda()) {
#ifdef TESSEL_WITH_CUDA
    cuda_ = std::make_shared<const diffusion::cuda::UMT5CudaEncoder>(config_, device,
                                                                     [&](const WeightSpec& spec) { return weights.at(spec.name); });
#else
    fail_without_cuda(device);
#endif
  }
  if (weights.size() != specs.size())
    for (const auto& [name, tensor] : weights)
      if (!weights_.count(name)) fail_argument("UMT5 weights", "only the encoder's tensors", "an extra tensor " + quoted_excerpt(name));
}

UMT5Config load_umt5_config(const std::string& directory) {
  const std::string config_path = directory + "/config.json";
  return parse_umt5_config(read_file_bounded(config_path, diffusion::kMaxTransformersJsonBytes, "text encoder config"), config_path);
}

double umt5_encoder_flop(const UMT5Config& config, double batch, double tokens) {
  const double model = static_cast<double>(config.d_model), inner = static_cast<double>(config.num_heads * config.d_kv);
  const double layer_parameters = 4.0 * model * inner + 3.0 * model * static_cast<double>(config.d_ff);
  return batch * static_cast<double>(config.num_layers) * (2.0 * layer_parameters * tokens + 4.0 * tokens * tokens * inner);
}

UMT5Encoder UMT5Encoder::load(const std::string& directory, Device device) {
#ifndef TESSEL_WITH_CUDA
  if (device.is_cuda()) fail_without_cuda(device);
#endif
  const UMT5Config config = load_umt5_config(directory);
  const std::vector<std::string> files = diffusion::transformers_weight_files(directory, "text encoder");
  // Where each expected tensor is stored: (shard, stored name).
  std::vector<SafetensorsFile> shards;
  std::map<std::string, std::pair<size_t, std::string>> stored;
  std::map<std::string, Shape> expected;
  for (const WeightSpec& spec : umt5_weight_specs(config)) expected[spec.name] = spec.shape;
  for (const std::string& file : files) {
    shards.push_back(SafetensorsFile::open(directory + "/" + file));
    for (const SafetensorsEntry& entry : shards.back().entries()) {
      std::string name = entry.name;
      if (name == "encoder.embed_tokens.weight") {
        if (stored.count("shared.weight")) continue;
        name = "shared.weight";
      }
      if (!expected.count(name)) continue;  // decoder or lm_head tensors of a full T5 checkpoint
      stored[name] = {shards.size() - 1, entry.name};
    }
  }
  if (device.is_cuda()) {
    UMT5Encoder encoder(config, device, WeightsLater{});
#ifdef TESSEL_WITH_CUDA
    encoder.cuda_ = std::make_shared<const diffusion::cuda::UMT5CudaEncoder>(config, device, [&](const WeightSpec& spec) {
      const auto found = stored.find(spec.name);
      if (found == stored.end()) fail_argument("UMT5 weights", "a tensor named " + spec.name, "none");
      Tensor weight = shards[found->second.first].load(found->second.second);
      check_finite(weight, directory + ": tensor \"" + spec.name + "\"", "the checkpoint is damaged or was saved with overflowed values");
      return weight;
    });
#endif
    return encoder;
  }
  std::map<std::string, Tensor> weights;
  for (const auto& [name, where] : stored) {
    weights[name] = shards[where.first].load(where.second);
    check_finite(weights[name], directory + ": tensor \"" + name + "\"", "the checkpoint is damaged or was saved with overflowed values");
  }
  return UMT5Encoder(config, weights);
}

UMT5Encoder::UMT5Encoder(UMT5Config config, Device device, WeightsLater) : config_(std::move(config)), device_(device) {
  config_.validate();
}

const float* UMT5Encoder::weight(const std::string& name) const { return weights_.at(name).data_as<const float>(); }

void UMT5Encoder::forward(const ExecContext& ctx, const TensorView& input_ids, const TensorView& attention_mask,
                          const TensorView& out) const {
  const UMT5Config& c = config_;
  for (const auto& [name, view] : {std::pair{"input_ids", &input_ids}, std::pair{"attention_mask", &attention_mask}})
    if (view->dtype() != DType::kI32 || !view->device().is_cpu() || !view->is_contiguous() || view->dim() != 2)
      fail_argument(name, "a contiguous (B, L) int32 CPU tensor", view->describe());
  if (attention_mask.shape() != input_ids.shape())
    fail_argument("attention_mask", "the shape of input_ids " + shape_str(input_ids.shape()), attention_mask.describe());
  const int64_t batch = input_ids.size(0), length = input_ids.size(1);
  if (out.dtype() != DType::kF32 || !out.device().is_cpu() || !out.is_contiguous() ||
      out.shape() != Shape{batch, length, c.d_model})
    fail_argument("out", detail::concat("a contiguous fp32 CPU tensor (", batch, ", ", length, ", ", c.d_model, ")"),
                  out.describe());
  const int32_t* ids = input_ids.data_as<const int32_t>();
  const int32_t* mask = attention_mask.data_as<const int32_t>();
  for (int64_t i = 0; i < batch * length; ++i)
    if (ids[i] < 0 || ids[i] >= c.vocab_size)
      fail_argument("input_ids", detail::concat("token ids in [0, ", c.vocab_size, ")"), ids[i]);

  if (cuda_) {
#ifdef TESSEL_WITH_CUDA
    cuda_->forward(ctx, ids, mask, batch, length, out.data_as<float>());
#endif
    return;
  }
  const int64_t rows = batch * length, inner = c.num_heads * c.d_kv;
  std::vector<float> hidden(static_cast<size_t>(rows * c.d_model));
  for (int64_t r = 0; r < rows; ++r)
    std::copy_n(weight("shared.weight") + ids[r] * c.d_model, c.d_model, hidden.data() + r * c.d_model);
  std::vector<float> normed(hidden.size()), q(static_cast<size_t>(rows * inner)), k(q.size()), v(q.size()),
      attended(q.size()), projected(hidden.size()), gate(static_cast<size_t>(rows * c.d_ff)), up(gate.size());
  // The bucket of each relative position (key - query), shared by every block.
  std::vector<int64_t> bucket(static_cast<size_t>(2 * length - 1));
  for (int64_t d = -(length - 1); d < length; ++d)
    bucket[static_cast<size_t>(d + length - 1)] =
        umt5_relative_position_bucket(d, c.relative_attention_num_buckets, c.relative_attention_max_distance);
  const float masked = std::numeric_limits<float>::lowest();

  for (int64_t layer = 0; layer < c.num_layers; ++layer) {
    const std::string p = block_prefix(layer);
    rms_norm(hidden.data(), weight(p + "0.layer_norm.weight"), normed.data(), rows, c.d_model, c.layer_norm_epsilon);
    linear(normed.data(), weight(p + "0.SelfAttention.q.weight"), q.data(), rows, c.d_model, inner);
    linear(normed.data(), weight(p + "0.SelfAttention.k.weight"), k.data(), rows, c.d_model, inner);
    linear(normed.data(), weight(p + "0.SelfAttention.v.weight"), v.data(), rows, c.d_model, inner);
    const float* bias = weight(p + "0.SelfAttention.relative_attention_bias.weight");  // (buckets, heads)
    parallel_for(batch * c.num_heads * length, [&](int64_t item) {
      const int64_t b = item / (c.num_heads * length), h = item / length % c.num_heads, i = item % length;
      std::vector<float> scores(static_cast<size_t>(length));
      const float* qi = q.data() + (b * length + i) * inner + h * c.d_kv;
      float max_score = masked;
      for (int64_t j = 0; j < length; ++j) {
        const float* kj = k.data() + (b * length + j) * inner + h * c.d_kv;
        float dot = 0.0f;
        for (int64_t d = 0; d < c.d_kv; ++d) dot += qi[d] * kj[d];
        float score = dot + bias[bucket[static_cast<size_t>(j - i + length - 1)] * c.num_heads + h];
        // transformers adds the dtype's lowest value at padding: the key gets no weight.
        if (mask[b * length + j] == 0) score = score + masked;
        scores[static_cast<size_t>(j)] = score;
        max_score = std::max(max_score, score);
      }
      double total = 0.0;
      for (float& s : scores) total += (s = std::exp(s - max_score));
      float* o = attended.data() + (b * length + i) * inner + h * c.d_kv;
      std::fill_n(o, c.d_kv, 0.0f);
      for (int64_t j = 0; j < length; ++j) {
        const float w = static_cast<float>(scores[static_cast<size_t>(j)] / total);
        const float* vj = v.data() + (b * length + j) * inner + h * c.d_kv;
        for (int64_t d = 0; d < c.d_kv; ++d) o[d] += w * vj[d];
      }
    });
    linear(attended.data(), weight(p + "0.SelfAttention.o.weight"), projected.data(), rows, inner, c.d_model);
    for (size_t i = 0; i < hidden.size(); ++i) hidden[i] += projected[i];

    rms_norm(hidden.data(), weight(p + "1.layer_norm.weight"), normed.data(), rows, c.d_model, c.layer_norm_epsilon);
    linear(normed.data(), weight(p + "1.DenseReluDense.wi_0.weight"), gate.data(), rows, c.d_model, c.d_ff);
    linear(normed.data(), weight(p + "1.DenseReluDense.wi_1.weight"), up.data(), rows, c.d_model, c.d_ff);
    for (size_t i = 0; i < gate.size(); ++i) gate[i] = gelu_tanh(gate[i]) * up[i];
    linear(gate.data(), weight(p + "1.DenseReluDense.wo.weight"), projected.data(), rows, c.d_ff, c.d_model);
    for (size_t i = 0; i < hidden.size(); ++i) hidden[i] += projected[i];
  }
  rms_norm(hidden.data(), weight("encoder.final_layer_norm.weight"), out.data_as<float>(), rows, c.d_model,
           c.layer_norm_epsilon);
}

}  // namespace tessel
