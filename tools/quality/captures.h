// Captured attention inputs per layer, as `tessel calibrate` and `tessel eval --config` read them:
// safetensors files of q, k, v (one per denoising step), or the structured synthetic video
// captures, placed on the calibration device (fp32 on the CPU, bf16 on CUDA).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "quality/calibration.h"
#include "tessel/core/device.h"

namespace tessel {

// Synthetic held-out steps use seeds from this offset, so they never repeat a calibration step.
inline constexpr uint64_t kSyntheticHeldoutSeedOffset = 500;

// "a.safetensors,b.safetensors" -> its items; an empty item ("a,,b", "a,") is an Error naming
// `option` (a dropped step would change the calibration silently).
std::vector<std::string> split_capture_files(const std::string& text, const std::string& option);

// One captured step on `device`: fp32 on the CPU, bf16 on CUDA.
CalibrationSample capture_on_device(const Tensor& q, const Tensor& k, const Tensor& v, const Device& device);

// The steps of one layer from comma-separated capture files; throws Error naming `option` when
// there are none (and the file, through load_qkv_safetensors, when one is unreadable).
std::vector<CalibrationSample> load_capture_files(const std::string& files, const std::string& option, const Device& device);

struct SyntheticCaptureOptions {
  std::string grid;  // FxHxW
  int64_t layers = 1, heads = 12, head_dim = 64;
};

// Synthetic video captures, per layer: `steps` steps with seeds 1000 · layer + seed_offset + [0, steps).
// The layers differ in sharpness (0.6 for the first to 1.4 for the last) as a model's do with depth;
// the steps of a layer differ in content noise.
// first_layer / count (count < 0: to the last) make only those layers, with the values they have
// in the whole set: the commands make and drop one layer at a time.
std::vector<std::vector<CalibrationSample>> synthetic_layer_captures(const SyntheticCaptureOptions& options, uint64_t seed_offset,
                                                                     int64_t steps, const Device& device, int64_t first_layer = 0,
                                                                     int64_t count = -1);

// The shape of the first of comma-separated capture files, from its header (q (B, S, H, D), k
// (B, S_kv, H_kv, D)), for the budget estimates before anything loads. Throws Error naming `option`.
struct CaptureShape {
  int64_t batch = 1, tokens = 0, kv_tokens = 0, heads = 0, kv_heads = 0, head_dim = 0;
};
CaptureShape capture_shape(const std::string& files, const std::string& option);

// One step of that shape at `element_bytes` per value: the bytes of q and of k (v is the same), and
// one dense attention's arithmetic (4 B S S_kv H D): what the budget estimates count.
struct CaptureSizes {
  double q_bytes = 0.0, kv_bytes = 0.0, attention_flop = 0.0;
};
CaptureSizes capture_sizes(const CaptureShape& shape, double element_bytes);

}  // namespace tessel
