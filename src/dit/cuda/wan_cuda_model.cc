// The Wan transformer's bf16 CUDA forward (see wan_cuda_model.h for what runs in which precision).
#include "cuda/wan_cuda_model.h"

#include <algorithm>
#include <mutex>
#include <string_view>

#include <cuda_runtime.h>

#include "cuda/wan_block_offload.h"
#include "cuda/wan_kernels.h"
#include "cuda/wan_lora_gemm.h"
#include "tessel/core/allocator.h"
#include "tessel/core/error.h"
#include "tessel/dit/wan_lora_bank.h"
#include "tessel/dit/wan_weights.h"
#include "tessel/kernels/attention.h"
#include "tessel/kernels/cuda/device_guard.h"
#include "tessel/kernels/cuda/fp8_rows.h"
#include "tessel/kernels/cuda/launch_check.h"
#include "tessel/sparse/sparse_attention.h"
#include "wan_sequence_parallel.h"

namespace tessel::dit::cuda {
namespace {

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw Error(detail::concat("Wan CUDA forward: ", what, ": ", cudaGetErrorString(status)));
}

// Takes consecutive slices of a workspace, or only counts the bytes they need (no slicer), so the
// sizing and the run share one list of slices.
class SliceTaker {
 public:
  explicit SliceTaker(WorkspaceSlicer* slicer) : slicer_(slicer) {}
  template <typename T>
  T* take(int64_t count, const char* what) {
    const size_t bytes = static_cast<size_t>(count) * sizeof(T);
    if (slicer_ != nullptr) return slicer_->take<T>(static_cast<size_t>(count), what);
    counted_ += workspace_slice_bytes(bytes);
    return nullptr;
  }
  size_t counted() const { return counted_; }

 private:
  WorkspaceSlicer* slicer_;
  size_t counted_ = 0;
};

// The activations of one forward.
struct Activations {
  void* gemm_scratch;
  bf16 *patches, *text, *text_hidden, *context, *normed, *q, *k, *v, *attended, *ffn_hidden, *text_k, *text_v;
  float *sinusoid, *time_hidden, *temb, *temb_act, *modulation_input, *hidden, *out_patches, *rope_cos, *rope_sin;
  // Sequence parallelism only (else null): the whole latent's patches and output patches, and with
  // several timesteps per entry, one per token of the whole latent and of this rank's shard.
  bf16* all_patches;
  float *all_out_patches, *token_timestep, *shard_timestep;
  // With a step cache: the patch embeddings until its hook has judged them, then the hidden states
  // entering its span of blocks (one buffer: the hook needs the embeddings only before the span).
  float* blocks_input;
  // With an image branch (else null): FLF2V's features plus the position table (fp32), the
  // embedder's LayerNorm output (bf16; then its GELU's, the norm's being dead by then), its two
  // linears' outputs (fp32), the image context the blocks attend to and one block's image keys
  // and values (bf16).
  float *image_positioned, *image_ff, *image_embedded;
  bf16 *image_normed, *image_context, *image_k, *image_v;
  // FP8 weights only (else null): the e4m3 rows (and their scales) of the input the next block GEMMs
  // read, and the text context's, quantised once per forward.
  uint8_t *input_fp8, *context_fp8;
  float *input_scales, *context_scales;
  // Per-request LoRA (else null): the rank-wide intermediate of the widest linear's rows, and the
  // fp32-input linears' (the time embedder's and projection's) input rounded to bf16.
  bf16 *lora_shrunk, *lora_input;
  // The output projection of each attention and of the FFN reuses q (dead by then).
  bf16* projected() const { return q; }
  // The cross-attention's image half writes into k (the self-attention's keys are dead by then).
  bf16* image_attended() const { return k; }
};

// The conditioning groups of `rows` token rows: one per timestep (each covering tokens /
// timesteps_per_entry consecutive rows), or under sequence parallelism with several timesteps per
// entry one per row of the shard (a shard need not start at a group's first token).
int64_t conditioning_groups(const WanForwardShape& s, int64_t rows) {
  return s.shard_tokens > 0 && s.timesteps_per_entry > 1 ? rows : s.batch * s.timesteps_per_entry;
}

Activations take_activations(SliceTaker& taker, const WanConfig& c, const WanForwardShape& s, bool fp8_weights) {
  const int64_t seq = s.frames / c.patch_size[0] * (s.height / c.patch_size[1]) * (s.width / c.patch_size[2]);
  const bool sharded = s.shard_tokens > 0;
  const int64_t rows = s.batch * (sharded ? s.shard_tokens : seq), text_rows = s.batch * s.text_len, dim = c.inner_dim();
  // The rotary tables cover every shard's positions (padding rows read zeros).
  const int64_t rope_rows = sharded ? std::max(seq, s.shards * s.shard_tokens) : seq;
  const int64_t groups = conditioning_groups(s, rows);
  Activations a{};
  a.gemm_scratch = taker.take<std::byte>(static_cast<int64_t>(CublasLtGemm::kWorkspaceBytes), "GEMM scratch");
  a.patches = taker.take<bf16>(rows * c.in_channels * c.patch_volume(), "patches");
  a.sinusoid = taker.take<float>(groups * c.freq_dim, "timestep sinusoid");
  a.time_hidden = taker.take<float>(groups * dim, "time embedder hidden");
  a.temb = taker.take<float>(groups * dim, "time embedding");
  a.temb_act = taker.take<float>(groups * dim, "SiLU(time embedding)");
  a.modulation_input = taker.take<float>(groups * 6 * dim, "time projection");
  a.text = taker.take<bf16>(text_rows * c.text_dim, "text (bf16)");
  a.text_hidden = taker.take<bf16>(text_rows * dim, "text embedder hidden");
  a.context = taker.take<bf16>(text_rows * dim, "text context");
  a.text_k = taker.take<bf16>(text_rows * dim, "cross-attention k");
  a.text_v = taker.take<bf16>(text_rows * dim, "cross-attention v");
  a.hidden = taker.take<float>(rows * dim, "residual stream");
  a.normed = taker.take<bf16>(rows * dim, "normed");
  a.q = taker.take<bf16>(rows * dim, "q");
  a.k = taker.take<bf16>(rows * dim, "k");
  a.v = taker.take<bf16>(rows * dim, "v");
  a.attended = taker.take<bf16>(rows * dim, "attention output");
  a.ffn_hidden = taker.take<bf16>(rows * c.ffn_dim, "FFN hidden");
  a.out_patches = taker.take<float>(rows * c.out_channels * c.patch_volume(), "output patches");
  a.rope_cos = taker.take<float>(rope_rows * (c.attention_head_dim / 2), "rotary cosines");
  a.rope_sin = taker.take<float>(rope_rows * (c.attention_head_dim / 2), "rotary sines");
  if (sharded) {
    a.all_patches = taker.take<bf16>(s.batch * seq * c.in_channels * c.patch_volume(), "patches of every shard");
    a.all_out_patches = taker.take<float>(s.batch * seq * c.out_channels * c.patch_volume(), "output patches of every shard");
    if (s.timesteps_per_entry > 1) {
      a.token_timestep = taker.take<float>(s.batch * seq, "per-token timesteps");
      a.shard_timestep = taker.take<float>(rows, "this shard's timesteps");
    }
  }
  a.blocks_input = s.block_cache ? taker.take<float>(rows * dim, "embeddings, then blocks input (step cache)") : nullptr;
  if (s.image_len > 0) {
    const int64_t image_rows = s.batch * s.image_len;
    if (c.pos_embed_seq_len > 0) a.image_positioned = taker.take<float>(image_rows * c.image_dim, "image + position table");
    a.image_normed = taker.take<bf16>(image_rows * c.image_dim, "image embedder norm / GELU");
    a.image_ff = taker.take<float>(image_rows * c.image_dim, "image embedder hidden");
    a.image_embedded = taker.take<float>(image_rows * dim, "image embedder output");
    a.image_context = taker.take<bf16>(image_rows * dim, "image context");
    a.image_k = taker.take<bf16>(image_rows * dim, "image k");
    a.image_v = taker.take<bf16>(image_rows * dim, "image v");
  }
  if (fp8_weights) {
    a.input_fp8 = taker.take<uint8_t>(rows * std::max(dim, c.ffn_dim), "block GEMM input (e4m3)");
    a.input_scales = taker.take<float>(rows, "block GEMM input scales");
    a.context_fp8 = taker.take<uint8_t>(text_rows * dim, "text context (e4m3)");
    a.context_scales = taker.take<float>(text_rows, "text context scales");
  }
  if (s.lora_rank > 0) {
    const int64_t widest = std::max({rows, text_rows, groups, s.batch * s.image_len});
    a.lora_shrunk = taker.take<bf16>(widest * s.lora_rank, "LoRA intermediate");
    a.lora_input = taker.take<bf16>(groups * std::max(c.freq_dim, dim), "LoRA input (bf16)");
  }
  return a;
}

// CUDA events between the kinds of work of one forward, read once at its end.
class EventTimeline {
 public:
  EventTimeline(WanForwardProfile* profile, cudaStream_t stream) : profile_(profile), stream_(stream) {
    if (profile_) record();
  }
  ~EventTimeline() {
    for (cudaEvent_t event : events_) cudaEventDestroy(event);
  }
  EventTimeline(const EventTimeline&) = delete;
  EventTimeline& operator=(const EventTimeline&) = delete;

  // The work enqueued since the previous mark is of kind `slot`.
  void charge(double WanForwardProfile::*slot) {
    if (!profile_) return;
    record();
    slots_.push_back(slot);
  }
  // Waits for the last event and adds the intervals to the profile.
  void finish() {
    if (!profile_ || events_.empty()) return;
    check_cuda(cudaEventSynchronize(events_.back()), "cudaEventSynchronize (profile)");
    for (size_t i = 0; i < slots_.size(); ++i) {
      float ms = 0.0f;
      check_cuda(cudaEventElapsedTime(&ms, events_[i], events_[i + 1]), "cudaEventElapsedTime (profile)");
      profile_->*slots_[i] += ms / 1000.0;
    }
  }

 private:
  void record() {
    cudaEvent_t event = nullptr;
    check_cuda(cudaEventCreate(&event), "cudaEventCreate (profile)");
    events_.push_back(event);
    check_cuda(cudaEventRecord(event, stream_), "cudaEventRecord (profile)");
  }

  WanForwardProfile* profile_;
  cudaStream_t stream_;
  std::vector<cudaEvent_t> events_;
  std::vector<double WanForwardProfile::*> slots_;
};

}  // namespace

namespace {

// A block tensor's name split into its block and the name within the block ("blocks.3.attn1.to_q.weight"
// -> 3, "attn1.to_q.weight"); false for the other tensors.
bool split_block_tensor(const std::string& name, int64_t& block, std::string& within) {
  static constexpr std::string_view kPrefix = "blocks.";
  if (name.compare(0, kPrefix.size(), kPrefix) != 0) return false;
  const size_t dot = name.find('.', kPrefix.size());
  if (dot == std::string::npos) return false;
  block = std::stoll(name.substr(kPrefix.size(), dot - kPrefix.size()));
  within = name.substr(dot + 1);
  return true;
}

}  // namespace

void WanCudaModel::allocate_weights(WanWeightResidency residency) {
  const bool offload = residency == WanWeightResidency::kOffloadBlocks;
  size_t block_bytes = 0, largest_fp8 = 0;
  const auto place = [&](const std::string& name, int64_t numel, DType dtype) {
    const size_t bytes = workspace_slice_bytes(static_cast<size_t>(numel) * dtype_size(dtype));
    int64_t block = 0;
    std::string within;
    if (offload && split_block_tensor(name, block, within)) {
      // Every block has the same tensors: block 0's offsets serve them all.
      if (block == 0) {
        block_layout_[within] = {block_bytes, dtype};
        block_bytes += bytes;
      }
      return;
    }
    layout_[name] = {weight_bytes_, dtype};
    weight_bytes_ += bytes;
  };
  for (const WeightSpec& spec : wan_weight_specs(config_)) {
    if (!fp8_weight(spec.name)) {
      place(spec.name, shape_numel(spec.shape), wan_cuda_weight_dtype(spec.name));
      continue;
    }
    // e4m3 bytes (kU8) and one fp32 scale per output channel.
    place(spec.name, shape_numel(spec.shape), DType::kU8);
    place(spec.name + "_scale", spec.shape[0], DType::kF32);
    largest_fp8 = std::max(largest_fp8, static_cast<size_t>(shape_numel(spec.shape)));
  }
  arena_ = allocate(weight_bytes_, MemoryKind::kDevice, device_.index);
  if (largest_fp8 > 0) {
    staging_bf16_ = allocate(largest_fp8 * sizeof(bf16), MemoryKind::kDevice, device_.index);
    if (offload) {
      staging_fp8_ = allocate(largest_fp8, MemoryKind::kDevice, device_.index);
      staging_scales_ = allocate(largest_fp8 * sizeof(float), MemoryKind::kDevice, device_.index);
    }
  }
  if (offload) offload_ = std::make_unique<WanBlockOffload>(device_, config_.num_layers, block_bytes);
}

bool WanCudaModel::fp8_weight(const std::string& name) const {
  return precision_ == WanWeightPrecision::kFp8 && wan_fp8_weight(name);
}

void WanCudaModel::quantize_weight(const WeightSpec& spec, const void* bf16_rows, void* destination, void* scales, bool to_host) {
  const int64_t rows = spec.shape.at(0), cols = shape_numel(spec.shape) / rows;
  if (!to_host) {
    tessel::cuda::launch_quantize_rows_fp8(bf16_rows, DType::kBF16, rows, cols, static_cast<uint8_t*>(destination),
                                           static_cast<float*>(scales), nullptr);
    return;
  }
  tessel::cuda::launch_quantize_rows_fp8(bf16_rows, DType::kBF16, rows, cols, static_cast<uint8_t*>(staging_fp8_.get()),
                                         static_cast<float*>(staging_scales_.get()), nullptr);
  // Synchronous copies on the legacy stream: after the kernel, before the staging is reused.
  copy_bytes(destination, Device::cpu(), staging_fp8_.get(), device_, static_cast<size_t>(rows * cols));
  copy_bytes(scales, Device::cpu(), staging_scales_.get(), device_, static_cast<size_t>(rows) * sizeof(float));
}

WanCudaModel::WanCudaModel(const WanConfig& config, Device device, WanWeightResidency residency, WanWeightPrecision precision,
                           const WeightSource& source)
    : config_(config), device_(device), precision_(precision) {
  const tessel::cuda::DeviceGuard guard(device.index);
  allocate_weights(residency);
  for (const WeightSpec& spec : wan_weight_specs(config_)) {
    const StoredWeight given = source(spec);
    const TensorView& stored = given.values;
    const DType dtype = wan_cuda_weight_dtype(spec.name);
    void* destination = weight_destination(spec.name);
    // An offloaded block's tensor is written into its pinned host copy directly.
    int64_t block = 0;
    std::string within;
    const Device to = offload_ && split_block_tensor(spec.name, block, within) ? Device::cpu() : device_;
    if (stored.dtype() == DType::kU8) {
      // An FP8 checkpoint's e4m3 bytes and scales, as they are (the caller dequantises the others).
      const TensorView& scales = given.row_scales;
      if (!fp8_weight(spec.name) || !stored.is_contiguous() || scales.dtype() != DType::kF32 || !scales.is_contiguous() ||
          scales.numel() != spec.shape.at(0))
        throw Error(detail::concat("Wan CUDA model: e4m3 bytes for ", spec.name, " need fp8 precision, a block linear weight and ",
                                   spec.shape.at(0), " fp32 row scales"));
      copy_bytes(destination, to, stored.data(), Device::cpu(), stored.nbytes());
      copy_bytes(weight_destination(spec.name + "_scale"), to, scales.data(), Device::cpu(), scales.nbytes());
    } else if (fp8_weight(spec.name)) {
      // The bf16 values the bf16 model would keep, quantised on the device.
      if (stored.dtype() == DType::kBF16 && stored.is_contiguous()) {
        copy_bytes(staging_bf16_.get(), device_, stored.data(), Device::cpu(), stored.nbytes());
      } else {
        const Tensor converted = Tensor::empty(spec.shape, DType::kBF16);
        copy_convert(stored, converted.view());
        copy_bytes(staging_bf16_.get(), device_, converted.data(), Device::cpu(), converted.nbytes());
      }
      quantize_weight(spec, staging_bf16_.get(), destination, weight_destination(spec.name + "_scale"), to.is_cpu());
    } else if (stored.dtype() == dtype && stored.is_contiguous()) {
      copy_bytes(destination, to, stored.data(), Device::cpu(), stored.nbytes());
    } else if (to.is_cpu()) {
      copy_convert(stored, TensorView(destination, dtype, Device::cpu(), spec.shape));
    } else {
      const Tensor converted = Tensor::empty(spec.shape, dtype);
      copy_convert(stored, converted.view());
      copy_bytes(destination, device_, converted.data(), Device::cpu(), converted.nbytes());
    }
  }
  check_cuda(cudaDeviceSynchronize(), "weight upload");
  staging_bf16_.reset();
  staging_fp8_.reset();
  staging_scales_.reset();
}

WanCudaModel::WanCudaModel(const WanConfig& config, Device device, WanWeightResidency residency, WanWeightPrecision precision,
                           uint64_t seed)
    : config_(config), device_(device), precision_(precision) {
  const tessel::cuda::DeviceGuard guard(device.index);
  allocate_weights(residency);
  uint64_t stream = seed;
  // The same draws in the same order as without offload; an offloaded block is drawn into its slot
  // and copied down to its host copy (the slot is free: nothing runs yet).
  int64_t drawn_block = -1;
  const auto flush_block = [&] {
    if (drawn_block < 0) return;
    check_cuda(cudaMemcpy(offload_->host_block(drawn_block), offload_->slot(drawn_block), offload_->block_bytes(),
                          cudaMemcpyDeviceToHost),
               "random block download");
    drawn_block = -1;
  };
  for (const WeightSpec& spec : wan_weight_specs(config_)) {
    const WanRandomInit init = wan_random_init(config_, spec);
    int64_t block = 0;
    std::string within;
    // Drawn where it will stay (an offloaded block's tensor in its slot, for now).
    const auto device_address = [&](const std::string& name) -> void* {
      if (offload_ && split_block_tensor(name, block, within)) {
        if (block != drawn_block) flush_block();
        drawn_block = block;
        return static_cast<std::byte*>(offload_->slot(block)) + block_layout_.at(within).first;
      }
      return const_cast<void*>(weight(name));
    };
    void* destination = device_address(spec.name);
    if (fp8_weight(spec.name)) {
      // kBf16's draws, then quantised.
      launch_fill_random(staging_bf16_.get(), true, shape_numel(spec.shape), ++stream, init.normal, static_cast<float>(init.first),
                         static_cast<float>(init.second), nullptr);
      quantize_weight(spec, staging_bf16_.get(), destination, device_address(spec.name + "_scale"), false);
      continue;
    }
    launch_fill_random(destination, wan_cuda_weight_dtype(spec.name) == DType::kBF16, shape_numel(spec.shape), ++stream, init.normal,
                       static_cast<float>(init.first), static_cast<float>(init.second), nullptr);
  }
  tessel::cuda::check_launch("Wan random weights");
  flush_block();
  check_cuda(cudaDeviceSynchronize(), "random weights");
  staging_bf16_.reset();
  staging_fp8_.reset();
  staging_scales_.reset();
}

WanCudaModel::~WanCudaModel() = default;

size_t WanCudaModel::weight_bytes() const { return weight_bytes_ + (offload_ ? offload_->device_bytes() : 0); }
size_t WanCudaModel::offloaded_weight_bytes() const { return offload_ ? offload_->host_bytes() : 0; }

const void* WanCudaModel::weight(const std::string& name) const {
  int64_t block = 0;
  std::string within;
  if (offload_ && split_block_tensor(name, block, within)) {
    const auto it = block_layout_.find(within);
    if (it == block_layout_.end()) throw Error("Wan CUDA model: no tensor " + quoted_excerpt(name, 120));
    return static_cast<const std::byte*>(offload_->slot(block)) + it->second.first;
  }
  const auto it = layout_.find(name);
  if (it == layout_.end()) throw Error("Wan CUDA model: no tensor " + quoted_excerpt(name, 120));
  return static_cast<const std::byte*>(arena_.get()) + it->second.first;
}

void* WanCudaModel::weight_destination(const std::string& name) {
  int64_t block = 0;
  std::string within;
  if (offload_ && split_block_tensor(name, block, within))
    return static_cast<std::byte*>(offload_->host_block(block)) + block_layout_.at(within).first;
  return const_cast<void*>(weight(name));
}

size_t WanCudaModel::workspace_bytes(const WanForwardShape& shape) const {
  SliceTaker counter(nullptr);
  take_activations(counter, config_, shape, precision_ == WanWeightPrecision::kFp8);
  return counter.counted();
}

void WanCudaModel::forward(const ExecContext& ctx, const StepInfo& step, const WanForwardShape& shape, const float* latents,
                           const float* timestep, const float* text, const float* image, float* out,
                           const std::vector<std::shared_ptr<SparseAttention>>& self_attention, WanForwardProfile* profile,
                           WanSequenceParallel* sequence_parallel, WanBlockCache* block_cache,
                           const WanLoraBank* lora_bank, const std::vector<LoraRun>& lora_runs) const {
  const WanConfig& c = config_;
  const tessel::cuda::DeviceGuard guard(device_.index);
  cudaStream_t stream = ctx.stream;
  const auto [pt, ph, pw] = c.patch_size;
  const int64_t grid[3] = {shape.frames / pt, shape.height / ph, shape.width / pw};
  const int64_t seq = grid[0] * grid[1] * grid[2], batch = shape.batch, text_len = shape.text_len;
  const int64_t dim = c.inner_dim(), heads = c.num_attention_heads, head_dim = c.attention_head_dim;
  // Under sequence parallelism the blocks run on this rank's `tokens` rows per batch entry, which
  // start at global position `first_token`.
  WanSequenceParallel* const sp = sequence_parallel;
  if ((sp != nullptr) != (shape.shard_tokens > 0) || (sp && (sp->shard_length() != shape.shard_tokens || sp->shards() != shape.shards)))
    fail_argument("WanForwardShape shard_tokens x shards", sp ? detail::concat(sp->shard_length(), " x ", sp->shards()) : "0 x 1",
                  detail::concat(shape.shard_tokens, " x ", shape.shards));
  const int64_t tokens = sp ? sp->shard_length() : seq, first_token = sp ? sp->first_token() : 0;
  const int64_t rows = batch * tokens, text_rows = batch * text_len;
  const int64_t image_len = shape.image_len, image_rows = batch * image_len;
  if (c.has_image_branch() != (image != nullptr && image_len > 0))
    fail_argument("Wan CUDA forward image", c.has_image_branch() ? "the CLIP features (the model has an image branch)" : "none",
                  image != nullptr ? detail::concat(image_len, " tokens") : "none");
  if (shape.timesteps_per_entry < 1 || seq % shape.timesteps_per_entry != 0)
    fail_argument("WanForwardShape timesteps_per_entry", detail::concat("a divisor of the ", seq, " tokens"), shape.timesteps_per_entry);
  const int64_t groups = conditioning_groups(shape, rows), group_rows = rows / groups;
  const float eps = static_cast<float>(c.eps);
  // Offloaded blocks: one forward at a time moves blocks through the slots; the first blocks are
  // copied while the embeddings run.
  std::unique_lock<std::mutex> offload_lock;
  if (offload_) {
    // The copies run on the offload's own stream and are ordered by events across forwards: a
    // graph captured once would replay one forward's copies against another's slots.
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    check_cuda(cudaStreamIsCapturing(stream, &capturing), "cudaStreamIsCapturing");
    if (capturing != cudaStreamCaptureStatusNone)
      fail_argument("ctx.stream", "not capturing a CUDA graph (a model with offloaded blocks runs eagerly)", "a capture in progress");
    offload_lock = std::unique_lock<std::mutex>(offload_->mutex());
    for (int64_t block = 0; block < std::min<int64_t>(WanBlockOffload::kSlots, c.num_layers); ++block) offload_->prefetch(block);
  }

  // Activations come from the caller's workspace (grown once per shape), else from one of this call's own.
  Workspace call_workspace(device_);
  Workspace& workspace = ctx.workspace != nullptr ? *ctx.workspace : call_workspace;
  if (workspace.device() != device_)
    fail_argument("ctx.workspace device", device_.str(), workspace.device().str());
  // Attention runs on the part after the activations, a suffix that cannot grow: room for what
  // every layer's attention reserves at this step (the block schedule of sparse kernels, the
  // permuted copies of token-permuted patterns) is made here, before slicing.
  const AttentionShape self_shape{batch, heads, heads, head_dim, seq, seq, DType::kBF16, device_};
  // FP8 self-attention (WanAttentionOptions::precision, checked at construction: dense, one
  // process): the RMSNorm + RoPE kernel writes q and k's e4m3 operands where the attention reads them.
  const bool fp8_self_attention = shape.self_attention_precision == AttentionPrecision::kFp8;
  if (fp8_self_attention && (sp != nullptr || !self_attention.empty()))
    fail_argument("WanForwardShape::self_attention_precision", "fp8 with dense self-attention in one process", "a sparse or sharded one");
  const AttentionDims self_dims{batch, seq, seq, heads, heads, head_dim, shape.self_attention_precision};
  size_t attention_bytes = std::max(
      attention_workspace_bytes(ctx, device_, self_dims),
      attention_workspace_bytes(ctx, device_, AttentionDims{batch, seq, text_len, heads, heads, head_dim}));
  if (image_len > 0)
    attention_bytes = std::max(attention_bytes,
                               attention_workspace_bytes(ctx, device_, AttentionDims{batch, seq, image_len, heads, heads, head_dim}));
  for (size_t layer = 0; layer < self_attention.size(); ++layer) {
    StepInfo layer_step = step;
    layer_step.layer = static_cast<int64_t>(layer);
    attention_bytes = std::max(attention_bytes, self_attention[layer]->workspace_bytes(ctx, layer_step, self_shape));
  }
  if (sp) {
    // The shards' kernels (the whole sequence for fewer heads, or ring chunks) with the blocks'
    // masks: within what the padded sequence needs.
    const int64_t padded = std::max(seq, sp->shards() * tokens);
    const AttentionDims padded_dims{batch, padded, padded, heads, heads, head_dim};
    attention_bytes = std::max(attention_bytes, attention_workspace_bytes(ctx, device_, padded_dims, sp->mask_block_kv()));
  }
  workspace.reserve(workspace_slice_bytes(workspace_bytes(shape)) + attention_bytes);
  WorkspaceSlicer slicer(workspace);
  SliceTaker taker(&slicer);
  const Activations a = take_activations(taker, c, shape, precision_ == WanWeightPrecision::kFp8);
  Workspace attention_workspace = slicer.rest();
  const ExecContext attention_ctx = ctx.with_workspace(&attention_workspace);
  const Fp8QueryKey fp8_query_key = fp8_self_attention ? fp8_attention_query_key(attention_ctx, device_, self_dims) : Fp8QueryKey{};

  const auto w = [&](const std::string& name) { return weight(name); };
  if (lora_bank != nullptr && shape.lora_rank < lora_bank->max_rank())
    fail_argument("WanForwardShape::lora_rank", detail::concat("at least the bank's largest rank ", lora_bank->max_rank()), shape.lora_rank);
  std::vector<LoraSegment> lora_segments;
  // The adapters' pairs on this layer when an adapter of the batch changes it, else null.
  const auto lora_pairs = [&](const std::string& name) -> const std::vector<WanLoraBank::Pair>* {
    return lora_bank == nullptr || lora_runs.empty() ? nullptr : lora_bank->pairs(name);
  };
  // After a layer's GEMM: each run's rows get y += s B (A x) (a shrink and an in-place expand GEMM
  // per run of entries), then the GELU-tanh the GEMM's epilogue left out (`gelu_after`).
  const auto add_lora = [&](const std::vector<WanLoraBank::Pair>& pairs, const void* x, DType input, int64_t m, int64_t k, int64_t n,
                            void* y, DType output, bool gelu_after) {
    const int64_t rows_per_entry = m / batch;
    lora_segments.clear();
    for (const LoraRun& run : lora_runs) {
      const WanLoraBank::Pair& pair = pairs[static_cast<size_t>(run.adapter)];
      if (pair.rank == 0) continue;
      lora_segments.push_back(LoraSegment{run.first_entry * rows_per_entry, run.entries * rows_per_entry,
                                          static_cast<const bf16*>(pair.down.data()), static_cast<const bf16*>(pair.up.data()),
                                          pair.rank, pair.scale});
    }
    add_lora_segments(gemm_, lora_segments, LoraLayer{x, input, k, y, output, n},
                      LoraScratch{a.lora_shrunk, shape.lora_rank, a.lora_input, a.gemm_scratch}, stream);
    if (gelu_after) launch_gelu_tanh_bf16(static_cast<bf16*>(y), m * n, stream);
  };
  // y (m, n) = x W^T + b through cuBLASLt, then the batch's adapters on this layer (before the
  // GELU-tanh an epilogue would otherwise have fused).
  const auto linear = [&](const std::string& name, const void* x, int64_t m, int64_t k, int64_t n, void* y,
                          DType input = DType::kBF16, DType output = DType::kBF16, GemmEpilogue epilogue = GemmEpilogue::kBias) {
    const std::vector<WanLoraBank::Pair>* pairs = lora_pairs(name);
    const bool gelu_after = pairs != nullptr && epilogue == GemmEpilogue::kBiasGeluTanh;
    gemm_.linear(GemmShape{m, n, k, input, output, gelu_after ? GemmEpilogue::kBias : epilogue}, x, w(name + ".weight"),
                 w(name + ".bias"), y, a.gemm_scratch, stream);
    if (pairs != nullptr) add_lora(*pairs, x, input, m, k, n, y, output, gelu_after);
  };
  const auto f32 = [&](const std::string& name) { return static_cast<const float*>(weight(name)); };
  // The blocks' linear layers: bf16 GEMMs, or with fp8 weights FP8 GEMMs over `input`'s e4m3 rows,
  // quantised by quantize_input before the GEMMs that read them.
  const bool fp8 = precision_ == WanWeightPrecision::kFp8;
  struct Fp8Rows {
    const uint8_t* values = nullptr;
    const float* scales = nullptr;
  };
  const auto quantize_input = [&](const bf16* x, int64_t m, int64_t k, uint8_t* values, float* scales) {
    if (fp8) tessel::cuda::launch_quantize_rows_fp8(x, DType::kBF16, m, k, values, scales, stream);
    return Fp8Rows{values, scales};
  };
  // A LayerNorm whose output feeds block GEMMs quantises it too (fused), into the input rows.
  const Fp8Rows normed_fp8{a.input_fp8, a.input_scales};
  const auto feeding_gemms = [&](RowNormOutput output) {
    if (fp8) {
      output.fp8 = a.input_fp8;
      output.fp8_scales = a.input_scales;
    }
    return output;
  };
  const auto block_linear = [&](const std::string& name, const bf16* x, const Fp8Rows& input, int64_t m, int64_t k, int64_t n,
                                bf16* y, GemmEpilogue epilogue = GemmEpilogue::kBias) {
    if (!fp8) {
      linear(name, x, m, k, n, y, DType::kBF16, DType::kBF16, epilogue);
      return;
    }
    // Per-request adapters read the layer's bf16 input rows (the norms write them beside the e4m3 ones).
    const std::vector<WanLoraBank::Pair>* pairs = lora_pairs(name);
    const bool gelu_after = pairs != nullptr && epilogue == GemmEpilogue::kBiasGeluTanh;
    GemmShape gemm_shape{m, n, k, DType::kBF16, DType::kBF16, gelu_after ? GemmEpilogue::kBias : epilogue};
    gemm_shape.fp8_row_scaled = true;
    gemm_.linear_fp8(gemm_shape, input.values, input.scales, static_cast<const uint8_t*>(w(name + ".weight")),
                     f32(name + ".weight_scale"), w(name + ".bias"), y, a.gemm_scratch, stream);
    if (pairs != nullptr) add_lora(*pairs, x, DType::kBF16, m, k, n, y, DType::kBF16, gelu_after);
  };
  const auto bshd = [&](bf16* data, int64_t length) {
    return TensorView(data, DType::kBF16, device_, {batch, length, heads, head_dim});
  };
  EventTimeline timeline(profile, stream);

  // Patchify, the timestep sinusoid, the rotary tables of this grid.
  const int64_t patch_len = c.in_channels * c.patch_volume();
  launch_patchify(latents, sp ? a.all_patches : a.patches, batch, c.in_channels, shape.frames, shape.height, shape.width, pt, ph, pw,
                  stream);
  const float* group_timesteps = timestep;
  if (sp) {
    sp->take_rows(ctx, a.all_patches, DType::kBF16, patch_len, a.patches);
    if (shape.timesteps_per_entry > 1) {
      const float* token_timesteps = timestep;
      if (shape.timesteps_per_entry < seq) {  // one per frame: repeated over the frame's tokens first
        launch_repeat_values(timestep, batch * shape.timesteps_per_entry, seq / shape.timesteps_per_entry, a.token_timestep, stream);
        token_timesteps = a.token_timestep;
      }
      sp->take_rows(ctx, token_timesteps, 1, a.shard_timestep);
      group_timesteps = a.shard_timestep;
    }
  }
  launch_sinusoidal_embedding(group_timesteps, groups, c.freq_dim, a.sinusoid, stream);
  launch_wan_rope_tables(grid[0], grid[1], grid[2], head_dim, a.rope_cos, a.rope_sin, stream);
  const int64_t half = head_dim / 2;
  if (sp && sp->shards() * tokens > seq) {
    const size_t tail = static_cast<size_t>(sp->shards() * tokens - seq) * half * sizeof(float);
    check_cuda(cudaMemsetAsync(a.rope_cos + seq * half, 0, tail, stream), "cudaMemsetAsync (rotary padding)");
    check_cuda(cudaMemsetAsync(a.rope_sin + seq * half, 0, tail, stream), "cudaMemsetAsync (rotary padding)");
  }
  const float *rope_cos = a.rope_cos + first_token * half, *rope_sin = a.rope_sin + first_token * half;
  launch_convert_to_bf16(text, a.text, text_rows * c.text_dim, stream);
  timeline.charge(&WanForwardProfile::other_s);

  // Patch embedding into the fp32 residual stream; the conditioning in fp32; the text MLP in bf16.
  linear("patch_embedding", a.patches, rows, patch_len, dim, a.hidden, DType::kBF16, DType::kF32);
  linear("condition_embedder.time_embedder.linear_1", a.sinusoid, groups, c.freq_dim, dim, a.time_hidden, DType::kF32, DType::kF32);
  launch_silu(a.time_hidden, a.time_hidden, groups * dim, stream);
  linear("condition_embedder.time_embedder.linear_2", a.time_hidden, groups, dim, dim, a.temb, DType::kF32, DType::kF32);
  launch_silu(a.temb, a.temb_act, groups * dim, stream);
  linear("condition_embedder.time_proj", a.temb_act, groups, dim, 6 * dim, a.modulation_input, DType::kF32, DType::kF32);
  linear("condition_embedder.text_embedder.linear_1", a.text, text_rows, c.text_dim, dim, a.text_hidden, DType::kBF16, DType::kBF16,
         GemmEpilogue::kBiasGeluTanh);
  linear("condition_embedder.text_embedder.linear_2", a.text_hidden, text_rows, dim, dim, a.context);
  // Every block's cross-attention k and v read the same context: quantised once.
  const Fp8Rows context_fp8 = quantize_input(a.context, text_rows, dim, a.context_fp8, a.context_scales);
  timeline.charge(&WanForwardProfile::gemm_s);
  if (image_len > 0) {
    // The image embedder: (+ FLF2V's position table), FP32 LayerNorm, linear, exact GELU, linear,
    // FP32 LayerNorm (PyTorch's default eps, not the config's).
    constexpr float kImageNormEps = 1e-5f;
    const std::string embedder = "condition_embedder.image_embedder.";
    const float* features = image;
    if (c.pos_embed_seq_len > 0) {
      launch_add_periodic_rows(image, f32(embedder + "pos_embed"), image_rows, c.image_dim, c.pos_embed_seq_len, a.image_positioned,
                               stream);
      features = a.image_positioned;
    }
    launch_layer_norm(features, a.image_normed, image_rows, c.image_dim, image_rows, kImageNormEps,
                      RowNormOutput{{}, {}, f32(embedder + "norm1.weight"), f32(embedder + "norm1.bias")}, stream);
    timeline.charge(&WanForwardProfile::norm_rope_s);
    linear(embedder + "ff.net.0.proj", a.image_normed, image_rows, c.image_dim, c.image_dim, a.image_ff, DType::kBF16, DType::kF32);
    timeline.charge(&WanForwardProfile::gemm_s);
    launch_gelu_to_bf16(a.image_ff, a.image_normed, image_rows * c.image_dim, stream);
    timeline.charge(&WanForwardProfile::other_s);
    linear(embedder + "ff.net.2", a.image_normed, image_rows, c.image_dim, dim, a.image_embedded, DType::kBF16, DType::kF32);
    timeline.charge(&WanForwardProfile::gemm_s);
    launch_layer_norm(a.image_embedded, a.image_context, image_rows, dim, image_rows, kImageNormEps,
                      RowNormOutput{{}, {}, f32(embedder + "norm2.weight"), f32(embedder + "norm2.bias")}, stream);
    timeline.charge(&WanForwardProfile::norm_rope_s);
  }

  // A step cache stands in for its span [span_first, span_last) of the blocks when it says so,
  // deciding on the host from the conditioning (copied down once) and from the device's hidden
  // states against the patch embeddings, kept here until its hook has seen them.
  const int64_t span_first = block_cache ? block_cache->leading_blocks() : 0;
  const int64_t span_last = block_cache ? c.num_layers - block_cache->trailing_blocks() : c.num_layers;
  if (block_cache && (span_first < 0 || span_last > c.num_layers || span_first > span_last))
    fail_argument("block_cache leading and trailing blocks", detail::concat("two counts >= 0 summing to at most num_layers = ", c.num_layers),
                  detail::concat(span_first, " and ", c.num_layers - span_last));
  if (block_cache && !shape.block_cache) fail_argument("WanForwardShape::block_cache", "true with a block cache", "false");
  std::vector<float> host_temb, host_projection;
  WanBlockCacheInput cache_input{&step, batch, rows / batch, dim};
  cache_input.sequence_sharded = sequence_parallel != nullptr;
  cache_input.device = device_;
  cache_input.stream = ctx.stream;
  if (block_cache) {
    check_cuda(cudaMemcpyAsync(a.blocks_input, a.hidden, static_cast<size_t>(rows * dim) * sizeof(float), cudaMemcpyDeviceToDevice, stream),
               "embeddings copy");
    cache_input.embeddings = a.blocks_input;
    timeline.charge(&WanForwardProfile::other_s);
  }
  const auto begin_span = [&] {
    host_temb.resize(static_cast<size_t>(groups * dim));
    host_projection.resize(static_cast<size_t>(groups * 6 * dim));
    check_cuda(cudaMemcpyAsync(host_temb.data(), a.temb, host_temb.size() * sizeof(float), cudaMemcpyDeviceToHost, stream), "temb download");
    check_cuda(cudaMemcpyAsync(host_projection.data(), a.modulation_input, host_projection.size() * sizeof(float), cudaMemcpyDeviceToHost,
                               stream),
               "time projection download");
    check_cuda(cudaStreamSynchronize(stream), "step cache conditioning");
    cache_input.time_embedding = host_temb.data();
    cache_input.time_projection = host_projection.data();
    const bool run = block_cache->before_blocks(cache_input, a.hidden);
    // The buffer now takes the span's input (with no leading blocks the embeddings are that input).
    cache_input.embeddings = nullptr;
    if (run && span_first > 0)
      check_cuda(cudaMemcpyAsync(a.blocks_input, a.hidden, static_cast<size_t>(rows * dim) * sizeof(float), cudaMemcpyDeviceToDevice, stream),
                 "span input copy");
    timeline.charge(&WanForwardProfile::other_s);
    return run;
  };
  bool run_span = true;
  for (int64_t layer = 0; layer < c.num_layers; ++layer) {
    if (block_cache && layer == span_first) run_span = begin_span();
    if (block_cache && layer == span_last && run_span) block_cache->after_blocks(cache_input, a.blocks_input, a.hidden);
    if (!run_span && layer >= span_first && layer < span_last) continue;
    if (offload_) offload_->acquire(layer, stream);
    const auto block = [&](const std::string& name) { return wan_block_tensor(layer, name); };
    // modulation chunk i of this block: table row i + the time projection's chunk i.
    const float* table = f32(block("scale_shift_table"));
    const auto modulation = [&](int64_t chunk) {
      return ModulationVector{table + chunk * dim, a.modulation_input + chunk * dim, 6 * dim};
    };

    // Self-attention: AdaLN, q/k/v, RMSNorm + RoPE on q and k, attention, output projection, gated residual.
    launch_layer_norm(a.hidden, a.normed, rows, dim, group_rows, eps, feeding_gemms(RowNormOutput{modulation(0), modulation(1)}), stream);
    timeline.charge(&WanForwardProfile::norm_rope_s);
    block_linear(block("attn1.to_q"), a.normed, normed_fp8, rows, dim, dim, a.q);
    block_linear(block("attn1.to_k"), a.normed, normed_fp8, rows, dim, dim, a.k);
    block_linear(block("attn1.to_v"), a.normed, normed_fp8, rows, dim, dim, a.v);
    timeline.charge(&WanForwardProfile::gemm_s);
    if (fp8_self_attention) {
      // Nothing else reads the bf16 q and k: only their e4m3 copies are stored.
      launch_rms_norm_rope_fp8(a.q, batch, tokens, heads, head_dim, eps, f32(block("attn1.norm_q.weight")), rope_cos, rope_sin, false,
                               {fp8_query_key.q, fp8_query_key.q_scales}, stream);
      launch_rms_norm_rope_fp8(a.k, batch, tokens, heads, head_dim, eps, f32(block("attn1.norm_k.weight")), rope_cos, rope_sin, false,
                               {fp8_query_key.k, fp8_query_key.k_scales}, stream);
    } else {
      launch_rms_norm_rope(a.q, rows, tokens, heads, head_dim, eps, f32(block("attn1.norm_q.weight")), rope_cos, rope_sin, stream);
      launch_rms_norm_rope(a.k, rows, tokens, heads, head_dim, eps, f32(block("attn1.norm_k.weight")), rope_cos, rope_sin, stream);
    }
    timeline.charge(&WanForwardProfile::norm_rope_s);
    AttentionStepReport report;
    if (fp8_self_attention) {
      AttentionOptions options;
      options.precision = AttentionPrecision::kFp8;
      options.fp8_query_key_given = true;
      attention_forward(attention_ctx, bshd(a.q, seq), bshd(a.k, seq), bshd(a.v, seq), bshd(a.attended, seq), TensorView{}, options);
    } else if (sp) {
      StepInfo layer_step = step;
      layer_step.layer = layer;
      report = sp->attend(attention_ctx, self_attention.empty() ? nullptr : self_attention[static_cast<size_t>(layer)].get(),
                          layer_step, a.q, a.k, a.v, a.attended);
    } else if (self_attention.empty()) {
      attention_forward(attention_ctx, bshd(a.q, seq), bshd(a.k, seq), bshd(a.v, seq), bshd(a.attended, seq), TensorView{});
    } else {
      StepInfo layer_step = step;
      layer_step.layer = layer;
      report = self_attention[static_cast<size_t>(layer)]->forward(attention_ctx, layer_step, bshd(a.q, seq), bshd(a.k, seq),
                                                                   bshd(a.v, seq), bshd(a.attended, seq));
    }
    if (profile) profile->add_self_attention(report);
    timeline.charge(&WanForwardProfile::attention_s);
    block_linear(block("attn1.to_out.0"), a.attended, quantize_input(a.attended, rows, dim, a.input_fp8, a.input_scales), rows, dim,
                 dim, a.projected());
    timeline.charge(&WanForwardProfile::gemm_s);
    launch_gated_residual(a.hidden, a.projected(), rows, dim, group_rows, modulation(2), stream);
    timeline.charge(&WanForwardProfile::other_s);

    // Cross-attention to the text: LayerNorm (affine with cross_attn_norm), RMSNorm on q and k, plain residual.
    RowNormOutput cross_norm;
    if (c.cross_attn_norm) {
      cross_norm.weight = f32(block("norm2.weight"));
      cross_norm.bias = f32(block("norm2.bias"));
      launch_layer_norm(a.hidden, a.normed, rows, dim, group_rows, eps, feeding_gemms(cross_norm), stream);
    } else {
      launch_convert_to_bf16(a.hidden, a.normed, rows * dim, stream);
      quantize_input(a.normed, rows, dim, a.input_fp8, a.input_scales);
    }
    timeline.charge(&WanForwardProfile::norm_rope_s);
    block_linear(block("attn2.to_q"), a.normed, normed_fp8, rows, dim, dim, a.q);
    block_linear(block("attn2.to_k"), a.context, context_fp8, text_rows, dim, dim, a.text_k);
    block_linear(block("attn2.to_v"), a.context, context_fp8, text_rows, dim, dim, a.text_v);
    timeline.charge(&WanForwardProfile::gemm_s);
    launch_rms_norm_rope(a.q, rows, tokens, heads, head_dim, eps, f32(block("attn2.norm_q.weight")), nullptr, nullptr, stream);
    launch_rms_norm_rope(a.text_k, text_rows, text_len, heads, head_dim, eps, f32(block("attn2.norm_k.weight")), nullptr, nullptr,
                         stream);
    timeline.charge(&WanForwardProfile::norm_rope_s);
    attention_forward(attention_ctx, bshd(a.q, tokens), bshd(a.text_k, text_len), bshd(a.text_v, text_len), bshd(a.attended, tokens),
                      TensorView{});
    timeline.charge(&WanForwardProfile::attention_s);
    if (image_len > 0) {
      // The same queries over the image tokens; the two outputs summed before the output projection.
      linear(block("attn2.add_k_proj"), a.image_context, image_rows, c.added_kv_proj_dim, dim, a.image_k);
      linear(block("attn2.add_v_proj"), a.image_context, image_rows, c.added_kv_proj_dim, dim, a.image_v);
      timeline.charge(&WanForwardProfile::gemm_s);
      launch_rms_norm_rope(a.image_k, image_rows, image_len, heads, head_dim, eps, f32(block("attn2.norm_added_k.weight")), nullptr,
                           nullptr, stream);
      timeline.charge(&WanForwardProfile::norm_rope_s);
      attention_forward(attention_ctx, bshd(a.q, tokens), bshd(a.image_k, image_len), bshd(a.image_v, image_len),
                        bshd(a.image_attended(), tokens), TensorView{});
      timeline.charge(&WanForwardProfile::attention_s);
      launch_add_bf16(a.attended, a.image_attended(), rows * dim, stream);
      timeline.charge(&WanForwardProfile::other_s);
    }
    block_linear(block("attn2.to_out.0"), a.attended, quantize_input(a.attended, rows, dim, a.input_fp8, a.input_scales), rows, dim,
                 dim, a.projected());
    timeline.charge(&WanForwardProfile::gemm_s);
    launch_gated_residual(a.hidden, a.projected(), rows, dim, group_rows, ModulationVector{}, stream);
    timeline.charge(&WanForwardProfile::other_s);

    // Feed-forward: AdaLN, linear with GELU-tanh in the epilogue, linear, gated residual.
    launch_layer_norm(a.hidden, a.normed, rows, dim, group_rows, eps, feeding_gemms(RowNormOutput{modulation(3), modulation(4)}), stream);
    timeline.charge(&WanForwardProfile::norm_rope_s);
    block_linear(block("ffn.net.0.proj"), a.normed, normed_fp8, rows, dim, c.ffn_dim, a.ffn_hidden, GemmEpilogue::kBiasGeluTanh);
    block_linear(block("ffn.net.2"), a.ffn_hidden, quantize_input(a.ffn_hidden, rows, c.ffn_dim, a.input_fp8, a.input_scales), rows,
                 c.ffn_dim, dim, a.projected());
    timeline.charge(&WanForwardProfile::gemm_s);
    launch_gated_residual(a.hidden, a.projected(), rows, dim, group_rows, modulation(5), stream);
    timeline.charge(&WanForwardProfile::other_s);
    if (offload_) offload_->release(layer, stream, layer + WanBlockOffload::kSlots);
  }

  // A span that reaches the last block (or is empty there) ends after the loop.
  if (block_cache && span_first == c.num_layers) run_span = begin_span();
  if (block_cache && span_last == c.num_layers && run_span) block_cache->after_blocks(cache_input, a.blocks_input, a.hidden);

  // Output: AdaLN whose shift and scale are the table's rows plus temb itself, the projection to
  // patches in fp32, unpatchify.
  const float* out_table = f32("scale_shift_table");
  const RowNormOutput out_norm{ModulationVector{out_table, a.temb, dim}, ModulationVector{out_table + dim, a.temb, dim}};
  launch_layer_norm(a.hidden, a.normed, rows, dim, group_rows, eps, out_norm, stream);
  timeline.charge(&WanForwardProfile::norm_rope_s);
  linear("proj_out", a.normed, rows, dim, c.out_channels * c.patch_volume(), a.out_patches, DType::kBF16, DType::kF32);
  timeline.charge(&WanForwardProfile::gemm_s);
  if (sp) sp->gather_rows(ctx, a.out_patches, DType::kF32, c.out_channels * c.patch_volume(), a.all_out_patches);
  launch_unpatchify(sp ? a.all_out_patches : a.out_patches, out, batch, c.out_channels, shape.frames, shape.height, shape.width, pt, ph, pw, stream);
  timeline.charge(&WanForwardProfile::other_s);
  tessel::cuda::check_launch("Wan CUDA forward");
  timeline.finish();
  if (profile) ++profile->forwards;
}

}  // namespace tessel::dit::cuda
