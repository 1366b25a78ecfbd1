#include "tessel/diffusion/clip_vision_encoder.h"

#include <algorithm>
#include <cmath>

#include "tessel/core/error.h"
#include "tessel/core/finite_check.h"
#include "tessel/core/io/bounded_read.h"
#include "tessel/core/io/limited_json.h"
#include "tessel/core/io/safetensors.h"
#include "tessel/core/parallel.h"
#include "tessel/dit/ops.h"
#include "tessel/kernels/attention.h"
#include "transformers_files.h"

#ifdef TESSEL_WITH_CUDA
#include "cuda/clip_cuda_encoder.h"
#endif

namespace tessel {
namespace {

constexpr int64_t kMaxSize = int64_t{1} << 20;
constexpr const char* kPrefix = "vision_model.";

std::string layer_prefix(int64_t layer) { return std::string(kPrefix) + "encoder.layers." + std::to_string(layer) + "."; }

Tensor to_f32(const Tensor& t) { return t.dtype() == DType::kF32 ? t.clone() : t.to(DType::kF32); }

// gelu is the DiT ops' exact GELU; quick_gelu, x sigmoid(1.702 x), is CLIP's own.
void apply_activation(const ExecContext& ctx, ClipActivation act, float* x, int64_t count) {
  if (act == ClipActivation::gelu) return dit::gelu(ctx, x, count);
  parallel_for(count, [&](int64_t i) {
    const double v = x[i];
    x[i] = static_cast<float>(v / (1.0 + std::exp(-1.702 * v)));
  });
}

}  // namespace

int64_t ClipVisionConfig::tokens() const {
  const int64_t side = image_size / patch_size;
  return 1 + side * side;
}

void ClipVisionConfig::validate() const {
  const std::pair<const char*, int64_t> sizes[] = {
      {"hidden_size", hidden_size}, {"intermediate_size", intermediate_size}, {"num_hidden_layers", num_hidden_layers},
      {"num_attention_heads", num_attention_heads}, {"num_channels", num_channels}, {"image_size", image_size},
      {"patch_size", patch_size}};
  for (const auto& [name, value] : sizes)
    if (value < 1 || value > kMaxSize) fail_argument(name, detail::concat("an integer in [1, ", kMaxSize, "]"), value);
  if (image_size % patch_size != 0)
    fail_argument("image_size", detail::concat("a multiple of patch_size ", patch_size), image_size);
  if (hidden_size % num_attention_heads != 0)
    fail_argument("hidden_size", detail::concat("a multiple of num_attention_heads ", num_attention_heads), hidden_size);
  if (!(layer_norm_eps > 0.0 && layer_norm_eps < 1.0)) fail_argument("layer_norm_eps", "a number in (0, 1)", layer_norm_eps);
}

ClipVisionConfig parse_clip_vision_config(std::string_view json_text, const std::string& source) {
  const nlohmann::json root = parse_json_limited(json_text, JsonLimits{}, source);
  if (!root.is_object()) fail_argument(source, "a JSON object", json_excerpt(root));
  // A CLIPModel's config.json nests the vision tower's fields.
  const auto nested = root.find("vision_config");
  const bool is_nested = nested != root.end();
  if (is_nested && !nested->is_object()) fail_argument(source + ": vision_config", "a JSON object", json_excerpt(*nested));
  const nlohmann::json& json = is_nested ? *nested : root;
  const std::string where = source + (is_nested ? ": vision_config." : ": ");
  ClipVisionConfig config;
  const std::pair<const char*, int64_t*> sizes[] = {
      {"hidden_size", &config.hidden_size}, {"intermediate_size", &config.intermediate_size},
      {"num_hidden_layers", &config.num_hidden_layers}, {"num_attention_heads", &config.num_attention_heads},
      {"num_channels", &config.num_channels}, {"image_size", &config.image_size}, {"patch_size", &config.patch_size}};
  for (const auto& [key, field] : sizes) {
    const auto value = json.find(key);
    if (value == json.end()) continue;
    if (!value->is_number_integer()) fail_argument(where + key, "an integer", json_excerpt(*value));
    *field = value->get<int64_t>();
  }
  if (const auto eps = json.find("layer_norm_eps"); eps != json.end()) {
    if (!eps->is_number()) fail_argument(where + "layer_norm_eps", "a number", json_excerpt(*eps));
    config.layer_norm_eps = eps->get<double>();
  }
  if (const auto act = json.find("hidden_act"); act != json.end()) {
    if (*act == "gelu")
      config.hidden_act = ClipActivation::gelu;
    else if (*act == "quick_gelu")
      config.hidden_act = ClipActivation::quick_gelu;
    else
      fail_argument(where + "hidden_act", "\"gelu\" or \"quick_gelu\"", json_excerpt(*act));
  }
  return validated_config(std::move(config), is_nested ? source + ": vision_config" : source);
}

std::vector<WeightSpec> clip_vision_weight_specs(const ClipVisionConfig& c) {
  const std::string e = std::string(kPrefix) + "embeddings.";
  const int64_t h = c.hidden_size;
  std::vector<WeightSpec> specs = {{e + "patch_embedding.weight", {h, c.num_channels, c.patch_size, c.patch_size}},
                                   {e + "class_embedding", {h}},
                                   {e + "position_embedding.weight", {c.tokens(), h}}};
  for (const char* norm : {"pre_layrnorm", "post_layernorm"})
    for (const char* part : {".weight", ".bias"}) specs.push_back({std::string(kPrefix) + norm + part, {h}});
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    const std::string p = layer_prefix(layer);
    for (const char* projection : {"q_proj", "k_proj", "v_proj", "out_proj"}) {
      specs.push_back({p + "self_attn." + projection + ".weight", {h, h}});
      specs.push_back({p + "self_attn." + projection + ".bias", {h}});
    }
    for (const char* norm : {"layer_norm1", "layer_norm2"})
      for (const char* part : {".weight", ".bias"}) specs.push_back({p + norm + part, {h}});
    specs.push_back({p + "mlp.fc1.weight", {c.intermediate_size, h}});
    specs.push_back({p + "mlp.fc1.bias", {c.intermediate_size}});
    specs.push_back({p + "mlp.fc2.weight", {h, c.intermediate_size}});
    specs.push_back({p + "mlp.fc2.bias", {h}});
  }
  return specs;
}

void ClipVisionEncoder::Linear::operator()(const ExecContext& ctx, const float* x, int64_t rows, float* y) const {
  dit::linear(ctx, x, rows, weight_t.size(0), weight_t.data_as<float>(), bias.defined() ? bias.data_as<float>() : nullptr,
              weight_t.size(1), y);
}

ClipVisionEncoder::ClipVisionEncoder(ClipVisionConfig config, const std::map<std::string, Tensor>& weights, Device device)
    : config_(std::move(config)), device_(device) {
  config_.validate();
#ifndef TESSEL_WITH_CUDA
  if (device.is_cuda()) fail_argument("ClipVisionEncoder device", "cpu (tessel was built without CUDA)", device.str());
#endif
  const std::vector<WeightSpec> specs = clip_vision_weight_specs(config_);
  for (const WeightSpec& spec : specs) {
    const auto found = weights.find(spec.name);
    if (found == weights.end()) fail_argument("CLIP vision weights", "a tensor named " + spec.name, "none");
    if (found->second.shape() != spec.shape)
      fail_argument("CLIP vision weight " + spec.name, shape_str(spec.shape), shape_str(found->second.shape()));
  }
  if (weights.size() != specs.size())
    for (const auto& entry : weights) {  // not a structured binding: clang 14 cannot capture one in a lambda
      const std::string& name = entry.first;
      if (std::none_of(specs.begin(), specs.end(), [&](const WeightSpec& spec) { return spec.name == name; }))
        fail_argument("CLIP vision weights", "only the encoder's tensors", "an extra tensor " + quoted_excerpt(name));
    }
  if (device.is_cuda()) {
#ifdef TESSEL_WITH_CUDA
    cuda_ = std::make_shared<const diffusion::cuda::ClipCudaEncoder>(config_, weights, device);
#endif
    return;
  }

  const auto tensor = [&](const std::string& name) { return to_f32(weights.at(name)); };
  // A (out, in...) weight as (in, out): a convolution's (out, c, kh, kw) becomes (c * kh * kw, out).
  const auto linear = [&](const std::string& name, bool has_bias) {
    const Tensor weight = tensor(name + ".weight");
    const int64_t out = weight.size(0), in = weight.numel() / out;
    Linear result{Tensor::empty({in, out}, DType::kF32), has_bias ? tensor(name + ".bias") : Tensor{}};
    const float* src = weight.data_as<float>();
    float* dst = result.weight_t.data_as<float>();
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i) dst[i * out + o] = src[o * in + i];
    return result;
  };
  const std::string e = std::string(kPrefix) + "embeddings.";
  patch_embedding_ = linear(e + "patch_embedding", false);
  class_embedding_ = tensor(e + "class_embedding");
  position_embedding_ = tensor(e + "position_embedding.weight");
  pre_norm_weight_ = tensor(std::string(kPrefix) + "pre_layrnorm.weight");
  pre_norm_bias_ = tensor(std::string(kPrefix) + "pre_layrnorm.bias");
  for (int64_t index = 0; index + 1 < config_.num_hidden_layers; ++index) {
    const std::string p = layer_prefix(index);
    layers_.push_back(Layer{tensor(p + "layer_norm1.weight"), tensor(p + "layer_norm1.bias"), tensor(p + "layer_norm2.weight"),
                            tensor(p + "layer_norm2.bias"), linear(p + "self_attn.q_proj", true),
                            linear(p + "self_attn.k_proj", true), linear(p + "self_attn.v_proj", true),
                            linear(p + "self_attn.out_proj", true), linear(p + "mlp.fc1", true), linear(p + "mlp.fc2", true)});
  }
}

ClipVisionEncoder ClipVisionEncoder::load(const std::string& directory, Device device) {
#ifndef TESSEL_WITH_CUDA
  if (device.is_cuda()) fail_argument("ClipVisionEncoder device", "cpu (tessel was built without CUDA)", device.str());
#endif
  const std::string config_path = directory + "/config.json";
  const ClipVisionConfig config = parse_clip_vision_config(
      read_file_bounded(config_path, diffusion::kMaxTransformersJsonBytes, "image encoder config"), config_path);
  std::map<std::string, Tensor> weights;
  for (const std::string& file : diffusion::transformers_weight_files(directory, "image encoder")) {
    const SafetensorsFile shard = SafetensorsFile::open(directory + "/" + file);
    for (const SafetensorsEntry& entry : shard.entries()) {
      // transformers 5 saves CLIPVisionModel without its former vision_model wrapper.
      const std::string name = entry.name.rfind(kPrefix, 0) == 0 ? entry.name : kPrefix + entry.name;
      if (name == std::string(kPrefix) + "embeddings.position_ids") continue;
      weights[name] = shard.load(entry.name);
      check_finite(weights[name], directory + ": tensor \"" + entry.name + "\"",
                   "the checkpoint is damaged or was saved with overflowed values");
    }
  }
  return ClipVisionEncoder(config, weights, device);
}

void ClipVisionEncoder::forward(const ExecContext& ctx, const TensorView& pixel_values, const TensorView& out) const {
  const ClipVisionConfig& c = config_;
  if (pixel_values.dtype() != DType::kF32 || !pixel_values.device().is_cpu() || !pixel_values.is_contiguous() ||
      pixel_values.dim() != 4 || pixel_values.size(0) < 1 ||
      pixel_values.shape() != Shape{pixel_values.size(0), c.num_channels, c.image_size, c.image_size})
    fail_argument("pixel_values",
                  detail::concat("a contiguous fp32 CPU tensor (B, ", c.num_channels, ", ", c.image_size, ", ", c.image_size, ")"),
                  pixel_values.describe());
  const int64_t batch = pixel_values.size(0), tokens = c.tokens(), hidden = c.hidden_size;
  if (out.dtype() != DType::kF32 || !out.device().is_cpu() || !out.is_contiguous() || out.shape() != Shape{batch, tokens, hidden})
    fail_argument("out", detail::concat("a contiguous fp32 CPU tensor (", batch, ", ", tokens, ", ", hidden, ")"), out.describe());
#ifdef TESSEL_WITH_CUDA
  if (cuda_) return cuda_->forward(ctx, pixel_values.data_as<const float>(), batch, out.data_as<float>());
#endif

  // The patches as rows of (channel, row, column) values, the order of the convolution's weight.
  const int64_t side = c.image_size / c.patch_size, patches = side * side, p = c.patch_size;
  const int64_t patch_values = c.num_channels * p * p;
  std::vector<float> patch_rows(static_cast<size_t>(batch * patches * patch_values));
  const float* pixels = pixel_values.data_as<const float>();
  parallel_for(batch * patches, [&](int64_t item) {
    const int64_t b = item / patches, py = item % patches / side, px = item % side;
    float* row = patch_rows.data() + item * patch_values;
    for (int64_t ch = 0; ch < c.num_channels; ++ch)
      for (int64_t y = 0; y < p; ++y)
        std::copy_n(pixels + ((b * c.num_channels + ch) * c.image_size + py * p + y) * c.image_size + px * p, p,
                    row + (ch * p + y) * p);
  });
  std::vector<float> embedded(static_cast<size_t>(batch * patches * hidden));
  patch_embedding_(ctx, patch_rows.data(), batch * patches, embedded.data());

  const int64_t rows = batch * tokens;
  std::vector<float> hidden_states(static_cast<size_t>(rows * hidden));
  const float* position = position_embedding_.data_as<float>();
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t < tokens; ++t) {
      const float* source = t == 0 ? class_embedding_.data_as<float>() : embedded.data() + (b * patches + t - 1) * hidden;
      float* target = hidden_states.data() + (b * tokens + t) * hidden;
      for (int64_t i = 0; i < hidden; ++i) target[i] = source[i] + position[t * hidden + i];
    }
  dit::layer_norm(ctx, hidden_states.data(), rows, hidden, c.layer_norm_eps, pre_norm_weight_.data_as<float>(),
                  pre_norm_bias_.data_as<float>(), hidden_states.data());

  const int64_t heads = c.num_attention_heads, head_dim = hidden / heads;
  std::vector<float> normed(hidden_states.size()), q(normed.size()), k(normed.size()), v(normed.size()),
      attended(normed.size()), projected(normed.size()), mlp(static_cast<size_t>(rows * c.intermediate_size));
  const auto bshd = [&](std::vector<float>& data) {
    return TensorView(data.data(), DType::kF32, Device::cpu(), {batch, tokens, heads, head_dim});
  };
  const auto add_residual = [&] {
    for (size_t i = 0; i < hidden_states.size(); ++i) hidden_states[i] += projected[i];
  };
  for (const Layer& layer : layers_) {
    dit::layer_norm(ctx, hidden_states.data(), rows, hidden, c.layer_norm_eps, layer.norm1_weight.data_as<float>(),
                    layer.norm1_bias.data_as<float>(), normed.data());
    layer.q(ctx, normed.data(), rows, q.data());
    layer.k(ctx, normed.data(), rows, k.data());
    layer.v(ctx, normed.data(), rows, v.data());
    // Scale 1/sqrt(head_dim), no mask: transformers' CLIPAttention on pixel inputs.
    attention_forward(ctx, bshd(q), bshd(k), bshd(v), bshd(attended), TensorView{});
    layer.out(ctx, attended.data(), rows, projected.data());
    add_residual();

    dit::layer_norm(ctx, hidden_states.data(), rows, hidden, c.layer_norm_eps, layer.norm2_weight.data_as<float>(),
                    layer.norm2_bias.data_as<float>(), normed.data());
    layer.fc1(ctx, normed.data(), rows, mlp.data());
    apply_activation(ctx, c.hidden_act, mlp.data(), static_cast<int64_t>(mlp.size()));
    layer.fc2(ctx, mlp.data(), rows, projected.data());
    add_residual();
  }
  std::copy(hidden_states.begin(), hidden_states.end(), out.data_as<float>());
}

}  // namespace tessel
