// Public attention entry points: validate every argument (nothing is written on bad input), then
// dispatch on the device to the CPU kernels or, when built with CUDA, to tessel::cuda::*.
#include "tessel/kernels/attention.h"

#include <cmath>
#include <initializer_list>
#include <string>

#include "cpu/attention_cpu.h"
#include "tessel/core/error.h"
#ifdef TESSEL_WITH_CUDA
#include "cuda/attention_cuda.h"
#endif

namespace tessel {
namespace {

bool is_attention_dtype(DType dtype) { return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16; }

void check_bshd(const TensorView& t, const std::string& name) {
  if (t.empty() || (t.data() == nullptr && t.numel() > 0)) fail_argument(name, "a tensor with data", "an empty view");
  check_rank(t, 4, name);
  if (!is_attention_dtype(t.dtype())) fail_argument(name, "dtype fp32, fp16 or bf16", dtype_name(t.dtype()));
  // Batch, sequence and head strides are free (e.g. slices of a packed qkv); the head dim is dense.
  if (t.size(3) > 1 && t.stride(3) != 1)
    fail_argument(name, "head_dim stride 1", detail::concat("strides ", shape_str(t.strides())));
}

void check_lse(const TensorView& lse, const Shape& shape, Device device, const std::string& name) {
  if (lse.data() == nullptr && lse.numel() > 0) fail_argument(name, "a tensor with data", "a null data pointer");
  check_dtype(lse, DType::kF32, name);
  check_device(lse, device, name);
  check_shape(lse, shape, name);
  check_contiguous(lse, name);
}

// A view and the argument name its errors use.
struct NamedView {
  const TensorView& view;
  const char* name;
};

// Checks each view as check_bshd does, then that all are on the first one's device; returns it.
Device check_bshd_on_one_device(std::initializer_list<NamedView> views) {
  for (const NamedView& t : views) check_bshd(t.view, t.name);
  const Device device = views.begin()->view.device();
  for (const NamedView& t : views) check_device(t.view, device, t.name);
  return device;
}

struct Dims {
  int64_t batch, seq_q, seq_kv, heads, kv_heads, head_dim;
};

Dims check_attention_args(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                          const TensorView& lse, const AttentionOptions& options) {
  const Device device = check_bshd_on_one_device({{q, "q"}, {k, "k"}, {v, "v"}, {out, "out"}});
  check_dtype(k, q.dtype(), "k");
  check_dtype(v, q.dtype(), "v");
  check_dtype(out, q.dtype(), "out");
  const Dims d{q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3)};
  if (k.size(0) != d.batch) fail_argument("k", detail::concat("batch ", d.batch, " (as q)"), shape_str(k.shape()));
  if (k.size(3) != d.head_dim)
    fail_argument("k", detail::concat("head_dim ", d.head_dim, " (as q)"), shape_str(k.shape()));
  check_shape(v, k.shape(), "v");
  check_shape(out, q.shape(), "out");
  if (d.kv_heads < 1 || d.heads % d.kv_heads != 0)
    fail_argument("k", detail::concat("a head count dividing q's ", d.heads, " heads"),
                  detail::concat(d.kv_heads, " heads"));
  if (d.head_dim < 1) fail_argument("q", "head_dim >= 1", d.head_dim);
  if (!lse.empty()) check_lse(lse, {d.batch, d.heads, d.seq_q}, device, "lse");
  if (!std::isfinite(options.scale)) fail_argument("options.scale", "a finite value (0 = 1/sqrt(D))", options.scale);
  if (options.window_left < -1) fail_argument("options.window_left", ">= -1 (-1 = unbounded)", options.window_left);
  if (options.window_right < -1) fail_argument("options.window_right", ">= -1 (-1 = unbounded)", options.window_right);
  if (options.sm_margin < 0) fail_argument("options.sm_margin", ">= 0 (multiprocessors left free)", options.sm_margin);
  if (options.precision == AttentionPrecision::kFp8 && device.is_cpu())
    fail_argument("options.precision", "the inputs' precision on CPU (FP8 runs on CUDA, compute capability 9.0)", "fp8");
  if (options.fp8_query_key_given && options.precision != AttentionPrecision::kFp8)
    fail_argument("options.fp8_query_key_given", "false unless options.precision is fp8", "true");
  return d;
}

void check_mask(const BlockMaskView& mask, const Dims& d, Device device) {
  if (!(mask.device == device)) fail_argument("mask.device", device.str() + " (as q)", mask.device.str());
  if (mask.seq_q != d.seq_q) fail_argument("mask.seq_q", detail::concat(d.seq_q, " (q's sequence length)"), mask.seq_q);
  if (mask.seq_kv != d.seq_kv)
    fail_argument("mask.seq_kv", detail::concat(d.seq_kv, " (k's sequence length)"), mask.seq_kv);
  if (mask.block_q < 1) fail_argument("mask.block_q", ">= 1", mask.block_q);
  if (mask.block_kv < 1) fail_argument("mask.block_kv", ">= 1", mask.block_kv);
  const int64_t qb = (d.seq_q + mask.block_q - 1) / mask.block_q, kvb = (d.seq_kv + mask.block_kv - 1) / mask.block_kv;
  if (mask.q_blocks != qb) fail_argument("mask.q_blocks", detail::concat(qb, " (ceil(seq_q / block_q))"), mask.q_blocks);
  if (mask.kv_blocks != kvb)
    fail_argument("mask.kv_blocks", detail::concat(kvb, " (ceil(seq_kv / block_kv))"), mask.kv_blocks);
  if (mask.mask_batch != 1 && mask.mask_batch != d.batch)
    fail_argument("mask.mask_batch", detail::concat("1 or ", d.batch), mask.mask_batch);
  if (mask.mask_heads != 1 && mask.mask_heads != d.kv_heads && mask.mask_heads != d.heads)
    fail_argument("mask.mask_heads", detail::concat("1, ", d.kv_heads, " (kv heads) or ", d.heads, " (q heads)"),
                  mask.mask_heads);
  if (mask.indptr == nullptr) fail_argument("mask.indptr", "a pointer", "null");
  if (!device.is_cpu()) return;
  // On the CPU the arrays are readable: reject a malformed view here rather than read out of bounds.
  const int64_t rows = mask.num_rows();
  if (mask.indptr[0] != 0) fail_argument("mask.indptr[0]", "0", mask.indptr[0]);
  if (mask.indptr[rows] > 0 && mask.indices == nullptr) fail_argument("mask.indices", "a pointer", "null");
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t begin = mask.indptr[r], end = mask.indptr[r + 1];
    const auto where = [&] {
      return detail::concat("mask row (batch ", r / (qb * mask.mask_heads), ", head ", (r / qb) % mask.mask_heads,
                            ", q_block ", r % qb, ")");
    };
    if (end < begin) throw Error(where() + detail::concat(": indptr decreases (", begin, " then ", end, ")"));
    for (int32_t n = begin; n < end; ++n) {
      const int32_t id = mask.indices[n];
      if (id < 0 || id >= kvb)
        throw Error(where() + detail::concat(": kv block index ", id, " out of range [0, ", kvb, ")"));
      if (n > begin && id <= mask.indices[n - 1])
        throw Error(where() + detail::concat(": kv block indices not sorted and unique (", mask.indices[n - 1],
                                             " before ", id, ")"));
    }
  }
}

[[noreturn]] void fail_no_cuda(const TensorView& q) {
  fail_argument("q.device", "cpu (tessel was built without CUDA)", q.device().str());
}

}  // namespace

float attention_scale(const AttentionOptions& options, int64_t head_dim) {
  if (options.scale != 0.0f) return options.scale;
  if (head_dim < 1) fail_argument("head_dim", ">= 1", head_dim);
  return 1.0f / std::sqrt(static_cast<float>(head_dim));
}

size_t attention_workspace_bytes(const ExecContext& ctx, Device device, const AttentionDims& dims,
                                 int64_t mask_block_kv) {
  if (!device.is_cpu()) {
#ifdef TESSEL_WITH_CUDA
    if (device.is_cuda() && dims.precision == AttentionPrecision::kFp8) return cuda::fp8_attention_workspace_bytes(dims);
    if (device.is_cuda() && mask_block_kv > 0) return cuda::block_sparse_attention_workspace_bytes(dims);
#endif
    return 0;
  }
  if (dims.batch < 1 || dims.seq_kv < 0 || dims.kv_heads < 1 || dims.heads % dims.kv_heads != 0 || dims.head_dim < 1)
    fail_argument("attention dims", "batch, kv heads and head dim >= 1, heads a multiple of kv heads",
                  detail::concat("B=", dims.batch, " Skv=", dims.seq_kv, " Hq=", dims.heads, " Hkv=", dims.kv_heads,
                                 " D=", dims.head_dim));
  if (mask_block_kv < 0) fail_argument("mask_block_kv", ">= 0 (0 = dense only)", mask_block_kv);
  return cpu::workspace_bytes(ctx.threads(), dims.batch, dims.seq_kv, dims.heads, dims.kv_heads, dims.head_dim,
                              mask_block_kv);
}

