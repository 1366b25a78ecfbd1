#include "quality/captures.h"


#include <exception>

#include "quality/qkv_file.h"
#include "quality/synthetic_video.h"
#include "tessel/core/error.h"
#include "tessel/core/io/safetensors.h"
#include "tessel/core/parallel.h"

namespace tessel {

std::vector<std::string> split_capture_files(const std::string& text, const std::string& option) {
  std::vector<std::string> files;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    if (comma == start && !text.empty())
      fail_argument(option, "comma-separated capture files without empty elements", quoted_excerpt(text));
    if (comma > start) files.push_back(text.substr(start, comma - start));
    start = comma + 1;
  }
  return files;
}

CalibrationSample capture_on_device(const Tensor& q, const Tensor& k, const Tensor& v, const Device& device) {
  const DType dtype = device.is_cpu() ? DType::kF32 : DType::kBF16;
  const auto place = [&](const Tensor& t) {
    // Shares the storage when the dtype already fits: the samples never write their q, k, v.
    const Tensor typed = t.dtype() == dtype ? t : t.to(dtype);
    return device.is_cpu() ? typed : typed.to(device);
  };
  CalibrationSample s;
  s.q = place(q);
  s.k = place(k);
  s.v = place(v);
  return s;
}

std::vector<CalibrationSample> load_capture_files(const std::string& files, const std::string& option, const Device& device) {
  std::vector<CalibrationSample> samples;
  for (const std::string& path : split_capture_files(files, option)) {
    QkvTensors t = load_qkv_safetensors(path);
    samples.push_back(capture_on_device(t.q, t.k, t.v, device));
  }
  if (samples.empty()) fail_argument(option, "one or more capture files, comma-separated", files);
  return samples;
}

std::vector<std::vector<CalibrationSample>> synthetic_layer_captures(const SyntheticCaptureOptions& o, uint64_t seed_offset,
                                                                     int64_t steps, const Device& device, int64_t first_layer,
                                                                     int64_t count) {
  const int64_t layers = o.layers;
  if (first_layer < 0 || first_layer > layers) fail_argument("first_layer", detail::concat("in [0, ", layers, "]"), first_layer);
  if (count < 0 || first_layer + count > layers) count = layers - first_layer;
  const TokenGrid grid = parse_token_grid(o.grid, "--grid");
  std::vector<SyntheticQkv> made(static_cast<size_t>(count * steps));
  std::vector<std::exception_ptr> failed(made.size());  // an exception must not leave a parallel task
  parallel_for(count * steps, [&](int64_t i) {
    const int64_t layer = first_layer + i / steps;
    SyntheticVideoOptions s;
    s.grid = grid;
    s.heads = o.heads;
    s.head_dim = o.head_dim;
    s.sharpness = layers > 1 ? 0.6 + 0.8 * static_cast<double>(layer) / static_cast<double>(layers - 1) : 1.0;
    s.seed = static_cast<uint64_t>(1000 * layer) + seed_offset + static_cast<uint64_t>(i % steps);
    s.dtype = device.is_cpu() ? DType::kF32 : DType::kBF16;
    try {
      made[static_cast<size_t>(i)] = make_synthetic_video_qkv(s);
    } catch (...) {
      failed[static_cast<size_t>(i)] = std::current_exception();
    }
  });
  for (const std::exception_ptr& e : failed)
    if (e) std::rethrow_exception(e);
  std::vector<std::vector<CalibrationSample>> samples(static_cast<size_t>(count));
  for (int64_t i = 0; i < count * steps; ++i) {
    SyntheticQkv& d = made[static_cast<size_t>(i)];
    samples[static_cast<size_t>(i / steps)].push_back(capture_on_device(d.q, d.k, d.v, device));
    d = SyntheticQkv{};  // the host copy goes as soon as the sample is placed
  }
  return samples;
}

CaptureShape capture_shape(const std::string& files, const std::string& option) {
  const std::vector<std::string> paths = split_capture_files(files, option);
  if (paths.empty()) fail_argument(option, "one or more capture files, comma-separated", files);
  const SafetensorsFile file = SafetensorsFile::open(paths.front());
  const SafetensorsEntry* q = file.find("q");
  const SafetensorsEntry* k = file.find("k");
  if (q == nullptr || k == nullptr || q->shape.size() != 4 || k->shape.size() != 4)
    fail_argument(option + " " + paths.front(), "q (B, S, H, D) and k (B, S_kv, H_kv, D) tensors", "others");
  return {q->shape[0], q->shape[1], k->shape[1], q->shape[2], k->shape[2], q->shape[3]};
}

CaptureSizes capture_sizes(const CaptureShape& s, double element_bytes) {
  CaptureSizes sizes;
  sizes.q_bytes = static_cast<double>(s.batch * s.tokens * s.heads * s.head_dim) * element_bytes;
  sizes.kv_bytes = static_cast<double>(s.batch * s.kv_tokens * s.kv_heads * s.head_dim) * element_bytes;
  sizes.attention_flop =
      4.0 * static_cast<double>(s.batch * s.tokens) * static_cast<double>(s.kv_tokens) * static_cast<double>(s.heads * s.head_dim);
  return sizes;
}

}  // namespace tessel
