// Dense attention, block-sparse attention and the merge of partial states. Outputs are allocated
// by the Python layer (with the inputs' framework and device) and written in place here; the
// library validates every argument before it writes anything. The GIL is released while kernels run.
#include <chrono>
#include <cstdint>
#include <optional>

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>

#include "bindings.h"
#include "tensor_arg.h"
#include "tessel/core/error.h"
#include "tessel/core/exec_context.h"
#include "tessel/kernels/attention.h"
#include "tessel/sparse/block_mask.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace tessel::python {
namespace {

// Work runs on the caller's CUDA stream (torch's current stream, passed as its integer handle;
// 0 = the legacy default stream, and the only value CPU work accepts meaningfully).
ExecContext context_on(uintptr_t stream) {
  ExecContext ctx;
  ctx.stream = reinterpret_cast<StreamHandle>(stream);
  return ctx;
}

AttentionOptions attention_options(double scale, bool causal, int64_t window_left, int64_t window_right) {
  return AttentionOptions{static_cast<float>(scale), causal, window_left, window_right};
}

void attention(const ReadOnlyArray& q, const ReadOnlyArray& k, const ReadOnlyArray& v, const AnyArray& out,
               const std::optional<AnyArray>& lse, double scale, bool causal, int64_t window_left,
               int64_t window_right, uintptr_t stream) {
  const TensorView q_view = tensor_view(q, "q"), k_view = tensor_view(k, "k"), v_view = tensor_view(v, "v");
  const TensorView out_view = tensor_view(out, "out"), lse_view = optional_tensor_view(lse, "lse");
  const AttentionOptions options = attention_options(scale, causal, window_left, window_right);
  nb::gil_scoped_release release;
  attention_forward(context_on(stream), q_view, k_view, v_view, out_view, lse_view, options);
}

// The mask arrives as its CSR arrays plus geometry (the form torch custom ops can carry); the
// sequence lengths come from q and k. The arrays' lengths are checked here because the kernels'
// view has none; the library checks the contents of CPU masks row by row.
BlockMaskView csr_mask_view(const TensorView& indptr, const TensorView& indices, const TensorView& q,
                            const TensorView& k, int64_t mask_batch, int64_t mask_heads, int64_t block_q,
                            int64_t block_kv) {
  check_rank(indptr, 1, "mask.indptr");
  check_rank(indices, 1, "mask.indices");
  check_dtype(indptr, DType::kI32, "mask.indptr");
  check_dtype(indices, DType::kI32, "mask.indices");
  check_contiguous(indptr, "mask.indptr");
  check_contiguous(indices, "mask.indices");
  check_device(indptr, q.device(), "mask.indptr");
  check_device(indices, q.device(), "mask.indices");
  if (q.dim() != 4 || k.dim() != 4) fail_argument("q, k", "rank 4 (B, S, H, D)", q.describe() + ", " + k.describe());
  if (block_q < 1) fail_argument("mask.block_q", ">= 1", block_q);
  if (block_kv < 1) fail_argument("mask.block_kv", ">= 1", block_kv);
  if (mask_batch < 1) fail_argument("mask.mask_batch", ">= 1", mask_batch);
  if (mask_heads < 1) fail_argument("mask.mask_heads", ">= 1", mask_heads);
  const BlockMaskShape shape{mask_batch, mask_heads, q.size(1), k.size(1), block_q, block_kv};
  if (q.size(0) > 0 && mask_batch != 1 && mask_batch != q.size(0))
    fail_argument("mask.mask_batch", detail::concat("1 or ", q.size(0)), mask_batch);
  if (mask_heads != 1 && mask_heads != q.size(2) && mask_heads != k.size(2))
    fail_argument("mask.mask_heads", detail::concat("1, ", k.size(2), " or ", q.size(2)), mask_heads);
  if (indptr.numel() != shape.num_rows() + 1)
    fail_argument("mask.indptr", detail::concat(shape.num_rows() + 1, " entries (num_rows + 1)"), indptr.numel());
  if (q.device().is_cpu()) {
    const int32_t nnz = indptr.data_as<const int32_t>()[shape.num_rows()];
    if (nnz < 0 || nnz > indices.numel())
      fail_argument("mask.indptr[num_rows]", detail::concat("in [0, ", indices.numel(), "] (the number of indices)"), nnz);
  }
  return make_block_mask_view(shape, indptr.data_as<const int32_t>(), indices.data_as<const int32_t>(), q.device());
}

void block_sparse_attention(const ReadOnlyArray& q, const ReadOnlyArray& k, const ReadOnlyArray& v,
                            const ReadOnlyArray& indptr, const ReadOnlyArray& indices, int64_t mask_batch,
                            int64_t mask_heads, int64_t block_q, int64_t block_kv, const AnyArray& out,
                            const std::optional<AnyArray>& lse, double scale, bool causal, int64_t window_left,
                            int64_t window_right, uintptr_t stream) {
  const TensorView q_view = tensor_view(q, "q"), k_view = tensor_view(k, "k"), v_view = tensor_view(v, "v");
  const TensorView out_view = tensor_view(out, "out"), lse_view = optional_tensor_view(lse, "lse");
  const BlockMaskView mask = csr_mask_view(tensor_view(indptr, "mask.indptr"), tensor_view(indices, "mask.indices"),
                                           q_view, k_view, mask_batch, mask_heads, block_q, block_kv);
  const AttentionOptions options = attention_options(scale, causal, window_left, window_right);
  nb::gil_scoped_release release;
  block_sparse_attention_forward(context_on(stream), q_view, k_view, v_view, mask, out_view, lse_view, options);
}

// Mean wall time in microseconds of `iterations` consecutive attention_forward calls made from C++
// (no Python in between): the baseline that the binding's per-call overhead is measured against.
// CUDA calls are timed as issued (launch cost), without waiting for the kernels.
double time_attention_calls_us(const ReadOnlyArray& q, const ReadOnlyArray& k, const ReadOnlyArray& v,
                               const AnyArray& out, int64_t iterations) {
  if (iterations < 1) fail_argument("iterations", ">= 1", iterations);
  const TensorView q_view = tensor_view(q, "q"), k_view = tensor_view(k, "k"), v_view = tensor_view(v, "v");
  const TensorView out_view = tensor_view(out, "out");
  nb::gil_scoped_release release;
  const auto start = std::chrono::steady_clock::now();
  const ExecContext ctx = context_on(0);
  for (int64_t i = 0; i < iterations; ++i) attention_forward(ctx, q_view, k_view, v_view, out_view, TensorView{}, {});
  const std::chrono::duration<double, std::micro> elapsed = std::chrono::steady_clock::now() - start;
  return elapsed.count() / static_cast<double>(iterations);
}

void merge_states(const ReadOnlyArray& out_a, const ReadOnlyArray& lse_a, const ReadOnlyArray& out_b,
                  const ReadOnlyArray& lse_b, const AnyArray& out, const AnyArray& lse, uintptr_t stream) {
  const TensorView out_a_view = tensor_view(out_a, "out_a"), lse_a_view = tensor_view(lse_a, "lse_a");
  const TensorView out_b_view = tensor_view(out_b, "out_b"), lse_b_view = tensor_view(lse_b, "lse_b");
  const TensorView out_view = tensor_view(out, "out"), lse_view = tensor_view(lse, "lse");
  nb::gil_scoped_release release;
  merge_attention_states(context_on(stream), out_a_view, lse_a_view, out_b_view, lse_b_view, out_view, lse_view);
}

}  // namespace

void bind_attention(nb::module_& m) {
  m.def("attention_forward", &attention, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a.none(), "scale"_a, "causal"_a,
        "window_left"_a, "window_right"_a, "stream"_a = 0);
  m.def("block_sparse_attention_forward", &block_sparse_attention, "q"_a, "k"_a, "v"_a, "indptr"_a, "indices"_a,
        "mask_batch"_a, "mask_heads"_a, "block_q"_a, "block_kv"_a, "out"_a, "lse"_a.none(), "scale"_a, "causal"_a,
        "window_left"_a, "window_right"_a, "stream"_a = 0);
  m.def("time_attention_calls_us", &time_attention_calls_us, "q"_a, "k"_a, "v"_a, "out"_a, "iterations"_a);
  m.def("merge_states_forward", &merge_states, "out_a"_a, "lse_a"_a, "out_b"_a, "lse_b"_a, "out"_a, "lse"_a, "stream"_a = 0);
}

}  // namespace tessel::python