Fp8QueryKey fp8_attention_query_key(const ExecContext& ctx, Device device, const AttentionDims& dims) {
#ifdef TESSEL_WITH_CUDA
  if (device.is_cuda()) return cuda::fp8_attention_query_key(ctx, device, dims);
#endif
  (void)ctx;
  (void)dims;
  fail_argument("device", "a CUDA device of a build with CUDA (FP8 attention)", device.str());
}

void attention_forward(const ExecContext& ctx, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                       const TensorView& lse, const AttentionOptions& options) {
  check_attention_args(q, k, v, out, lse, options);
  if (q.device().is_cpu()) return cpu::attention_forward(ctx, q, k, v, out, lse, options);
#ifdef TESSEL_WITH_CUDA
  cuda::attention_forward(ctx, q, k, v, out, lse, options);
#else
  fail_no_cuda(q);
#endif
}

void block_sparse_attention_forward(const ExecContext& ctx, const TensorView& q, const TensorView& k,
                                    const TensorView& v, const BlockMaskView& mask, const TensorView& out, const TensorView& lse,
                                    const AttentionOptions& options) {
  const Dims d = check_attention_args(q, k, v, out, lse, options);
  check_mask(mask, d, q.device());
  if (q.device().is_cpu()) return cpu::block_sparse_attention_forward(ctx, q, k, v, mask, out, lse, options);
#ifdef TESSEL_WITH_CUDA
  cuda::block_sparse_attention_forward(ctx, q, k, v, mask, out, lse, options);
#else
  fail_no_cuda(q);
#endif
}

void merge_attention_states(const ExecContext& ctx, const TensorView& out_a, const TensorView& lse_a, const TensorView& out_b,
                            const TensorView& lse_b, const TensorView& out, const TensorView& lse) {
  const Device device = check_bshd_on_one_device({{out_a, "out_a"}, {out_b, "out_b"}, {out, "out"}});
  check_shape(out_b, out_a.shape(), "out_b");
  check_shape(out, out_a.shape(), "out");
  const Shape lse_shape{out_a.size(0), out_a.size(2), out_a.size(1)};
  check_lse(lse_a, lse_shape, device, "lse_a");
  check_lse(lse_b, lse_shape, device, "lse_b");
  check_lse(lse, lse_shape, device, "lse");
  if (device.is_cpu()) return cpu::merge_attention_states(ctx, out_a, lse_a, out_b, lse_b, out, lse);
#ifdef TESSEL_WITH_CUDA
  cuda::merge_attention_states(ctx, out_a, lse_a, out_b, lse_b, out, lse);
#else
  fail_no_cuda(out_a);
#endif
}

}  // namespace tessel
