// The Wan 2.x video transformer (diffusers' WanTransformer3DModel, text-to-video) on tessel's ops,
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
// Compute is fp32 on the CPU; the weights are converted to fp32 (and linear weights transposed)
// once, at construction. A forward allocates its activations; the attention kernels take their
// scratch from ctx.workspace (grown to what the shapes need), or from one workspace of the call's
// own when it has none.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tessel/core/exec_context.h"
#include "tessel/core/tensor.h"
#include "tessel/dit/wan_config.h"
#include "tessel/sparse/backend.h"
#include "tessel/sparse/config.h"
#include "tessel/sparse/sparse_attention.h"

namespace tessel {

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
};

// Seconds spent per kind of work, summed over forwards (for benchmarks).
struct WanForwardProfile {
  double attention_s = 0.0;  // self- and cross-attention kernels, mask estimation included
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
  double total_s() const { return attention_s + gemm_s + norm_rope_s + other_s; }
};

// What a forward shows a step cache (TeaCache) before the transformer blocks run. Row b of the batch
// is CFG branch b when the pipeline batches the branches (0 conditional, 1 unconditional).
struct WanBlockCacheInput {
  const StepInfo* step = nullptr;  // the forward's step
  int64_t batch = 0;
  int64_t tokens = 0;  // sequence length in patches
  int64_t dim = 0;     // the transformer's inner width
  const float* time_embedding = nullptr;    // (batch, dim): temb, before the SiLU
  const float* time_projection = nullptr;   // (batch, 6 * dim): what every block adds to its modulation table
};

// A hook that may skip the transformer blocks of a forward (everything between the embeddings and
// the output head) by reusing a residual it keeps. It holds its own state across forwards.
class WanBlockCache {
 public:
  virtual ~WanBlockCache() = default;
  // Before the blocks; `hidden` (batch, tokens, dim) holds the patch embeddings. Returns true to run
  // the blocks, or false after writing into `hidden` what stands in for their output.
  virtual bool before_blocks(const WanBlockCacheInput& input, float* hidden) = 0;
  // After the blocks ran: `blocks_input` is what entered them, `hidden` what came out.
  virtual void after_blocks(const WanBlockCacheInput& input, const float* blocks_input, const float* hidden) = 0;
};

// The spatial layout sparse patterns with a geometry (radial, spatial_aware, local, ...) need for a
// latent of (frames, height, width): the patch grid in frames, latent pixels and patch size.
// Throws Error when the patch is not square in height and width, or the latent is not a multiple
// of the patch.
SpatialLayout wan_spatial_layout(const WanConfig& config, int64_t latent_frames, int64_t latent_height, int64_t latent_width);

class WanTransformer {
 public:
  // `weights` holds exactly the tensors of wan_weight_specs(config) (any float dtype; converted
  // to fp32 here). Throws Error naming a missing, mis-shaped or unexpected tensor.
  WanTransformer(WanConfig config, const std::map<std::string, Tensor>& weights, const WanAttentionOptions& attention = {});
  ~WanTransformer();
  WanTransformer(WanTransformer&&) noexcept;
  WanTransformer& operator=(WanTransformer&&) noexcept;

  // Reads config.json and the (sharded) safetensors of a diffusers checkpoint directory.
  static WanTransformer load(const std::string& checkpoint_dir, const WanAttentionOptions& attention = {});
  // Random weights at the scale of diffusers' initialization (for benchmarks), from `seed`.
  static WanTransformer random(const WanConfig& config, uint64_t seed, const WanAttentionOptions& attention = {});

  // One transformer forward. latents (B, in_channels, F, H, W), timestep (B) or (B, S) (one per
  // token, as Wan 2.2 conditions a first frame), text (B, L, text_dim) and out
  // (B, out_channels, F, H, W): fp32, CPU, contiguous; F, H, W multiples of the patch size
  // with at most rope_max_seq_len patches along each axis; a spatial layout in the attention
  // config must be wan_spatial_layout of this latent. `step` reaches every block's attention
  // with its layer index filled in (step.layer is ignored). Throws Error naming the argument for
  // any other shape, dtype or device. `profile`, when given, accumulates the time per kind of work.
  // `block_cache`, when given, is asked before the blocks whether to run them (it needs one timestep
  // per batch entry: a (B, S) timestep is an Error).
  void forward(const ExecContext& ctx, const StepInfo& step, const TensorView& latents, const TensorView& timestep,
               const TensorView& text, const TensorView& out, WanForwardProfile* profile = nullptr,
               WanBlockCache* block_cache = nullptr) const;

  const WanConfig& config() const;
  // The self-attention module of each block (null entries when attention is dense without a registry).
  const SparseAttention* block_attention(int64_t layer) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessel
