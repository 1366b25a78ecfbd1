// Plan-time tuning of the Hopper forward kernel's variant (attention_tuning.h): the table of
// choices by call class, and the timing of the candidates on synthetic inputs.
#include "cuda/attention_tuning_cuda.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <tuple>

#include "cuda/attention_cuda.h"
#include "cuda/hopper/device_support.h"
#include "cuda/hopper/flash_forward_hopper.h"
#include "tessel/core/error.h"
#include "tessel/core/tensor.h"
#include "tessel/kernels/cuda/device_guard.h"

namespace tessel::cuda {
namespace {

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw Error(tessel::detail::concat("attention tuning: ", what, " failed: ", cudaGetErrorString(status)));
}

// Lengths within one power of two share a choice: the variants' relative speed moves with the
// number of stages per item, which changes slowly with S.
int length_bucket(int64_t seq) { return static_cast<int>(std::bit_width(static_cast<uint64_t>(std::max<int64_t>(seq, 1) - 1))); }

using ClassKey = std::tuple<int, int, int, bool, bool, int, int>;

ClassKey key_of(const detail::CallClass& c) {
  return {c.device, c.head_dim, static_cast<int>(c.dtype), c.block_sparse, c.limited, length_bucket(c.seq_q),
          length_bucket(c.seq_kv)};
}

struct Table {
  // Whether anything was ever tuned or forced: until then every call runs the default without
  // taking the lock (the lookup sits on every attention call's path).
  std::atomic<bool> any_choice{false};
  std::mutex mutex;
  std::map<ClassKey, detail::HopperVariant> tuned;
  std::map<std::pair<int, int>, detail::HopperVariant> forced;  // (device, head dim)
  std::map<int, detail::HopperFp8Variant> forced_fp8;             // device (the FP8 mode has head dim 128)
};

Table& table() {
  static Table t;
  return t;
}

// The variant tune_attention is timing on this thread (its calls go through the public entry points).
thread_local std::optional<detail::HopperVariant> trial_variant;

struct TrialScope {
  explicit TrialScope(const detail::HopperVariant& v) { trial_variant = v; }
  ~TrialScope() { trial_variant.reset(); }
  TrialScope(const TrialScope&) = delete;
  TrialScope& operator=(const TrialScope&) = delete;
};

bool device_present(Device device) {
  int count = 0;
  return device.is_cuda() && cudaGetDeviceCount(&count) == cudaSuccess && device.index >= 0 && device.index < count;
}

bool has_hopper_kernel(Device device, int64_t head_dim) {
  if (!device_present(device)) return false;
  const DeviceGuard guard(device.index);
  return detail::flash_forward_hopper_fits(static_cast<int>(head_dim), false, 0);
}

constexpr int64_t kFp8HeadDim = 128;  // the FP8 mode's only head dim

std::optional<detail::HopperVariant> variant_named(int64_t head_dim, const std::string& name) {
  for (const detail::HopperVariant& v : detail::hopper_variants_for(static_cast<int>(head_dim)))
    if (detail::hopper_variant_name(v) == name) return v;
  return std::nullopt;
}

std::optional<detail::HopperFp8Variant> fp8_variant_named(const std::string& name) {
  for (const detail::HopperFp8Variant& v : detail::hopper_fp8_variants())
    if (detail::hopper_fp8_variant_name(v) == name) return v;
  return std::nullopt;
}

// A block mask of `density` (the diagonal block always kept) over `rows` rows, CSR on the device.
struct SyntheticMask {
  Tensor indptr, indices;
  BlockMaskView view;
};

SyntheticMask synthetic_mask(Device device, int64_t heads, int64_t seq_q, int64_t seq_kv, double density) {
  SyntheticMask m;
  BlockMaskView& v = m.view;
  v.mask_heads = heads;
  v.block_q = 128;
  v.block_kv = 64;
  v.q_blocks = (seq_q + 127) / 128;
  v.kv_blocks = (seq_kv + 63) / 64;
  v.seq_q = seq_q;
  v.seq_kv = seq_kv;
  v.device = device;
  std::mt19937 rng(20261127);
  std::vector<int32_t> indptr{0}, indices;
  const int64_t keep = std::clamp<int64_t>(static_cast<int64_t>(density * static_cast<double>(v.kv_blocks) + 0.5), 1, v.kv_blocks);
  std::vector<int32_t> columns(static_cast<size_t>(v.kv_blocks));
  for (int64_t row = 0; row < v.num_rows(); ++row) {
    for (int64_t c = 0; c < v.kv_blocks; ++c) columns[static_cast<size_t>(c)] = static_cast<int32_t>(c);
    const auto diagonal = static_cast<int32_t>(std::min(row % v.q_blocks * 2, v.kv_blocks - 1));
    std::swap(columns[0], columns[static_cast<size_t>(diagonal)]);
    std::shuffle(columns.begin() + 1, columns.end(), rng);
    std::vector<int32_t> kept(columns.begin(), columns.begin() + keep);
    std::sort(kept.begin(), kept.end());
    indices.insert(indices.end(), kept.begin(), kept.end());
    indptr.push_back(static_cast<int32_t>(indices.size()));
  }
  auto upload = [&](const std::vector<int32_t>& values) {
    Tensor host = Tensor::empty({static_cast<int64_t>(values.size())}, DType::kI32);
    std::copy(values.begin(), values.end(), host.data_as<int32_t>());
    return host.to(device);
  };
  m.indptr = upload(indptr);
  m.indices = upload(indices);
  v.indptr = m.indptr.data_as<const int32_t>();
  v.indices = m.indices.data_as<const int32_t>();
  return m;
}

void check_options(const AttentionDims& dims, const AttentionTuneOptions& o) {
  if (dims.seq_q <= 0 || dims.seq_kv <= 0 || dims.heads <= 0 || dims.kv_heads <= 0 || dims.batch <= 0 ||
      dims.heads % dims.kv_heads != 0)
    fail_argument("dims", "positive lengths, heads and batch with heads a multiple of kv_heads",
                  tessel::detail::concat("batch ", dims.batch, ", seq_q ", dims.seq_q, ", seq_kv ", dims.seq_kv, ", heads ",
                                         dims.heads, ", kv_heads ", dims.kv_heads));
  if (!(o.density > 0.0 && o.density <= 1.0)) fail_argument("options.density", "a value in (0, 1]", o.density);
  if (o.rounds < 1 || o.rounds > 100) fail_argument("options.rounds", "1 to 100", o.rounds);
}

}  // namespace

namespace detail {

HopperVariant chosen_hopper_variant(const CallClass& call) {
  if (trial_variant) return *trial_variant;
  Table& t = table();
  if (!t.any_choice.load(std::memory_order_acquire)) return default_hopper_variant(call.head_dim);
  const std::lock_guard lock(t.mutex);
  if (const auto f = t.forced.find({call.device, call.head_dim}); f != t.forced.end()) return f->second;
  if (const auto found = t.tuned.find(key_of(call)); found != t.tuned.end()) return found->second;
  return default_hopper_variant(call.head_dim);
}

HopperFp8Variant chosen_hopper_fp8_variant(int device) {
  Table& t = table();
  if (!t.any_choice.load(std::memory_order_acquire)) return default_hopper_fp8_variant();
  const std::lock_guard lock(t.mutex);
  const auto f = t.forced_fp8.find(device);
  return f != t.forced_fp8.end() ? f->second : default_hopper_fp8_variant();
}

}  // namespace detail

std::vector<std::string> attention_kernel_variants(Device device, int64_t head_dim, AttentionPrecision precision) {
  if (!has_hopper_kernel(device, head_dim)) return {};
  std::vector<std::string> names;
  if (precision == AttentionPrecision::kFp8) {
    if (head_dim == kFp8HeadDim)
      for (const detail::HopperFp8Variant& v : detail::hopper_fp8_variants()) names.push_back(detail::hopper_fp8_variant_name(v));
    return names;
  }
  for (const detail::HopperVariant& v : detail::hopper_variants_for(static_cast<int>(head_dim)))
    names.push_back(detail::hopper_variant_name(v));
  return names;
}

void force_attention_kernel_variant(Device device, int64_t head_dim, const std::string& variant,
                                    AttentionPrecision precision) {
  if (!device.is_cuda()) fail_argument("device", "a CUDA device", device.str());
  Table& t = table();
  const bool fp8 = precision == AttentionPrecision::kFp8;
  if (variant.empty()) {
    const std::lock_guard lock(t.mutex);
    if (fp8)
      t.forced_fp8.erase(device.index);
    else
      t.forced.erase({device.index, static_cast<int>(head_dim)});
    return;
  }
  const std::vector<std::string> names = cuda::attention_kernel_variants(device, head_dim, precision);
  const std::optional<detail::HopperVariant> v = fp8 ? std::nullopt : variant_named(head_dim, variant);
  const std::optional<detail::HopperFp8Variant> v8 =
      fp8 && head_dim == kFp8HeadDim ? fp8_variant_named(variant) : std::nullopt;
  if ((!v && !v8) || names.empty()) {
    std::string offered;
    for (const std::string& n : names) offered += (offered.empty() ? "" : ", ") + n;
    fail_argument("variant", offered.empty() ? std::string("none (this device has no kernel variants for head dim ") +
                                                   std::to_string(head_dim) + ")"
                                             : "one of " + offered,
                  variant);
  }
  const std::lock_guard lock(t.mutex);
  if (v8)
    t.forced_fp8[device.index] = *v8;
  else
    t.forced[{device.index, static_cast<int>(head_dim)}] = *v;
  t.any_choice.store(true, std::memory_order_release);
}

void tune_attention_unless_capturing(const ExecContext& ctx, Device device, DType dtype, const AttentionDims& dims,
                                     const AttentionTuneOptions& options) {
  if (!has_hopper_kernel(device, dims.head_dim) || dims.precision == AttentionPrecision::kFp8) return;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  check_cuda(cudaStreamIsCapturing(ctx.stream, &capture), "cudaStreamIsCapturing");
  if (capture == cudaStreamCaptureStatusNone) cuda::tune_attention(ctx, device, dtype, dims, options);
}

void clear_attention_tuning() {
  Table& t = table();
  const std::lock_guard lock(t.mutex);
  t.tuned.clear();
  t.forced.clear();
  t.forced_fp8.clear();
}

AttentionTuning tune_attention(const ExecContext& ctx, Device device, DType dtype, const AttentionDims& dims,
                               const AttentionTuneOptions& options) {
  check_options(dims, options);
  if (dtype != DType::kBF16 && dtype != DType::kF16) fail_argument("dtype", "bf16 or fp16 on CUDA", dtype_name(dtype));
  if (!device_present(device)) fail_argument("device", "a CUDA device present", device.str());
  AttentionTuning result;
  if (dims.precision == AttentionPrecision::kFp8 || !has_hopper_kernel(device, dims.head_dim)) return result;
  const DeviceGuard guard(device.index);
  const detail::CallClass call{device.index,           static_cast<int>(dims.head_dim), dtype, options.block_sparse,
                               options.causal,         dims.seq_q,                      dims.seq_kv};
  const std::vector<detail::HopperVariant> candidates = detail::hopper_variants_for(static_cast<int>(dims.head_dim));
  {
    Table& t = table();
    const std::lock_guard lock(t.mutex);
    const auto forced = t.forced.find({call.device, call.head_dim});
    const auto found = t.tuned.find(key_of(call));
    if (forced != t.forced.end() || found != t.tuned.end() || candidates.size() == 1) {
      result.chosen = detail::hopper_variant_name(forced != t.forced.end() ? forced->second
                                                  : found != t.tuned.end() ? found->second
                                                                           : candidates.front());
      result.cached = candidates.size() > 1;
      return result;
    }
  }
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  check_cuda(cudaStreamIsCapturing(ctx.stream, &capture), "cudaStreamIsCapturing");
  if (capture != cudaStreamCaptureStatusNone)
    fail_argument("ctx.stream", "a stream outside graph capture (tuning times kernels: call it at plan time)", "a capturing stream");

  // Enough heads that the grid runs a few waves of items, as many as the real calls have at most.
  const int group = static_cast<int>(dims.heads / dims.kv_heads);
  const int64_t q_blocks = (dims.seq_q + 127) / 128;
  const int waves_items = 4 * std::max(1, detail::current_hopper_device().multiprocessors);
  int64_t heads = std::clamp<int64_t>((waves_items + q_blocks - 1) / q_blocks, 1, dims.heads * dims.batch);
  heads = (heads + group - 1) / group * group;
  const int64_t kv_heads = heads / group, d = dims.head_dim;
  Tensor q = Tensor::empty({1, dims.seq_q, heads, d}, dtype, device);
  Tensor k = Tensor::empty({1, dims.seq_kv, kv_heads, d}, dtype, device);
  Tensor v = Tensor::empty({1, dims.seq_kv, kv_heads, d}, dtype, device);
  Tensor out = Tensor::empty({1, dims.seq_q, heads, d}, dtype, device);
  // Values near 0.01 (byte 0x3c in both halves): the kernels' time does not depend on the data.
  for (Tensor* t : {&q, &k, &v}) check_cuda(cudaMemsetAsync(t->data(), 0x3c, t->nbytes(), ctx.stream), "cudaMemsetAsync");
  std::optional<SyntheticMask> mask;
  if (options.block_sparse) mask = synthetic_mask(device, heads, dims.seq_q, dims.seq_kv, options.density);
  Workspace workspace(device);
  workspace.reserve(block_sparse_attention_workspace_bytes(AttentionDims{1, dims.seq_q, dims.seq_kv, heads, kv_heads, d}));
  ExecContext run = ctx;
  run.workspace = &workspace;
  AttentionOptions attention_options;
  attention_options.causal = options.causal;
  auto run_once = [&] {
    if (mask)
      cuda::block_sparse_attention_forward(run, q.view(), k.view(), v.view(), mask->view, out.view(), TensorView{}, attention_options);
    else
      cuda::attention_forward(run, q.view(), k.view(), v.view(), out.view(), TensorView{}, attention_options);
  };
  cudaEvent_t start = nullptr, stop = nullptr;
  check_cuda(cudaEventCreate(&start), "cudaEventCreate");
  check_cuda(cudaEventCreate(&stop), "cudaEventCreate");
  std::vector<std::vector<double>> times(candidates.size());
  try {
    for (int round = -1; round < options.rounds; ++round)  // round -1 warms every candidate up
      for (size_t c = 0; c < candidates.size(); ++c) {
        const TrialScope trial(candidates[c]);
        check_cuda(cudaEventRecord(start, ctx.stream), "cudaEventRecord");
        run_once();
        check_cuda(cudaEventRecord(stop, ctx.stream), "cudaEventRecord");
        check_cuda(cudaEventSynchronize(stop), "cudaEventSynchronize");
        float ms = 0.f;
        check_cuda(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
        if (round >= 0) times[c].push_back(ms);
      }
  } catch (...) {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    throw;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  size_t best = 0;
  for (size_t c = 0; c < candidates.size(); ++c) {
    std::vector<double>& t = times[c];
    std::nth_element(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(t.size() / 2), t.end());
    result.median_ms.emplace_back(detail::hopper_variant_name(candidates[c]), t[t.size() / 2]);
    if (result.median_ms[c].second < result.median_ms[best].second) best = c;
  }
  result.chosen = detail::hopper_variant_name(candidates[best]);
  Table& t = table();
  const std::lock_guard lock(t.mutex);
  t.tuned[key_of(call)] = candidates[best];
  t.any_choice.store(true, std::memory_order_release);
  return result;
}

}  // namespace tessel::cuda
