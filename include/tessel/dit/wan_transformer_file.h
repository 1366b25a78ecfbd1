// A Wan transformer's weights in one safetensors file with the original Wan module names
// (`blocks.0.self_attn.q.weight`, optionally behind `model.diffusion_model.` or `diffusion_model.`),
// as ComfyUI and LightX2V publish them, in bf16 / fp32 or with FP8 linear weights:
//   - ComfyUI's scaled fp8: float8 e4m3 weights, a per-tensor fp32 `<module>.scale_weight` (one
//     value), the `scaled_fp8` marker tensor; an optional `<module>.scale_input` (a static input
//     scale for ComfyUI's own FP8 matmul) is checked and not used: tessel quantises activations per
//     token on the fly;
//   - LightX2V's: e4m3 weights and a per-output-channel fp32 `<module>.weight_scale` of (out, 1)
//     or (out) (a single value is taken as a per-tensor scale).
// Names map through wan_module_spellings (both namings are accepted). The config still comes from
// the model directory: open() checks every tensor of wan_weight_specs(config) is there once with
// its shape, and refuses, naming the file and the key, unknown keys, e4m3 anywhere but the weight
// matrix of a linear layer (norms, biases, modulation tables, the patch embedding and the position
// table are bf16 / fp32 as in any checkpoint), an e4m3 tensor without a scale or with two, a
// scale of the wrong shape or dtype, for a missing or non-e4m3 tensor, or that is NaN, infinite,
// zero or negative. NaN e4m3 bytes (0x7f / 0xff) are refused when a tensor is read.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "tessel/core/tensor.h"
#include "tessel/dit/checkpoint.h"
#include "tessel/dit/wan_config.h"

namespace tessel {

enum class WanFp8FileFormat { kComfyUi, kLightX2V };
// "comfyui" / "lightx2v"; throws Error naming `what` otherwise.
WanFp8FileFormat parse_wan_fp8_file_format(const std::string& text, const std::string& what);

// One tensor as the file stores it.
struct WanStoredTensor {
  TensorView values;  // the mapped bytes: fp32, fp16 or bf16; e4m3 bytes (kU8) for an FP8 linear weight
  TensorView row_scales;  // e4m3 only: (rows) fp32, one per output channel (a per-tensor scale repeated)
};

class WanTransformerFile {
 public:
  static WanTransformerFile open(const std::string& path, const WanConfig& config);

  const std::string& path() const { return checkpoint_.directory(); }
  // Whether the file stores `tensor` (a name of wan_weight_specs) as e4m3.
  bool float8(const std::string& tensor) const;
  // The stored tensor (valid while this object lives). Throws Error for NaN e4m3 bytes or
  // non-finite values, naming the file and the key.
  WanStoredTensor stored(const std::string& tensor) const;
  // The values in fp32: e4m3 bytes times their row's scale (one fp32 multiply), other dtypes
  // converted exactly.
  Tensor dequantised(const std::string& tensor) const;
  // For logs: the format and how many tensors are e4m3.
  std::string describe() const;

 private:
  struct Entry {
    std::string key;
    Tensor row_scales;  // e4m3 only
  };
  const Entry& entry(const std::string& tensor) const;
  Checkpoint checkpoint_;
  std::map<std::string, Entry> entries_;  // by diffusers tensor name
  std::string format_;
};

// Writes `source`'s tensors (a diffusers checkpoint of `config`, e.g. a model directory's
// transformer) as one file in the original Wan names, the block linear weights (wan_fp8_weight) in
// e4m3 quantised from their bf16 values: kLightX2V per output channel exactly as
// WanWeightPrecision::kFp8 quantises at load (the same bytes and scales), with `weight_scale` (out,
// 1); kComfyUi with one scale per tensor (its absolute maximum maps to 448), `scale_weight` and the
// `scaled_fp8` marker. The other tensors are written as stored. One tensor in memory at a time.
void write_wan_fp8_transformer_file(const Checkpoint& source, const WanConfig& config, const std::string& path,
                                    WanFp8FileFormat format);

}  // namespace tessel
