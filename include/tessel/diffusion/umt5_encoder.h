// The UMT5 text encoder Wan conditions on, as transformers' UMT5EncoderModel computes it:
//   token embedding (no scaling) -> per block: RMSNorm (T5's: no mean, no bias, fp32 statistics)
//   -> self-attention with no 1/sqrt(d) scaling, a relative position bias of the block's own
//   (bidirectional buckets: half per direction, exact below half the buckets, logarithmic up to
//   max_distance) and the padding mask -> residual; RMSNorm -> gated-GELU FFN
//   (gelu_tanh(x W0) * (x W1)) W_o -> residual; then the final RMSNorm.
// fp32 on the CPU, straightforward loops: meant for correctness first.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/core/exec_context.h"
#include "tessel/core/tensor.h"
#include "tessel/dit/checkpoint.h"

namespace tessel {

struct UMT5Config {
  int64_t vocab_size = 256384;
  int64_t d_model = 4096;
  int64_t d_kv = 64;
  int64_t d_ff = 10240;
  int64_t num_layers = 24;
  int64_t num_heads = 64;
  int64_t relative_attention_num_buckets = 32;
  int64_t relative_attention_max_distance = 128;
  double layer_norm_epsilon = 1e-6;
  // Throws Error naming the field when a value is out of range.
  void validate() const;
};

// Parses transformers' config.json of a UMT5EncoderModel (feed_forward_proj must be
// "gated-gelu"); fields that only concern the decoder or training are ignored.
UMT5Config parse_umt5_config(std::string_view json_text, const std::string& source = "config.json");
// The config.json of a transformers model directory (a diffusers pipeline's text_encoder/). Throws
// Error naming the file when it is missing or malformed.
UMT5Config load_umt5_config(const std::string& directory);

// The arithmetic of one forward over `batch` sequences of `tokens`: the linears (2 x parameters
// per token: q, k, v, o and the gated FFN's three per layer) and the attention (4 x tokens^2 x
// heads x d_kv per sequence and layer), the embedding lookup not counted.
double umt5_encoder_flop(const UMT5Config& config, double batch, double tokens);

// The tensor names and shapes of the encoder (transformers' names: shared.weight,
// encoder.block.<i>.layer.<0|1>..., encoder.final_layer_norm.weight).
std::vector<WeightSpec> umt5_weight_specs(const UMT5Config& config);

// transformers' _relative_position_bucket for an encoder (bidirectional): the bucket of the
// relative position key - query.
int64_t umt5_relative_position_bucket(int64_t relative_position, int64_t num_buckets, int64_t max_distance);

namespace diffusion::cuda {
class UMT5CudaEncoder;
}

// An encoder lives on one device, chosen at construction:
//   CPU: fp32 weights and compute.
//   CUDA (builds with CUDA): the embedding and the linears in bf16 (cuBLASLt GEMMs, fp32
//     accumulation), the RMSNorms, the residual stream and the position biases in fp32, attention
//     with the bias and the padding mask in one kernel. Token ids, mask and output stay host tensors.
class UMT5Encoder {
 public:
  // `weights` holds exactly the tensors of umt5_weight_specs(config), any float dtype. Throws Error
  // for a CUDA device in a build without CUDA.
  UMT5Encoder(UMT5Config config, const std::map<std::string, Tensor>& weights, Device device = Device::cpu());

  // Reads a transformers model directory (a diffusers pipeline's text_encoder/): config.json and
  // model.safetensors, or the shards model.safetensors.index.json names. The token embedding may
  // be stored as shared.weight, encoder.embed_tokens.weight or both (tied: shared wins); decoder
  // tensors, when present, are skipped. Throws Error naming a missing file or tensor.
  // On CUDA the tensors go from the shards to the device one at a time (no fp32 copy of the model).
  static UMT5Encoder load(const std::string& directory, Device device = Device::cpu());

  // input_ids and attention_mask (B, L) int32 CPU contiguous (mask 1: a token, 0: padding; ids in
  // [0, vocab_size)); out (B, L, d_model) fp32 CPU contiguous. Throws Error naming a bad argument.
  void forward(const ExecContext& ctx, const TensorView& input_ids, const TensorView& attention_mask,
               const TensorView& out) const;

  const UMT5Config& config() const { return config_; }
  Device device() const { return device_; }

 private:
  UMT5Config config_;
  Device device_;
  std::map<std::string, Tensor> weights_;  // fp32, CPU encoders
  std::shared_ptr<const diffusion::cuda::UMT5CudaEncoder> cuda_;
  const float* weight(const std::string& name) const;
  // An encoder whose weights load() puts on the device afterwards.
  struct WeightsLater {};
  UMT5Encoder(UMT5Config config, Device device, WeightsLater);
};

}  // namespace tessel
