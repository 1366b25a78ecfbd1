// The Wan 2.x video transformer (diffusers' WanTransformer3DModel, text-to-video and Wan 2.1
// I2V's image branch) on tessel's ops,
// with tessel's SparseAttention module in every self-attention.
//
// One forward is one denoising step of the transformer:
//   latents (B, C_in, F, H, W) --patch embedding (the Conv3d as a GEMM)--> tokens (B, S, dim),
//   S = F/p_t * H/p_h * W/p_w, ordered frame-major as diffusers flattens them;
//   timestep (B) --sinusoid, MLP--> temb; SiLU, linear --> the 6-way modulation per block;
//   text (B, L, text_dim) --MLP with GELU-tanh--> (B, L, dim);
//   each block: AdaLN (non-affine LayerNorm, shift/scale) -> self-attention (QKV, RMSNorm across
//   heads on q and k, 3-D RoPE over frames/height/width, attention, output projection) ->
//   gated residual; LayerNorm (affine when cross_attn_norm) -> cross-attention to the text
//   (RMSNorm on q and k, dense) -> residual; AdaLN -> FFN (GELU-tanh) -> gated residual;
//   then the output AdaLN from temb, the projection to patches, and unpatchify to
//   (B, C_out, F, H, W).
// Batch 2 carries classifier-free guidance's conditional and unconditional branches in one call.
//
// A model lives on one device, chosen at construction:
//   CPU: fp32 compute; the weights are converted to fp32 (and linear weights transposed) once. A
//     forward allocates its activations; the attention kernels take their scratch from
//     ctx.workspace (grown to what the shapes need), or from one workspace of the call's own.
//   CUDA (builds with CUDA): bf16 weights and GEMMs (cuBLASLt, fp32 accumulation), the residual
//     stream and the timestep conditioning in fp32 (and the image embedder's norms and GELU),
//     fused norm / modulation / RoPE / gated-residual kernels, tessel's attention kernels. Every activation is a slice of ctx.workspace, grown on
//     the first forward of a shape (workspace_bytes() tells how much): later forwards allocate
//     nothing and do not wait for the device, all work on ctx.stream. Inputs and output stay fp32
//     device tensors.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tessel/core/exec_context.h"
#include "tessel/core/tensor.h"
#include "tessel/dit/wan_config.h"
#include "tessel/kernels/attention.h"
#include "tessel/parallel/parallel_config.h"
#include "tessel/parallel/phase_timeline.h"
#include "tessel/sparse/backend.h"
#include "tessel/sparse/config.h"
#include "tessel/sparse/sparse_attention.h"

