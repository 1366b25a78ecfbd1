// The Wan transformer's forward on one CUDA device in bf16 (internal; WanTransformer owns one when
// it is built for a CUDA device). Same operations as the CPU forward (wan_model.h), with:
//   - weights uploaded once into one device arena: the linear layers of the blocks, the patch
//     embedding, the text embedder and the output projection in bf16; the time embedder, the time
//     projection, the modulation tables and the norm weights in fp32 (diffusers keeps the
//     conditioning in fp32 too);
//   - GEMMs through cuBLASLt (bf16 in, fp32 accumulation, bias and GELU-tanh in the epilogue);
//     with WanWeightPrecision::kFp8 the blocks' linear weights are e4m3 with a scale per output
//     channel (quantised on the device at load, wan_fp8_weight; "<name>_scale" holds the
//     scales) and their inputs are quantised per token before the GEMMs that read them (by the
//     LayerNorm that makes them where there is one, once for q/k/v, once per forward for the text
//     context), then FP8 GEMMs (CublasLtGemm::linear_fp8);
//   - the residual stream in fp32, what feeds a GEMM or attention rounded once to bf16 by a fused
//     kernel (LayerNorm + AdaLN modulation, RMSNorm + 3-D RoPE, gate + residual);
//   - self-attention through tessel's dense kernel or the blocks' SparseAttention modules (with
//     AttentionPrecision::kFp8: the dense kernel's FP8 mode, q and k quantised by the RMSNorm + RoPE
//     kernel straight into the attention's workspace), cross-attention through the dense kernel;
//   - with an image branch (Wan 2.1 I2V / FLF2V): the image embedder's norms, GELU and position
//     table in fp32 around bf16 GEMMs, and in every block the image tokens' keys and values
//     (RMSNorm on the keys) attended to by the cross-attention's queries, the result added to the
//     text attention's before the output projection (diffusers' WanAttnProcessor, in bf16 as its
//     bf16 forward adds them);
//   - every activation a slice of ctx.workspace, sized once per shape by workspace_bytes(): a
//     forward after the first of its shape allocates nothing and never waits for the device
//     (unless a profile is asked for, which reads CUDA events at the end).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tessel/core/exec_context.h"
#include "tessel/core/tensor.h"
#include "tessel/dit/checkpoint.h"
#include "tessel/dit/wan_config.h"
#include "tessel/dit/wan_model.h"
#include "tessel/kernels/cuda/cublaslt_gemm.h"
#include "wan_lora_rows.h"

namespace tessel {
class WanSequenceParallel;
}

namespace tessel::dit::cuda {

class WanBlockOffload;
using tessel::cuda::CublasLtGemm;
using tessel::cuda::GemmEpilogue;
using tessel::cuda::GemmShape;

// One stored tensor: a CPU view of any float dtype, or (an FP8 checkpoint's block linear weight,
// wan_fp8_weight, with WanWeightPrecision::kFp8) e4m3 bytes (kU8) and their (rows) fp32 scales, used
// as they are. Read while the call lasts (a loaded map's tensor, or a checkpoint's mapped bytes).
struct StoredWeight {
  TensorView values;
  TensorView row_scales;  // e4m3 values only
};
// One stored tensor per spec of wan_weight_specs(config).
using WeightSource = std::function<StoredWeight(const WeightSpec&)>;

// The sizes of one forward, validated by the caller.
struct WanForwardShape {
  int64_t batch = 1, frames = 0, height = 0, width = 0;  // the latent
  int64_t text_len = 0;
  // Image tokens per batch entry the image branch attends to (Wan 2.1 I2V / FLF2V); 0 without one.
  int64_t image_len = 0;
  // Timesteps per batch entry: 1 (a (B) timestep), the latent's patch frames (one per frame) or its
  // tokens (one per token). Each covers tokens / timesteps_per_entry consecutive tokens (frame-major).
  int64_t timesteps_per_entry = 1;
  // Under sequence parallelism (WanSequenceParallel): this rank's token rows per batch entry and
  // the number of shards; 0 and 1 when this process runs every token.
  int64_t shard_tokens = 0, shards = 1;
  // A step cache's hooks run: the patch embeddings (what the hook judges the leading blocks by) and
  // then the skippable span's input are kept, one after the other in one buffer.
  bool block_cache = false;
  // Per-request LoRA: the largest rank of the bank's adapters (0 without), the width of the scratch
  // their rank-wide intermediates take.
  int64_t lora_rank = 0;
  // The self-attention's precision (WanAttentionOptions::precision, checked there): kFp8 runs the
  // dense self-attention in FP8 with q and k quantized by their RMSNorm + RoPE kernel.
  AttentionPrecision self_attention_precision = AttentionPrecision::kInput;
};

class WanCudaModel {
 public:
  // Uploads the tensors `source` gives, one at a time (a host copy of one tensor at most); with
  // offloaded blocks, the blocks' tensors go to pinned host memory instead.
  WanCudaModel(const WanConfig& config, Device device, WanWeightResidency residency, WanWeightPrecision precision,
               const WeightSource& source);
  // Random weights drawn on the device with the distributions of WanTransformer::random (with fp8
  // weights: the same bf16 draws as kBf16's, then quantised).
  WanCudaModel(const WanConfig& config, Device device, WanWeightResidency residency, WanWeightPrecision precision, uint64_t seed);
  ~WanCudaModel();
  WanCudaModel(const WanCudaModel&) = delete;
  WanCudaModel& operator=(const WanCudaModel&) = delete;

  // Bytes of ctx.workspace one forward of this shape takes (activations, rotary tables, the GEMM
  // scratch). The attention's room after them (a block schedule, FP8's e4m3 q, k, v) is reserved by
  // forward on top.
  size_t workspace_bytes(const WanForwardShape& shape) const;
  size_t weight_bytes() const;            // on the device: the arena (and the block slots)
  size_t offloaded_weight_bytes() const;  // in pinned host memory (offloaded blocks), else 0

  // latents, timestep, text, out: fp32 device pointers of the shapes WanTransformer::forward
  // checked; image: the (B, shape.image_len, image_dim) fp32 CLIP features with an image branch,
  // else null. self_attention: one module per block, or empty for dense attention everywhere.
  // sequence_parallel: null, or the shards of shape.shard_tokens rows the blocks run on (the
  // forward is then collective over its sequence group; every rank gets the whole output).
  // block_cache (with shape.block_cache): asked before its span of blocks whether to run it, with
  // host copies of the conditioning (the forward waits for them: one small copy per forward), the
  // device's hidden states and the patch embeddings (this rank's rows).
  // lora_bank: null, or adapters on this device (shape.lora_rank at least its max_rank) that the
  // entries of `lora_runs` (checked by lora_runs()) use; every linear an adapter changes adds the
  // runs' low-rank updates (wan_lora_gemm.h).
  void forward(const ExecContext& ctx, const StepInfo& step, const WanForwardShape& shape, const float* latents,
               const float* timestep, const float* text, const float* image, float* out,
               const std::vector<std::shared_ptr<SparseAttention>>& self_attention, WanForwardProfile* profile,
               WanSequenceParallel* sequence_parallel = nullptr, WanBlockCache* block_cache = nullptr,
               const WanLoraBank* lora_bank = nullptr, const std::vector<LoraRun>& lora_runs = {}) const;

 private:
  // A tensor's device address. An offloaded block's tensor is in the slot its block maps to, valid
  // while the forward holds the block resident (WanBlockOffload::acquire).
  const void* weight(const std::string& name) const;
  // Where the constructors write a tensor: its device address, or an offloaded block's host copy.
  void* weight_destination(const std::string& name);
  void allocate_weights(WanWeightResidency residency);
  // Whether `name` is kept as e4m3 bytes with per-row scales (fp8 precision, a block linear weight).
  bool fp8_weight(const std::string& name) const;
  // Quantises the bf16 device matrix `bf16_rows` of the fp8 weight `spec` into `destination` and its
  // scales into `scales` (device addresses, or an offloaded block's host copy: through `staging`).
  void quantize_weight(const WeightSpec& spec, const void* bf16_rows, void* destination, void* scales, bool to_host);

  WanConfig config_;
  Device device_;
  WanWeightPrecision precision_ = WanWeightPrecision::kBf16;
  // fp8 precision only: device buffers for one block linear weight on its way to e4m3 (its bf16
  // values, and for offloaded blocks its bytes and scales before they go to the host copy).
  std::shared_ptr<void> staging_bf16_, staging_fp8_, staging_scales_;
  std::shared_ptr<void> arena_;
  size_t weight_bytes_ = 0;
  std::map<std::string, std::pair<size_t, DType>> layout_;  // tensor name -> (arena offset, device dtype)
  // Offloaded blocks: each block's tensors at these offsets of its host copy and of its slot (the
  // name after "blocks.<i>."); null offload when every weight lives in the arena.
  std::map<std::string, std::pair<size_t, DType>> block_layout_;
  std::unique_ptr<WanBlockOffload> offload_;
  CublasLtGemm gemm_;
};

}  // namespace tessel::dit::cuda
