// The Wan transformer forward over the dit ops (see wan_model.h for the data flow).
#include "tessel/dit/wan_model.h"
#include "tessel/dit/wan_lora.h"
#include "tessel/dit/wan_lora_bank.h"
#include "tessel/dit/wan_transformer_file.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <set>

#include "tessel/dit/ops.h"
#include "tessel/core/error.h"
#include "tessel/core/finite_check.h"
#include "tessel/core/random.h"
#include "tessel/dit/checkpoint.h"
#include "tessel/dit/wan_weights.h"
#include "tessel/kernels/attention.h"
#include "tessel/kernels/attention_tuning.h"
#include "wan_lora_rows.h"
#include "wan_rope.h"
#ifdef TESSEL_WITH_CUDA
#include "cuda/wan_cuda_model.h"
#endif
#include "wan_sequence_parallel.h"

namespace tessel {
namespace {

// A forward's per-request adapters (WanLoraSelection) as its linear layers apply them.
struct LoraRows {
  const WanLoraBank* bank = nullptr;
  std::vector<LoraRun> runs;  // empty: no entry uses an adapter
  int64_t batch = 1;          // the rows of every linear are batch-major over these entries
};

// A Linear layer converted for dit::linear: the weight transposed to (in, out), fp32.
struct Linear {
  Tensor weight_t;
  Tensor bias;
  int64_t in = 0, out = 0;
  std::string module;  // the diffusers module name, which adapters key their pairs by
  // y = x W^T + b, then each adapter's y += s B (A x) over the rows of the entries that use it.
  void operator()(const ExecContext& ctx, const float* x, int64_t rows, float* y, const LoraRows& lora) const {
    dit::linear(ctx, x, rows, in, weight_t.data_as<float>(), bias.data_as<float>(), out, y);
    if (!lora.runs.empty()) add_lora_cpu(ctx, *lora.bank, lora.runs, lora.batch, module, x, rows, y);
  }
};

Tensor to_f32(const Tensor& t) { return t.dtype() == DType::kF32 ? t.clone() : t.to(DType::kF32); }

// A (out, in...) weight as (in, out) fp32, whatever its trailing dimensions (the Conv3d kernel
// (dim, C, pt, ph, pw) becomes (C * pt * ph * pw, dim): its patch vector order is (c, t, h, w)).
Linear make_linear(const std::map<std::string, Tensor>& weights, const std::string& name) {
  const Tensor weight = to_f32(weights.at(name + ".weight"));
  Linear linear;
  linear.out = weight.size(0);
  linear.in = weight.numel() / linear.out;
  linear.weight_t = Tensor::empty({linear.in, linear.out}, DType::kF32);
  const float* src = weight.data_as<float>();
  float* dst = linear.weight_t.data_as<float>();
  for (int64_t o = 0; o < linear.out; ++o)
    for (int64_t i = 0; i < linear.in; ++i) dst[i * linear.out + o] = src[o * linear.in + i];
  linear.bias = to_f32(weights.at(name + ".bias"));
  linear.module = name;
  return linear;
}

// Adds the seconds since `start` to `slot` and restarts the clock.
class Stopwatch {
 public:
  explicit Stopwatch(WanForwardProfile* profile) : profile_(profile), start_(Clock::now()) {}
  void charge(double WanForwardProfile::*slot) {
    if (!profile_) return;
    const auto now = Clock::now();
    profile_->*slot += std::chrono::duration<double>(now - start_).count();
    start_ = now;
  }

 private:
  using Clock = std::chrono::steady_clock;
  WanForwardProfile* profile_;
  Clock::time_point start_;
};

struct AttentionWeights {
  Linear q, k, v, out;
  Tensor norm_q, norm_k;

  // q = RMSNorm(to_q(x)) over `rows`; k = RMSNorm(to_k(kv_source)), v = to_v(kv_source) over
  // `kv_rows` (kv_source is x itself for self-attention, the text for cross-attention).
  void project(const ExecContext& ctx, double eps, const float* x, int64_t rows, const float* kv_source, int64_t kv_rows,
               float* q_out, float* k_out, float* v_out, Stopwatch& clock, const LoraRows& lora) const {
    q(ctx, x, rows, q_out, lora);
    k(ctx, kv_source, kv_rows, k_out, lora);
    v(ctx, kv_source, kv_rows, v_out, lora);
    clock.charge(&WanForwardProfile::gemm_s);
    dit::rms_norm(ctx, q_out, rows, q.out, eps, norm_q.data_as<float>());
    dit::rms_norm(ctx, k_out, kv_rows, k.out, eps, norm_k.data_as<float>());
  }
};

// The image branch of a block's cross-attention (Wan 2.1 I2V): keys and values of the embedded
// image tokens, the keys RMS-normalised as the text's.
struct ImageKeyValueWeights {
  Linear k, v;
  Tensor norm_k;
};

struct BlockWeights {
  AttentionWeights self_attention, cross_attention;
  ImageKeyValueWeights image;  // unset without an image branch
  Tensor norm2_weight, norm2_bias;  // undefined without cross_attn_norm
  Linear ffn_in, ffn_out;
  Tensor modulation;  // (6, dim): shift, scale, gate of the self-attention, then of the FFN
};

AttentionWeights make_attention(const std::map<std::string, Tensor>& weights, int64_t layer, const std::string& which) {
  const auto name = [&](const std::string& part) { return wan_block_tensor(layer, which + "." + part); };
  return {make_linear(weights, name("to_q")), make_linear(weights, name("to_k")),   make_linear(weights, name("to_v")),
          make_linear(weights, name("to_out.0")), to_f32(weights.at(name("norm_q.weight"))),
          to_f32(weights.at(name("norm_k.weight")))};
}

// Checks `weights` against the specs of `config`: every tensor present with its shape, nothing else.
void check_weights(const WanConfig& config, const std::map<std::string, Tensor>& weights) {
  std::set<std::string> expected;
  for (const WeightSpec& spec : wan_weight_specs(config)) {
    expected.insert(spec.name);
    const auto it = weights.find(spec.name);
    if (it == weights.end()) throw Error("Wan weights: missing tensor " + quoted_excerpt(spec.name, 120));
    if (it->second.shape() != spec.shape)
      throw Error(detail::concat("Wan weights: tensor ", quoted_excerpt(spec.name, 120), " has shape ",
                                 shape_str(it->second.shape()), ", the model expects ", shape_str(spec.shape)));
    if (!is_floating(it->second.dtype()) || it->second.device() != Device::cpu())
      throw Error(detail::concat("Wan weights: tensor ", quoted_excerpt(spec.name, 120), " is ", it->second.view().describe(),
                                 ", expected a floating CPU tensor"));
  }
  for (const auto& [name, tensor] : weights)
    if (!expected.count(name)) throw Error("Wan weights: unexpected tensor " + quoted_excerpt(name, 120));
}

// WanAttentionOptions::precision against the model and device, before any weight loads.
void check_attention_precision(const WanConfig& config, const WanAttentionOptions& attention, Device device) {
  if (attention.precision != AttentionPrecision::kFp8) return;
  const char* field = "WanAttentionOptions::precision fp8 (--attention-dtype fp8)";
  if (!device.is_cuda()) fail_argument(field, "a CUDA device (the CPU model attends in fp32)", device.str());
  if (config.attention_head_dim != 128)
    fail_argument(field, "a model of head dim 128 (the FP8 attention's)", detail::concat("head dim ", config.attention_head_dim));
  if (attention_kernel_variants(device, config.attention_head_dim, AttentionPrecision::kFp8).empty())
    fail_argument(field, "a GPU of compute capability 9.0 and a build with sm_90a code (the FP8 attention kernel's)",
                  device.str() + ", which has neither or not both");
  if (attention.registry != nullptr)
    fail_argument(field, "dense self-attention (FP8 with a sparse configuration is not supported yet)", "a sparse configuration");
  if (attention.parallel != nullptr && attention.parallel->config.sequence_parallel_size() > 1)
    fail_argument(field, "one process per sequence (FP8 under sequence parallelism is not supported yet)",
                  detail::concat("sequence-parallel degree ", attention.parallel->config.sequence_parallel_size()));
}

#ifndef TESSEL_WITH_CUDA
[[noreturn]] void fail_without_cuda(Device device) {
  fail_argument("WanTransformer device", "cpu (tessel was built without CUDA)", device.str());
}

#endif

}  // namespace

void WanForwardProfile::add_self_attention(const AttentionStepReport& report) {
  ++self_attention_calls;
  dense_self_attention_calls += report.dense ? 1 : 0;
  self_attention_density_sum += report.density;
  const double estimation = report.estimate_ms / 1000.0;
  estimation_s += estimation;
  attention_s -= estimation;
}

struct WanTransformer::Impl {
  WanConfig config;
  Device device = Device::cpu();
#ifdef TESSEL_WITH_CUDA
  std::shared_ptr<const dit::cuda::WanCudaModel> cuda;  // the weights and forward of a CUDA model
#endif
  // The CPU model's fp32 weights (unset on CUDA).
  Linear patch_embedding, time_linear_1, time_linear_2, time_projection, text_linear_1, text_linear_2, proj_out;
  Tensor out_modulation;  // (2, dim): shift, scale
  // The image embedder (with an image branch): LayerNorm, linear, GELU, linear, LayerNorm, and
  // FLF2V's position table (undefined without one).
  Tensor image_norm1_weight, image_norm1_bias, image_norm2_weight, image_norm2_bias, image_position;
  Linear image_linear_1, image_linear_2;
  std::vector<BlockWeights> blocks;
  // Empty: dense attention. Shared pointers keep Impl copyable: with_attention() copies the
  // weights' handles (never their data) and makes modules of its own.
  std::vector<std::shared_ptr<SparseAttention>> self_attention;
  const ParallelGroups* parallel = nullptr;
  AttentionPrecision self_attention_precision = AttentionPrecision::kInput;  // WanAttentionOptions::precision
  // The sharding, attention strategy and buffers of the last forward's sizes under `parallel`,
  // kept across forwards (a CUDA one allocates device buffers). Forwards under sequence
  // parallelism are collective, so their caller runs them one at a time.
  mutable std::shared_ptr<WanSequenceParallel> sequence_parallel;
  mutable PhaseTimeline* timeline = nullptr;  // set_phase_timeline's

  WanSequenceParallel* sequence_parallel_for(int64_t batch, int64_t seq) const;
#ifdef TESSEL_WITH_CUDA
  struct WanForwardShapeAndShards {
    dit::cuda::WanForwardShape shape;
    WanSequenceParallel* sequence_parallel;
  };
  // The CUDA forward's sizes, this rank's shard among them under sequence parallelism.
  WanForwardShapeAndShards cuda_shape(int64_t batch, int64_t frames, int64_t height, int64_t width, int64_t text_len,
                                      int64_t image_len, int64_t timesteps_per_entry) const {
    dit::cuda::WanForwardShape shape{batch, frames, height, width, text_len, image_len, timesteps_per_entry};
    shape.self_attention_precision = self_attention_precision;
    const int64_t seq = frames / config.patch_size[0] * (height / config.patch_size[1]) * (width / config.patch_size[2]);
    WanSequenceParallel* const sp = sequence_parallel_for(batch, seq);
    if (sp) {
      shape.shard_tokens = sp->shard_length();
      shape.shards = sp->shards();
    }
    return {shape, sp};
  }
#endif
  void load_cpu_weights(const std::map<std::string, Tensor>& weights);
  void make_self_attention(const WanAttentionOptions& attention);
  void forward(const ExecContext& ctx, const StepInfo& step, const TensorView& latents, const TensorView& timestep,
               const TensorView& text, const TensorView& image, const TensorView& out, WanForwardProfile* profile,
               WanBlockCache* block_cache, const WanLoraSelection* lora) const;
  // The image embedder over `image` (B, I, image_dim): (B, I', dim) rows of image context, I' = I
  // (FLF2V: its position table added first).
  std::vector<float> embed_image(const ExecContext& ctx, const TensorView& image, const LoraRows& lora) const;
};

WanTransformer::WanTransformer(WanConfig config, const std::map<std::string, Tensor>& weights,
                               const WanAttentionOptions& attention, Device device)
    : impl_(std::make_unique<Impl>()) {
  check_attention_precision(config, attention, device);
  check_weights(config, weights);
  impl_->config = config;
  impl_->device = device;
  if (device.is_cuda()) {
#ifdef TESSEL_WITH_CUDA
    impl_->cuda = std::make_shared<const dit::cuda::WanCudaModel>(
        config, device, WanWeightResidency::kDevice, WanWeightPrecision::kBf16,
        [&](const WeightSpec& spec) { return dit::cuda::StoredWeight{weights.at(spec.name).view(), {}}; });
#else
    fail_without_cuda(device);
#endif
  } else {
    impl_->load_cpu_weights(weights);
  }
  impl_->make_self_attention(attention);
}

WanTransformer::WanTransformer(std::unique_ptr<Impl> impl, const WanAttentionOptions& attention) : impl_(std::move(impl)) {
  impl_->make_self_attention(attention);
}

void WanTransformer::Impl::load_cpu_weights(const std::map<std::string, Tensor>& weights) {
  Impl& m = *this;
  m.patch_embedding = make_linear(weights, "patch_embedding");
  m.time_linear_1 = make_linear(weights, "condition_embedder.time_embedder.linear_1");
  m.time_linear_2 = make_linear(weights, "condition_embedder.time_embedder.linear_2");
  m.time_projection = make_linear(weights, "condition_embedder.time_proj");
  m.text_linear_1 = make_linear(weights, "condition_embedder.text_embedder.linear_1");
  m.text_linear_2 = make_linear(weights, "condition_embedder.text_embedder.linear_2");
  m.proj_out = make_linear(weights, "proj_out");
  m.out_modulation = to_f32(weights.at("scale_shift_table"));
  if (config.has_image_branch()) {
    const std::string embedder = "condition_embedder.image_embedder.";
    m.image_norm1_weight = to_f32(weights.at(embedder + "norm1.weight"));
    m.image_norm1_bias = to_f32(weights.at(embedder + "norm1.bias"));
    m.image_linear_1 = make_linear(weights, embedder + "ff.net.0.proj");
    m.image_linear_2 = make_linear(weights, embedder + "ff.net.2");
    m.image_norm2_weight = to_f32(weights.at(embedder + "norm2.weight"));
    m.image_norm2_bias = to_f32(weights.at(embedder + "norm2.bias"));
    if (config.pos_embed_seq_len > 0) m.image_position = to_f32(weights.at(embedder + "pos_embed"));
  }
  for (int64_t layer = 0; layer < config.num_layers; ++layer) {
    BlockWeights block;
    block.self_attention = make_attention(weights, layer, "attn1");
    block.cross_attention = make_attention(weights, layer, "attn2");
    if (config.has_image_branch())
      block.image = {make_linear(weights, wan_block_tensor(layer, "attn2.add_k_proj")),
                     make_linear(weights, wan_block_tensor(layer, "attn2.add_v_proj")),
                     to_f32(weights.at(wan_block_tensor(layer, "attn2.norm_added_k.weight")))};
    if (config.cross_attn_norm) {
      block.norm2_weight = to_f32(weights.at(wan_block_tensor(layer, "norm2.weight")));
      block.norm2_bias = to_f32(weights.at(wan_block_tensor(layer, "norm2.bias")));
    }
    block.ffn_in = make_linear(weights, wan_block_tensor(layer, "ffn.net.0.proj"));
    block.ffn_out = make_linear(weights, wan_block_tensor(layer, "ffn.net.2"));
    block.modulation = to_f32(weights.at(wan_block_tensor(layer, "scale_shift_table")));
    m.blocks.push_back(std::move(block));
  }
}

void WanTransformer::Impl::make_self_attention(const WanAttentionOptions& attention) {
  self_attention_precision = attention.precision;
  parallel = attention.parallel;
  if (parallel != nullptr && config.num_attention_heads % parallel->config.sp_ulysses_degree != 0)
    fail_argument("WanAttentionOptions::parallel sp_ulysses_degree",
                  detail::concat("a divisor of the model's ", config.num_attention_heads, " attention heads"),
                  parallel->config.sp_ulysses_degree);
  // The head groups must split each rank's heads too (ParallelAttention checks it again when the
  // first forward of a size builds it; here a bad value fails at load, before any request).
  if (parallel != nullptr && parallel->config.ulysses_head_groups > 1 &&
      (config.num_attention_heads / parallel->config.sp_ulysses_degree) % parallel->config.ulysses_head_groups != 0)
    fail_argument("WanAttentionOptions::parallel ulysses_head_groups",
                  detail::concat("a divisor of the ", config.num_attention_heads / parallel->config.sp_ulysses_degree,
                                 " attention heads of each Ulysses rank"),
                  parallel->config.ulysses_head_groups);
  sequence_parallel.reset();
  for (const auto& [layer, layer_config] : attention.layer_configs)
    if (layer < 0 || layer >= config.num_layers)
      fail_argument("WanAttentionOptions::layer_configs key", detail::concat("a block index in [0, ", config.num_layers, ")"), layer);
  if (!attention.layer_configs.empty() && attention.registry == nullptr)
    fail_argument("WanAttentionOptions::registry", "a registry to resolve the per-block configs with", "null");
  if (attention.registry != nullptr) {
    const auto plan_cache = attention.plan_cache ? attention.plan_cache : std::make_shared<PlanCache>();
    for (int64_t layer = 0; layer < config.num_layers; ++layer) {
      SparseAttentionOptions options;
      options.num_heads = config.num_attention_heads;
      options.head_dim = config.attention_head_dim;
      options.module = ModuleType::kDitSelf;
      const auto own = attention.layer_configs.find(layer);
      options.config = own == attention.layer_configs.end() ? attention.config : own->second;
      options.backend_override = attention.backend_override;
      options.dtype = device.is_cuda() ? DType::kBF16 : DType::kF32;
      options.device = device;
      options.layer_index = layer;
      options.plan_cache = plan_cache;
      options.registry = attention.registry;
      self_attention.push_back(std::make_shared<SparseAttention>(std::move(options)));
    }
  }
}

WanSequenceParallel* WanTransformer::Impl::sequence_parallel_for(int64_t batch, int64_t seq) const {
  if (parallel == nullptr) return nullptr;
  if (!sequence_parallel || !sequence_parallel->serves(batch, seq))
    sequence_parallel = std::make_shared<WanSequenceParallel>(*parallel, batch, seq, config.num_attention_heads, config.attention_head_dim,
                                                              self_attention, device.is_cuda() ? DType::kBF16 : DType::kF32, device);
  sequence_parallel->set_timeline(timeline);
  return sequence_parallel.get();
}

void WanTransformer::set_phase_timeline(PhaseTimeline* timeline) const { impl_->timeline = timeline; }

WanTransformer WanTransformer::with_attention(const WanAttentionOptions& attention) const {
  check_attention_precision(impl_->config, attention, impl_->device);
  auto impl = std::make_unique<Impl>(*impl_);
  impl->self_attention.clear();
  return WanTransformer(std::move(impl), attention);
}

WanTransformer::~WanTransformer() = default;
WanTransformer::WanTransformer(WanTransformer&&) noexcept = default;
WanTransformer& WanTransformer::operator=(WanTransformer&&) noexcept = default;

namespace {

void check_residency(WanWeightResidency residency, WanWeightPrecision precision, Device device) {
  if (residency == WanWeightResidency::kOffloadBlocks && !device.is_cuda())
    fail_argument("block offload", "a CUDA device (the CPU model keeps its weights in host memory already)", device.str());
  if (precision == WanWeightPrecision::kFp8 && !device.is_cuda())
    fail_argument("weight precision fp8 (WanWeightPrecision::kFp8)", "a CUDA device (the CPU model computes in fp32 weights)",
                  device.str());
}

}  // namespace

WanTransformer WanTransformer::load(const std::string& checkpoint_dir, const WanAttentionOptions& attention, Device device,
                                   const WanLora* lora, WanWeightResidency residency, WanWeightPrecision precision,
                                   const std::string& weights_file) {
  check_residency(residency, precision, device);
  const WanConfig config = load_wan_config(checkpoint_dir);
  check_attention_precision(config, attention, device);
  if (lora != nullptr && lora->empty()) lora = nullptr;
  // The weights: the directory's diffusers checkpoint, or one file in the original Wan names
  // (FP8 or not); either is checked whole against the config before anything is converted.
  std::optional<Checkpoint> checkpoint;
  std::optional<WanTransformerFile> file;
  if (weights_file.empty())
    checkpoint = Checkpoint::open(checkpoint_dir);
  else
    file = WanTransformerFile::open(weights_file, config);
  if (!device.is_cuda()) {
    std::map<std::string, Tensor> weights;
    if (checkpoint) {
      weights = load_weights(*checkpoint, wan_weight_specs(config), DType::kF32);
    } else {
      for (const WeightSpec& spec : wan_weight_specs(config)) weights.emplace(spec.name, file->dequantised(spec.name));
    }
    if (lora != nullptr)
      for (auto& [name, tensor] : weights)
        if (lora->changes(name)) tensor = lora->merged(name, tensor.view());
    return WanTransformer(config, weights, attention);
  }
#ifdef TESSEL_WITH_CUDA
  if (checkpoint) check_checkpoint(*checkpoint, wan_weight_specs(config));
  Tensor held;  // a converted tensor, used before the next call
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  impl->device = device;
  impl->cuda = std::make_shared<const dit::cuda::WanCudaModel>(config, device, residency, precision, [&](const WeightSpec& spec) {
    const bool changed = lora != nullptr && lora->changes(spec.name);
    if (file) {
      // e4m3 bytes go to the device as they are where the model keeps that tensor in e4m3 and no
      // LoRA changes it; elsewhere they are dequantised (fp32) and take the tensor's device type.
      if (file->float8(spec.name) && precision == WanWeightPrecision::kFp8 && wan_fp8_weight(spec.name) && !changed) {
        const WanStoredTensor stored = file->stored(spec.name);
        return dit::cuda::StoredWeight{stored.values, stored.row_scales};
      }
      if (!file->float8(spec.name) && !changed) return dit::cuda::StoredWeight{file->stored(spec.name).values, {}};
      held = file->dequantised(spec.name);
      if (changed) held = lora->merged(spec.name, held.view());
      return dit::cuda::StoredWeight{held.view(), {}};
    }
    const TensorView stored = checkpoint->view(spec.name);
    check_finite(stored, checkpoint_dir + ": tensor \"" + spec.name + "\"", "the checkpoint is damaged or was saved with overflowed values");
    if (!changed) return dit::cuda::StoredWeight{stored, {}};
    held = lora->merged(spec.name, stored);
    return dit::cuda::StoredWeight{held.view(), {}};
  });
  return WanTransformer(std::move(impl), attention);
#else
  fail_without_cuda(device);
#endif
}

WanTransformer WanTransformer::random(const WanConfig& config, uint64_t seed, const WanAttentionOptions& attention, Device device,
                                     WanWeightResidency residency, WanWeightPrecision precision) {
  check_residency(residency, precision, device);
  check_attention_precision(config, attention, device);
  if (device.is_cuda()) {
#ifdef TESSEL_WITH_CUDA
    auto impl = std::make_unique<Impl>();
    impl->config = config;
    impl->device = device;
    impl->cuda = std::make_shared<const dit::cuda::WanCudaModel>(config, device, residency, precision, seed);
    return WanTransformer(std::move(impl), attention);
#else
    fail_without_cuda(device);
#endif
  }
  std::map<std::string, Tensor> weights;
  uint64_t stream = seed;
  for (const WeightSpec& spec : wan_weight_specs(config)) {
    Tensor tensor = Tensor::empty(spec.shape, DType::kF32);
    const WanRandomInit init = wan_random_init(config, spec);
    if (init.normal)
      fill_normal(tensor.view(), ++stream, init.first, init.second);
    else if (init.first == init.second)
      fill(tensor.view(), init.first);
    else
      fill_uniform(tensor.view(), ++stream, init.first, init.second);
    weights.emplace(spec.name, std::move(tensor));
  }
  return WanTransformer(config, weights, attention);
}

SpatialLayout wan_spatial_layout(const WanConfig& config, int64_t latent_frames, int64_t latent_height, int64_t latent_width) {
  if (config.patch_size[1] != config.patch_size[2])
    fail_argument("Wan patch_size height and width", "equal (sparse layouts use square patches)",
                  detail::concat(config.patch_size[1], " x ", config.patch_size[2]));
  if (latent_frames % config.patch_size[0] != 0)
    fail_argument("latent frames", detail::concat("a multiple of the patch's ", config.patch_size[0]), latent_frames);
  SpatialLayout layout;
  layout.frames = latent_frames / config.patch_size[0];
  layout.height = latent_height;
  layout.width = latent_width;
  layout.patch_size = config.patch_size[1];
  layout.validate("Wan latent");
  return layout;
}

const WanConfig& WanTransformer::config() const { return impl_->config; }
Device WanTransformer::device() const { return impl_->device; }

size_t WanTransformer::weight_bytes() const {
#ifdef TESSEL_WITH_CUDA
  if (impl_->cuda) return impl_->cuda->weight_bytes();
#endif
  size_t bytes = 0;
  for (const WeightSpec& spec : wan_weight_specs(impl_->config)) bytes += static_cast<size_t>(shape_numel(spec.shape)) * sizeof(float);
  return bytes;
}

size_t WanTransformer::offloaded_weight_bytes() const {
#ifdef TESSEL_WITH_CUDA
  if (impl_->cuda) return impl_->cuda->offloaded_weight_bytes();
#endif
  return 0;
}

size_t WanTransformer::workspace_bytes(const ExecContext& ctx, int64_t batch, int64_t latent_frames, int64_t latent_height,
                                       int64_t latent_width, int64_t text_tokens, bool per_token_timestep, int64_t image_tokens,
                                       int64_t lora_rank) const {
#ifdef TESSEL_WITH_CUDA
  if (impl_->cuda) {
    // Per token is the most a forward takes (per frame takes as much or less).
    const int64_t seq = latent_frames / impl_->config.patch_size[0] * (latent_height / impl_->config.patch_size[1]) *
                        (latent_width / impl_->config.patch_size[2]);
    auto run = impl_->cuda_shape(batch, latent_frames, latent_height, latent_width, text_tokens, image_tokens,
                                       per_token_timestep ? seq : 1);
    run.shape.lora_rank = lora_rank;
    return impl_->cuda->workspace_bytes(run.shape);
  }
#endif
  const WanConfig& c = impl_->config;
  const int64_t seq = latent_frames / c.patch_size[0] * (latent_height / c.patch_size[1]) * (latent_width / c.patch_size[2]);
  const int64_t heads = c.num_attention_heads, head_dim = c.attention_head_dim;
  return std::max(attention_workspace_bytes(ctx, Device::cpu(), AttentionDims{batch, seq, seq, heads, heads, head_dim}),
                  attention_workspace_bytes(ctx, Device::cpu(),
                                            AttentionDims{batch, seq, std::max(text_tokens, image_tokens), heads, heads, head_dim}));
}

const SparseAttention* WanTransformer::block_attention(int64_t layer) const {
  if (layer < 0 || layer >= impl_->config.num_layers)
    fail_argument("layer", detail::concat("in [0, ", impl_->config.num_layers, ")"), layer);
  return impl_->self_attention.empty() ? nullptr : impl_->self_attention[static_cast<size_t>(layer)].get();
}

void WanTransformer::forward(const ExecContext& ctx, const StepInfo& step, const TensorView& latents,
                             const TensorView& timestep, const TensorView& text, const TensorView& out,
                             WanForwardProfile* profile, WanBlockCache* block_cache, const WanLoraSelection* lora) const {
  impl_->forward(ctx, step, latents, timestep, text, TensorView{}, out, profile, block_cache, lora);
}

void WanTransformer::forward(const ExecContext& ctx, const StepInfo& step, const TensorView& latents,
                             const TensorView& timestep, const TensorView& text, const TensorView& image, const TensorView& out,
                             WanForwardProfile* profile, WanBlockCache* block_cache, const WanLoraSelection* lora) const {
  impl_->forward(ctx, step, latents, timestep, text, image, out, profile, block_cache, lora);
}

std::vector<float> WanTransformer::Impl::embed_image(const ExecContext& ctx, const TensorView& image, const LoraRows& lora) const {
  const WanConfig& c = config;
  const int64_t rows = image.size(0) * image.size(1), dim = c.inner_dim();
  std::vector<float> x(image.data_as<float>(), image.data_as<float>() + rows * c.image_dim);
  if (image_position.defined()) {
    const float* position = image_position.data_as<float>();
    for (int64_t row = 0; row < rows; ++row)
      for (int64_t i = 0; i < c.image_dim; ++i) x[row * c.image_dim + i] += position[(row % c.pos_embed_seq_len) * c.image_dim + i];
  }
  // diffusers' FP32LayerNorm and FeedForward(mult=1, activation_fn="gelu"): LayerNorm's default eps.
  constexpr double kLayerNormEps = 1e-5;
  dit::layer_norm(ctx, x.data(), rows, c.image_dim, kLayerNormEps, image_norm1_weight.data_as<float>(), image_norm1_bias.data_as<float>(),
                  x.data());
  std::vector<float> hidden(static_cast<size_t>(rows * c.image_dim)), context(static_cast<size_t>(rows * dim));
  image_linear_1(ctx, x.data(), rows, hidden.data(), lora);
  dit::gelu(ctx, hidden.data(), rows * c.image_dim);
  image_linear_2(ctx, hidden.data(), rows, context.data(), lora);
  dit::layer_norm(ctx, context.data(), rows, dim, kLayerNormEps, image_norm2_weight.data_as<float>(), image_norm2_bias.data_as<float>(),
                  context.data());
  return context;
}

void WanTransformer::Impl::forward(const ExecContext& ctx, const StepInfo& step, const TensorView& latents,
                                   const TensorView& timestep, const TensorView& text, const TensorView& image, const TensorView& out,
                                   WanForwardProfile* profile, WanBlockCache* block_cache, const WanLoraSelection* lora) const {
  const WanConfig& c = config;
  for (const auto& [view, name] : {std::pair{&latents, "latents"}, {&timestep, "timestep"}, {&text, "text"}, {&out, "out"}}) {
    check_device(*view, device, name);
    check_dtype(*view, DType::kF32, name);
    check_contiguous(*view, name);
  }
  if (!c.has_image_branch() && !image.empty())
    fail_argument("image", "empty (this model has no image branch: image_dim is null)", image.describe());
  if (c.has_image_branch()) {
    if (image.empty())
      fail_argument("image", detail::concat("the CLIP features (B, I, image_dim = ", c.image_dim, ") this model conditions on"), "none");
    check_device(image, device, "image");
    check_dtype(image, DType::kF32, "image");
    check_contiguous(image, "image");
    check_rank(image, 3, "image");
  }
  check_rank(latents, 5, "latents");
  const int64_t batch = latents.size(0), frames = latents.size(2), height = latents.size(3), width = latents.size(4);
  check_shape(latents, {batch, c.in_channels, frames, height, width}, "latents");
  const auto [pt, ph, pw] = c.patch_size;
  const int64_t grid[3] = {frames / pt, height / ph, width / pw};
  const int64_t sizes[3] = {frames, height, width};
  const char* const axes[3] = {"frames", "height", "width"};
  for (int axis = 0; axis < 3; ++axis) {
    if (sizes[axis] % c.patch_size[axis] != 0 || sizes[axis] == 0)
      fail_argument(detail::concat("latents ", axes[axis]), detail::concat("a positive multiple of the patch size ", c.patch_size[axis]),
                    sizes[axis]);
    if (grid[axis] > c.rope_max_seq_len)
      fail_argument(detail::concat("latents ", axes[axis], " in patches"),
                    detail::concat("at most rope_max_seq_len = ", c.rope_max_seq_len), grid[axis]);
  }
  if (!self_attention.empty()) {
    const auto& layout = self_attention.front()->adapter().config().config().geometry.spatial_layout;
    if (layout && !(layout->frames == grid[0] && layout->grid_height() == grid[1] && layout->grid_width() == grid[2]))
      fail_argument("sparse attention geometry.spatial_layout",
                    detail::concat("this latent's patch grid ", grid[0], " x ", grid[1], " x ", grid[2]),
                    detail::concat(layout->frames, " x ", layout->grid_height(), " x ", layout->grid_width()));
  }
  const int64_t seq = grid[0] * grid[1] * grid[2];
  // One timestep per batch entry, per latent frame of patches, or per token (each covering the
  // tokens that follow it in frame-major order).
  if (timestep.dim() == 2 && timestep.size(1) == grid[0])
    check_shape(timestep, {batch, grid[0]}, "timestep (one per latent frame)");
  else if (timestep.dim() == 2)
    check_shape(timestep, {batch, seq}, "timestep (one per token, or one per latent frame)");
  else
    check_shape(timestep, {batch}, "timestep");
  const int64_t timesteps_per_entry = timestep.dim() == 2 ? timestep.size(1) : 1;
  check_rank(text, 3, "text");
  const int64_t text_len = text.size(1);
  if (text_len < 1) fail_argument("text tokens", "at least 1", text_len);
  check_shape(text, {batch, text_len, c.text_dim}, "text");
  check_shape(out, {batch, c.out_channels, frames, height, width}, "out");
  const int64_t image_len = c.has_image_branch() ? image.size(1) : 0;
  if (c.has_image_branch()) {
    if (image_len < 1) fail_argument("image tokens", "at least 1", image_len);
    check_shape(image, {batch, c.pos_embed_seq_len > 0 ? c.pos_embed_seq_len : image_len, c.image_dim},
                c.pos_embed_seq_len > 0 ? "image (FLF2V: pos_embed_seq_len tokens, the first and last frames')" : "image");
  }
  if (block_cache && timestep.dim() == 2)
    fail_argument("block_cache", "a (B) timestep (one per batch entry)", "a (B, S) or (B, F) timestep");
  LoraRows lora_rows;
  if (lora != nullptr) lora_rows = LoraRows{lora->bank, lora_runs(*lora, c, device, batch), batch};

#ifdef TESSEL_WITH_CUDA
  if (cuda) {
    if (block_cache && !block_cache->handles_device(device))
      fail_argument("block_cache", "a step cache whose hooks handle " + device.str() + " memory", "a host-only cache");
    WanForwardShapeAndShards run = cuda_shape(batch, frames, height, width, text_len, image_len, timesteps_per_entry);
    run.shape.block_cache = block_cache != nullptr;
    if (!lora_rows.runs.empty()) run.shape.lora_rank = lora->bank->max_rank();
    cuda->forward(ctx, step, run.shape, latents.data_as<float>(), timestep.data_as<float>(), text.data_as<float>(),
                  c.has_image_branch() ? image.data_as<float>() : nullptr, out.data_as<float>(), self_attention, profile,
                  run.sequence_parallel, block_cache, lora_rows.runs.empty() ? nullptr : lora_rows.bank, lora_rows.runs);
    return;
  }
#endif
  const int64_t dim = c.inner_dim(), heads = c.num_attention_heads, head_dim = c.attention_head_dim;
  // Under sequence parallelism the blocks run on this rank's `tokens` rows per batch entry.
  WanSequenceParallel* const sp = sequence_parallel_for(batch, seq);
  const int64_t tokens = sp ? sp->shard_length() : seq;
  const int64_t rows = batch * tokens, text_rows = batch * text_len;
  // Conditioning groups: one per timestep (per batch entry, per latent frame or per token, as Wan
  // 2.2 conditions a first frame), each over the consecutive rows it covers; under sequence
  // parallelism with several per entry, one per row of the shard. The rows of a group share its
  // modulation vectors.
  const int64_t groups = sp && timesteps_per_entry > 1 ? rows : batch * timesteps_per_entry, group_rows = rows / groups;
  const int64_t patch_len = c.in_channels * c.patch_volume();
  const auto buffer = [](int64_t count) { return std::vector<float>(static_cast<size_t>(count)); };
  Stopwatch clock(profile);
  // The attention kernels' scratch: the caller's workspace, else one for this call sized once for
  // both attentions (instead of one allocation per attention call).
  Workspace call_workspace;
  ExecContext run_ctx = ctx;
  const AttentionDims self_dims{batch, seq, seq, heads, heads, head_dim};
  if (ctx.workspace == nullptr) {
    const AttentionDims cross_dims{batch, seq, std::max(text_len, image_len), heads, heads, head_dim};
    call_workspace.reserve(std::max(attention_workspace_bytes(ctx, Device::cpu(), self_dims),
                                    attention_workspace_bytes(ctx, Device::cpu(), cross_dims)));
    run_ctx = ctx.with_workspace(&call_workspace);
  }
  // The shard attention reserves nothing itself; the whole sequence's needs bound its calls'.
  if (sp) run_ctx.workspace->reserve(attention_workspace_bytes(ctx, Device::cpu(), self_dims, sp->mask_block_kv()));

  // Patchify: one row per token (frame-major), (c, t, h, w) within a row as the Conv3d kernel.
  std::vector<float> patches = buffer(batch * seq * patch_len);
  const float* src = latents.data_as<float>();
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t f = 0; f < grid[0]; ++f)
      for (int64_t y = 0; y < grid[1]; ++y)
        for (int64_t x = 0; x < grid[2]; ++x) {
          float* row = patches.data() + ((b * grid[0] + f) * grid[1] * grid[2] + y * grid[2] + x) * patch_len;
          for (int64_t ch = 0; ch < c.in_channels; ++ch)
            for (int64_t i = 0; i < pt; ++i)
              for (int64_t j = 0; j < ph; ++j)
                for (int64_t k = 0; k < pw; ++k)
                  *row++ = src[(((b * c.in_channels + ch) * frames + f * pt + i) * height + y * ph + j) * width + x * pw + k];
        }
  const float* group_timesteps = timestep.data_as<float>();
  std::vector<float> shard_patches, token_timesteps, shard_timesteps;
  if (sp) {
    sp->take_rows(ctx, patches.data(), patch_len, (shard_patches = buffer(rows * patch_len)).data());
    patches.swap(shard_patches);
    if (timesteps_per_entry > 1) {
      if (timesteps_per_entry < seq) {  // one per frame: repeated over the frame's tokens first
        token_timesteps = buffer(batch * seq);
        for (int64_t i = 0; i < batch * seq; ++i) token_timesteps[i] = group_timesteps[i / (seq / timesteps_per_entry)];
        group_timesteps = token_timesteps.data();
      }
      sp->take_rows(ctx, group_timesteps, 1, (shard_timesteps = buffer(rows)).data());
      group_timesteps = shard_timesteps.data();
    }
  }
  // Conditioning: temb = MLP(sinusoid(t)); the per-block modulation input = linear(SiLU(temb)).
  std::vector<float> sinusoid = buffer(groups * c.freq_dim), time_hidden = buffer(groups * dim), temb = buffer(groups * dim);
  dit::sinusoidal_embedding(group_timesteps, groups, c.freq_dim, sinusoid.data());
  const WanRope rope(c, grid[0], grid[1], grid[2]);
  clock.charge(&WanForwardProfile::other_s);

  std::vector<float> hidden_states = buffer(rows * dim);
  patch_embedding(ctx, patches.data(), rows, hidden_states.data(), lora_rows);
  time_linear_1(ctx, sinusoid.data(), groups, time_hidden.data(), lora_rows);
  clock.charge(&WanForwardProfile::gemm_s);
  dit::silu(ctx, time_hidden.data(), groups * dim);
  clock.charge(&WanForwardProfile::other_s);
  time_linear_2(ctx, time_hidden.data(), groups, temb.data(), lora_rows);
  std::vector<float> temb_act = temb, modulation_input = buffer(groups * 6 * dim);
  dit::silu(ctx, temb_act.data(), groups * dim);
  time_projection(ctx, temb_act.data(), groups, modulation_input.data(), lora_rows);
  // Text: linear -> GELU-tanh -> linear.
  std::vector<float> text_hidden = buffer(text_rows * dim), context = buffer(text_rows * dim);
  text_linear_1(ctx, text.data_as<float>(), text_rows, text_hidden.data(), lora_rows);
  clock.charge(&WanForwardProfile::gemm_s);
  dit::gelu_tanh(ctx, text_hidden.data(), text_rows * dim);
  clock.charge(&WanForwardProfile::other_s);
  text_linear_2(ctx, text_hidden.data(), text_rows, context.data(), lora_rows);
  clock.charge(&WanForwardProfile::gemm_s);
  // Image: the embedder's rows, attended to by every block's cross-attention beside the text.
  const int64_t image_rows = batch * image_len;
  std::vector<float> image_context, image_k, image_v;
  if (c.has_image_branch()) {
    image_context = embed_image(ctx, image, lora_rows);
    image_k = buffer(image_rows * dim);
    image_v = buffer(image_rows * dim);
    clock.charge(&WanForwardProfile::other_s);
  }

  std::vector<float> normed = buffer(rows * dim), q = buffer(rows * dim), k = buffer(rows * dim), v = buffer(rows * dim);
  std::vector<float> attended = buffer(rows * dim), projected = buffer(rows * dim), ffn_hidden = buffer(rows * c.ffn_dim);
  std::vector<float> text_k = buffer(text_rows * dim), text_v = buffer(text_rows * dim), modulation = buffer(groups * 6 * dim);
  const auto bshd = [&](std::vector<float>& data, int64_t tokens) {
    return TensorView(data.data(), DType::kF32, Device::cpu(), {batch, tokens, heads, head_dim});
  };

  const auto run_layers = [&](int64_t first_layer, int64_t end_layer) {
    for (int64_t layer = first_layer; layer < end_layer; ++layer) {
      const BlockWeights& block = blocks[static_cast<size_t>(layer)];
      // modulation[b] = table + time projection[b]: (shift, scale, gate) of attention, then of the FFN.
      for (int64_t g = 0; g < groups; ++g)
        for (int64_t i = 0; i < 6 * dim; ++i)
          modulation[g * 6 * dim + i] = block.modulation.data_as<float>()[i] + modulation_input[g * 6 * dim + i];
      const float* mod = modulation.data();
      const int64_t mod_stride = 6 * dim;
      clock.charge(&WanForwardProfile::other_s);

      // Self-attention.
      dit::layer_norm_modulate(ctx, hidden_states.data(), groups, group_rows, dim, c.eps, mod, mod + dim, mod_stride, normed.data());
      clock.charge(&WanForwardProfile::norm_rope_s);
      const AttentionWeights& sa = block.self_attention;
      sa.project(ctx, c.eps, normed.data(), rows, normed.data(), rows, q.data(), k.data(), v.data(), clock, lora_rows);
      for (float* x : {q.data(), k.data()}) {
        if (sp)
          sp->rotate(ctx, x, rope.cos(), rope.sin());
        else
          dit::rotate_pairs(ctx, x, batch, seq, heads, head_dim, rope.cos(), rope.sin());
      }
      clock.charge(&WanForwardProfile::norm_rope_s);
      AttentionStepReport report;
      StepInfo layer_step = step;
      layer_step.layer = layer;
      const SparseAttention* module = self_attention.empty() ? nullptr : self_attention[static_cast<size_t>(layer)].get();
      if (sp) {
        report = sp->attend(run_ctx, module, layer_step, q.data(), k.data(), v.data(), attended.data());
      } else if (module == nullptr) {
        attention_forward(run_ctx, bshd(q, seq), bshd(k, seq), bshd(v, seq), bshd(attended, seq), TensorView{});
      } else {
        report = module->forward(run_ctx, layer_step, bshd(q, seq), bshd(k, seq), bshd(v, seq), bshd(attended, seq));
      }
      clock.charge(&WanForwardProfile::attention_s);
      if (profile) profile->add_self_attention(report);
      sa.out(ctx, attended.data(), rows, projected.data(), lora_rows);
      clock.charge(&WanForwardProfile::gemm_s);
      dit::gated_residual(ctx, hidden_states.data(), projected.data(), groups, group_rows, dim, mod + 2 * dim, mod_stride);
      clock.charge(&WanForwardProfile::other_s);

      // Cross-attention to the text (no modulation, plain residual).
      if (config.cross_attn_norm) {
        dit::layer_norm(ctx, hidden_states.data(), rows, dim, c.eps, block.norm2_weight.data_as<float>(), block.norm2_bias.data_as<float>(),
                        normed.data());
      } else {
        normed = hidden_states;
      }
      clock.charge(&WanForwardProfile::norm_rope_s);
      const AttentionWeights& ca = block.cross_attention;
      ca.project(ctx, c.eps, normed.data(), rows, context.data(), text_rows, q.data(), text_k.data(), text_v.data(), clock, lora_rows);
      clock.charge(&WanForwardProfile::norm_rope_s);
      attention_forward(run_ctx, bshd(q, tokens), bshd(text_k, text_len), bshd(text_v, text_len), bshd(attended, tokens),
                        TensorView{});
      clock.charge(&WanForwardProfile::attention_s);
      if (c.has_image_branch()) {
        // diffusers sums the two attentions' outputs before the output projection.
        const ImageKeyValueWeights& kv = block.image;
        kv.k(ctx, image_context.data(), image_rows, image_k.data(), lora_rows);
        kv.v(ctx, image_context.data(), image_rows, image_v.data(), lora_rows);
        clock.charge(&WanForwardProfile::gemm_s);
        dit::rms_norm(ctx, image_k.data(), image_rows, dim, c.eps, kv.norm_k.data_as<float>());
        clock.charge(&WanForwardProfile::norm_rope_s);
        attention_forward(run_ctx, bshd(q, tokens), bshd(image_k, image_len), bshd(image_v, image_len), bshd(projected, tokens),
                          TensorView{});
        for (int64_t i = 0; i < rows * dim; ++i) attended[i] += projected[i];
        clock.charge(&WanForwardProfile::attention_s);
      }
      ca.out(ctx, attended.data(), rows, projected.data(), lora_rows);
      clock.charge(&WanForwardProfile::gemm_s);
      dit::gated_residual(ctx, hidden_states.data(), projected.data(), batch, tokens, dim, nullptr, 0);
      clock.charge(&WanForwardProfile::other_s);

      // Feed-forward.
      dit::layer_norm_modulate(ctx, hidden_states.data(), groups, group_rows, dim, c.eps, mod + 3 * dim, mod + 4 * dim, mod_stride,
                               normed.data());
      clock.charge(&WanForwardProfile::norm_rope_s);
      block.ffn_in(ctx, normed.data(), rows, ffn_hidden.data(), lora_rows);
      clock.charge(&WanForwardProfile::gemm_s);
      dit::gelu_tanh(ctx, ffn_hidden.data(), rows * c.ffn_dim);
      clock.charge(&WanForwardProfile::other_s);
      block.ffn_out(ctx, ffn_hidden.data(), rows, projected.data(), lora_rows);
      clock.charge(&WanForwardProfile::gemm_s);
      dit::gated_residual(ctx, hidden_states.data(), projected.data(), groups, group_rows, dim, mod + 5 * dim, mod_stride);
      clock.charge(&WanForwardProfile::other_s);
    }
  };

  if (block_cache == nullptr) {
    run_layers(0, c.num_layers);
  } else {
    // A step cache may stand in for a span of the blocks (WanBlockCache): the leading blocks run,
    // the cache decides on their output, the span runs or is replaced, the trailing blocks run.
    const int64_t leading = block_cache->leading_blocks(), trailing = block_cache->trailing_blocks();
    if (leading < 0 || trailing < 0 || leading + trailing > c.num_layers)
      fail_argument("block_cache leading and trailing blocks", detail::concat("two counts >= 0 summing to at most num_layers = ", c.num_layers),
                    detail::concat(leading, " and ", trailing));
    const std::vector<float> embeddings = hidden_states;
    const bool sharded = sp != nullptr && sp->shards() > 1;  // one shard (a CFG-only group) is the whole sequence
    const WanBlockCacheInput cache_input{&step, batch, tokens, dim, temb.data(), modulation_input.data(), embeddings.data(), sharded};
    run_layers(0, leading);
    if (block_cache->before_blocks(cache_input, hidden_states.data())) {
      const std::vector<float> span_input = leading == 0 ? std::vector<float>{} : hidden_states;
      run_layers(leading, c.num_layers - trailing);
      block_cache->after_blocks(cache_input, leading == 0 ? embeddings.data() : span_input.data(), hidden_states.data());
    }
    run_layers(c.num_layers - trailing, c.num_layers);
  }

  // Output: AdaLN from temb itself (not its SiLU), projection to patches, unpatchify.
  std::vector<float> out_modulation_g = buffer(groups * 2 * dim);
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t i = 0; i < 2 * dim; ++i)
      out_modulation_g[g * 2 * dim + i] = out_modulation.data_as<float>()[i] + temb[g * dim + i % dim];
  dit::layer_norm_modulate(ctx, hidden_states.data(), groups, group_rows, dim, c.eps, out_modulation_g.data(),
                           out_modulation_g.data() + dim, 2 * dim, normed.data());
  clock.charge(&WanForwardProfile::norm_rope_s);
  const int64_t out_patch = c.out_channels * c.patch_volume();
  std::vector<float> patches_out = buffer(rows * out_patch);
  proj_out(ctx, normed.data(), rows, patches_out.data(), lora_rows);
  clock.charge(&WanForwardProfile::gemm_s);
  if (sp) {  // every rank unpatchifies the whole output
    std::vector<float> all_patches = buffer(batch * seq * out_patch);
    sp->gather_rows(ctx, patches_out.data(), out_patch, all_patches.data());
    patches_out.swap(all_patches);
  }
  // A projected row is (t, h, w, channel) within the patch.
  float* dst = out.data_as<float>();
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t f = 0; f < grid[0]; ++f)
      for (int64_t y = 0; y < grid[1]; ++y)
        for (int64_t x = 0; x < grid[2]; ++x) {
          const float* row = patches_out.data() + ((b * grid[0] + f) * grid[1] * grid[2] + y * grid[2] + x) * out_patch;
          for (int64_t i = 0; i < pt; ++i)
            for (int64_t j = 0; j < ph; ++j)
              for (int64_t k = 0; k < pw; ++k)
                for (int64_t ch = 0; ch < c.out_channels; ++ch)
                  dst[(((b * c.out_channels + ch) * frames + f * pt + i) * height + y * ph + j) * width + x * pw + k] = *row++;
        }
  clock.charge(&WanForwardProfile::other_s);
  if (profile) ++profile->forwards;
}

}  // namespace tessel