namespace tessel {

class WanLora;
struct WanLoraSelection;

class BackendRegistry;

// How the self-attention of every block runs.
struct WanAttentionOptions {
  // Null: dense attention in every block, no backend resolution. Otherwise each block gets a
  // SparseAttention module that resolves its backend here (override > config > auto > none).
  BackendRegistry* registry = nullptr;
  SparseAttnConfig config;
  // Blocks whose attention is configured apart (block index -> its whole config); the others
  // use `config`. An index outside [0, num_layers) is an Error at construction.
  std::map<int64_t, SparseAttnConfig> layer_configs;
  std::string backend_override;  // the app passes its environment's backend override here
  std::shared_ptr<PlanCache> plan_cache;  // null: one cache shared by this model's blocks
  // Sequence parallelism (not owned; outlives the model). Null, or a sequence-parallel degree of 1:
  // this process runs every token. Otherwise each forward is collective over parallel->sequence:
  // every rank passes the same whole inputs, runs the blocks on its shard of the tokens (the
  // self-attention through ParallelAttention: Ulysses, Ring or USP by the degrees) and gets the
  // whole output. CFG-parallel is the pipeline's (WanPipeline).
  const ParallelGroups* parallel = nullptr;
  // What the self-attention's matrix products run in: kInput (the model's dtype: bf16 on CUDA) or
  // kFp8 (tessel/kernels/attention.h: e4m3 q, k, v and P with fp32 accumulation, about 5 % relative
  // L2 error on the attention output, docs/dit.md gives the block's). kFp8 needs a CUDA device of
  // compute capability 9.0 in a build with sm_90a code, head dim 128, dense self-attention (no
  // registry) and no sequence parallelism; anything else is an Error naming this field at
  // construction, before any weight loads. q and k are quantized by the RMSNorm + RoPE that makes
  // them (no pass reads them again), v by the attention; the cross-attention stays in bf16.
  AttentionPrecision precision = AttentionPrecision::kInput;
};

// Seconds spent per kind of work, summed over forwards (for benchmarks).
struct WanForwardProfile {
  double attention_s = 0.0;   // self- and cross-attention kernels
  double estimation_s = 0.0;  // sparse mask estimation inside the self-attention calls
  double gemm_s = 0.0;       // every linear layer and the patch embedding
  double norm_rope_s = 0.0;  // LayerNorm / AdaLN, RMSNorm, rotary embedding
  double other_s = 0.0;      // activations, residuals, embeddings, patchify
  int64_t forwards = 0;
  // Self-attention calls and the sum of their densities (blocks computed / all blocks; 1 for a
  // dense call), and how many of them ran dense (no backend, warm-up, or density 1).
  int64_t self_attention_calls = 0;
  int64_t dense_self_attention_calls = 0;
  double self_attention_density_sum = 0.0;
  double mean_self_attention_density() const {
    return self_attention_calls ? self_attention_density_sum / static_cast<double>(self_attention_calls) : 1.0;
  }
  double total_s() const { return attention_s + estimation_s + gemm_s + norm_rope_s + other_s; }
  // Counts one self-attention call (charged to attention_s by the caller's clock) and moves its
  // estimation time from attention_s to estimation_s. On CUDA a call reports the estimation time
  // of the previous call of the same plan (device events are read without waiting), so the sum
  // over a forward is exact but for the last call.
  void add_self_attention(const AttentionStepReport& report);
};

// What a forward shows a step cache (TeaCache, DBCache) before the blocks it may skip. Row b of the
// batch is CFG branch b when the pipeline batches the branches (0 conditional, 1 unconditional).
struct WanBlockCacheInput {
  const StepInfo* step = nullptr;  // the forward's step
  int64_t batch = 0;
  int64_t tokens = 0;  // rows per batch entry in `hidden`: the patches (this rank's shard under sequence parallelism)
  int64_t dim = 0;     // the transformer's inner width
  const float* time_embedding = nullptr;    // (batch, dim): temb, before the SiLU
  const float* time_projection = nullptr;   // (batch, 6 * dim): what every block's modulation adds
  // (batch, tokens, dim): the patch embeddings block 0 got, where `hidden` lives. A CUDA forward
  // keeps them in the buffer that later holds the span's input: they are valid in before_blocks
  // only (null in after_blocks).
  const float* embeddings = nullptr;
  bool sequence_sharded = false;            // `tokens` is one rank's shard of the sequence
  // Where `hidden`, `embeddings` and `blocks_input` live, and the forward's stream for device work.
  // The conditioning vectors are host memory on every device (a CUDA forward copies them down, a
  // few kilobytes, and waits for them).
  Device device = Device::cpu();
  StreamHandle stream = nullptr;
};

// A hook that may skip a span of the transformer blocks of a forward by reusing a residual it keeps.
// The span is [leading_blocks(), num_layers - trailing_blocks()): the blocks before it always run
// first (their output is what the hook judges, as DBCache does), those after it always run last.
// TeaCache's span is every block. It holds its own state across forwards.
class WanBlockCache {
 public:
  virtual ~WanBlockCache() = default;
  virtual int64_t leading_blocks() const { return 0; }
  virtual int64_t trailing_blocks() const { return 0; }
  // Before the span; `hidden` (batch, tokens, dim) holds what the leading blocks made of the
  // embeddings. Returns true to run the span, or false after writing into `hidden` what stands in
  // for its output.
  virtual bool before_blocks(const WanBlockCacheInput& input, float* hidden) = 0;
  // After the span ran: `blocks_input` is what entered it, `hidden` what came out.
  virtual void after_blocks(const WanBlockCacheInput& input, const float* blocks_input, const float* hidden) = 0;
  // Whether the hooks take hidden states in `device`'s memory (hooks that loop over them on the
  // host take only the CPU's); a forward on another device refuses the cache with an Error.
  virtual bool handles_device(Device device) const { return device.is_cpu(); }
};

// The spatial layout sparse patterns with a geometry (radial, spatial_aware, local, ...) need for a
// latent of (frames, height, width): the patch grid in frames, latent pixels and patch size.
// Throws Error when the patch is not square in height and width, or the latent is not a multiple
// of the patch.
SpatialLayout wan_spatial_layout(const WanConfig& config, int64_t latent_frames, int64_t latent_height, int64_t latent_width);

// Where a CUDA transformer keeps its blocks' weights. kOffloadBlocks: in pinned host memory, each
// block copied into one of two device slots ahead of its use on a copy stream of the model's own
// (block i + 2 is copied while block i + 1 computes), so the device holds two blocks instead of
// all of them (Wan 14B: 1.4 GB instead of 28 GB). The same bytes reach the same kernels: outputs
// are bit-equal to kDevice's. The CPU model takes kDevice only.
enum class WanWeightResidency : uint8_t { kDevice, kOffloadBlocks };

// The precision of a CUDA transformer's block linear weights (self- and cross-attention q/k/v/out,
// the FFN: wan_fp8_weight). kFp8: quantised at load to float8 e4m3 with one fp32 scale per
// output channel (absmax / 448), a byte per weight instead of two (Wan 14B's blocks: 14 GB instead
// of 28); each GEMM quantises its activation rows (tokens) on the fly the same way and runs on the
// FP8 tensor cores with fp32 accumulation (tessel/kernels/cuda/cublaslt_gemm.h, linear_fp8). The
// embeddings, norms, modulation and output projection stay as with kBf16. Outputs differ from
// kBf16's by e4m3's rounding (docs/dit.md gives the measured error). Works with either residency
// (offloaded blocks move the fp8 bytes). The CPU model takes kBf16 only (it keeps fp32 weights).
enum class WanWeightPrecision : uint8_t { kBf16, kFp8 };

class WanTransformer {
 public:
  // `weights` holds exactly the tensors of wan_weight_specs(config) (any float dtype, on the CPU;
  // converted to the device's dtypes here). Throws Error naming a missing, mis-shaped or
  // unexpected tensor, or a device this build cannot run (CUDA without CUDA).
  WanTransformer(WanConfig config, const std::map<std::string, Tensor>& weights, const WanAttentionOptions& attention = {},
                 Device device = Device::cpu());
  ~WanTransformer();
  WanTransformer(WanTransformer&&) noexcept;
  WanTransformer& operator=(WanTransformer&&) noexcept;

  // Reads config.json and the (sharded) safetensors of a diffusers checkpoint directory.
  // On CUDA the tensors go from the mapped shards to the device one at a time. `lora`, when given
  // (loaded for this checkpoint's config), is merged into the tensors it changes on the way, in fp32
  // before they take their device dtype (so before FP8 quantisation). `weights_file`, when not
  // empty, replaces the directory's weights (its config.json still gives the model): one
  // safetensors file in the original Wan names, bf16 / fp32 or with FP8 linear weights as ComfyUI
  // and LightX2V publish them (wan_transformer_file.h: formats and checks). With kFp8 its e4m3 block
  // linear weights are used as stored (a per-tensor scale repeated per output channel), with no
  // requantisation; every other e4m3 weight (kBf16, the CPU model, a LoRA's tensors) is dequantised
  // in fp32 and then takes the model's dtype.
  static WanTransformer load(const std::string& checkpoint_dir, const WanAttentionOptions& attention = {},
                             Device device = Device::cpu(), const WanLora* lora = nullptr,
                             WanWeightResidency residency = WanWeightResidency::kDevice,
                             WanWeightPrecision precision = WanWeightPrecision::kBf16, const std::string& weights_file = {});
  // Random weights at the scale of diffusers' initialization (for benchmarks), from `seed`. On
  // CUDA they are drawn on the device (another stream of numbers than the CPU's for one seed).
  static WanTransformer random(const WanConfig& config, uint64_t seed, const WanAttentionOptions& attention = {},
                               Device device = Device::cpu(), WanWeightResidency residency = WanWeightResidency::kDevice,
                               WanWeightPrecision precision = WanWeightPrecision::kBf16);

  // One transformer forward. latents (B, in_channels, F, H, W), timestep (B), (B, S) (one per
  // token, as diffusers' Wan 2.2 conditions a first frame) or (B, F / patch_t) (one per latent
  // frame of patches: the same conditioning for the frame's tokens, computed once per frame instead
  // of per token), text (B, L, text_dim) and out
  // (B, out_channels, F, H, W): fp32, contiguous, on the model's device; F, H, W multiples of the patch size
  // with at most rope_max_seq_len patches along each axis; a spatial layout in the attention
  // config must be wan_spatial_layout of this latent. `step` reaches every block's attention
  // with its layer index filled in (step.layer is ignored). Throws Error naming the argument for
  // any other shape, dtype or device. `profile`, when given, accumulates the time per kind of work.
  // `block_cache`, when given, is asked before the span of blocks it covers whether to run it (it
  // needs one timestep per batch entry: a (B, S) or per-frame timestep is an Error, and so are leading and
  // trailing blocks outside [0, num_layers]; a CUDA model takes only a cache whose hooks handle its
  // device, WanBlockCache::handles_device).
  // `lora`, when given, names an adapter of its bank (or none) per batch entry (wan_lora_bank.h):
  // after each linear layer an adapter changes, y += scale * B (A x) over the rows of the entries
  // that use it (CPU: fp32; CUDA: bf16 factors, one grouped shrink and one grouped expand launch
  // per layer for all the batch's adapters, the layer's GELU-tanh then applied after the sum
  // instead of in the GEMM's epilogue). The bank must be on the model's device and loaded for its
  // config; an entry's -1 means no adapter.
  void forward(const ExecContext& ctx, const StepInfo& step, const TensorView& latents, const TensorView& timestep,
               const TensorView& text, const TensorView& out, WanForwardProfile* profile = nullptr,
               WanBlockCache* block_cache = nullptr, const WanLoraSelection* lora = nullptr) const;
  // The same for a model with an image branch (config().has_image_branch(): Wan 2.1 I2V / FLF2V):
  // `image` (B, I, image_dim) fp32 on the model's device holds the CLIP features of the
  // conditioning image (I = 257 for ViT-H/14), FLF2V's first and last frames side by side
  // (I = pos_embed_seq_len). The cross-attention attends to them through its own keys and values
  // and adds the result to the text's, as diffusers' WanAttnProcessor. A model without the branch
  // takes an empty `image` only, and one with it refuses the overload above.
  void forward(const ExecContext& ctx, const StepInfo& step, const TensorView& latents, const TensorView& timestep,
               const TensorView& text, const TensorView& image, const TensorView& out, WanForwardProfile* profile = nullptr,
               WanBlockCache* block_cache = nullptr, const WanLoraSelection* lora = nullptr) const;

  // Benchmarks: under sequence parallelism, every block's self-attention marks its phases on
  // `timeline` (the all-to-alls, ring exchanges, attention, and "outside attention" for the rest:
  // wan_sequence_parallel.h), after the caller's begin(); null stops it. Not owned.
  void set_phase_timeline(PhaseTimeline* timeline) const;

  // This model's weights (shared, not copied: both models may run at once) with other
  // self-attention options, e.g. dense attention to compare a sparse configuration with.
  WanTransformer with_attention(const WanAttentionOptions& attention) const;

  // Bytes of ctx.workspace a forward of this shape takes on the model's device (CUDA: the
  // activations; CPU: the attention kernels' scratch). text_tokens = L; per_token_timestep: a
  // (B, S) or (B, F / patch_t) timestep; image_tokens = I for a model with an image branch;
  // lora_rank: the largest rank of per-request adapters (WanLoraBank::max_rank), 0 without.
  size_t workspace_bytes(const ExecContext& ctx, int64_t batch, int64_t latent_frames, int64_t latent_height, int64_t latent_width,
                         int64_t text_tokens, bool per_token_timestep = false, int64_t image_tokens = 0, int64_t lora_rank = 0) const;
  // Bytes the weights take on the model's device (with offloaded blocks: the resident tensors and
  // the two block slots), and the bytes of the blocks kept in pinned host memory (0 unless offloaded).
  size_t weight_bytes() const;
  size_t offloaded_weight_bytes() const;

  const WanConfig& config() const;
  Device device() const;
  // The self-attention module of each block (null entries when attention is dense without a registry).
  const SparseAttention* block_attention(int64_t layer) const;

 private:
  struct Impl;
  // A model whose weights `impl` already holds; adds the attention modules.
  WanTransformer(std::unique_ptr<Impl> impl, const WanAttentionOptions& attention);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessel
