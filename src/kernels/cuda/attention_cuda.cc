// CUDA entry points behind include/tessel/kernels/attention.h. attention.cc has already checked
// ranks, shapes, dtypes and devices; here come the checks that only the CUDA kernels need
// (head dim, element type, unit stride on D, 16-byte alignment, 32-bit sizes), then the launch on
// ctx.stream. Nothing here synchronizes with the host.
#include <cmath>
#include <cstdint>
#include <string>

#include "cuda/attention_cuda.h"
#include "cuda/flash_params.h"
#include "cuda/attention_tuning_cuda.h"
#include "cuda/hopper/flash_forward_hopper.h"
#include "cuda/hopper/fp8_operands.h"
#include "cuda/hopper/work_order.h"
#include "cuda/merge_states.h"
#include "tessel/kernels/cuda/launch_check.h"
#include "tessel/core/error.h"

namespace tessel::cuda {

namespace {

constexpr int64_t kMaxTokens = int64_t{1} << 29;

void check_on_cuda(const TensorView& t, const std::string& argument) {
  if (!t.device().is_cuda()) fail_argument(argument, "a CUDA tensor", t.describe());
}

// q/k/v/out: 16-bit elements, unit stride along D, 16-byte aligned base and row strides (cp.async
// and the 16-byte output stores move 8 elements at a time).
void check_attention_operand(const TensorView& t, const std::string& argument) {
  check_on_cuda(t, argument);
  if (t.dtype() != DType::kBF16 && t.dtype() != DType::kF16)
    fail_argument(argument, "dtype bf16 or fp16 on CUDA", dtype_name(t.dtype()));
  if (t.dim() != 4) fail_argument(argument, "rank 4 (B, S, H, D)", t.describe());
  if (t.stride(3) != 1) fail_argument(argument, "unit stride along the head dim (D contiguous)", t.stride(3));
  for (int axis = 0; axis < 3; ++axis)
    if (t.size(axis) > 1 && t.stride(axis) % 8 != 0)
      fail_argument(argument, tessel::detail::concat("strides that are multiples of 8 elements (16 bytes); stride(", axis, ")"),
                    t.stride(axis));
  if (reinterpret_cast<uintptr_t>(t.data()) % 16 != 0)
    fail_argument(argument, "a data pointer aligned to 16 bytes", reinterpret_cast<uintptr_t>(t.data()));
  if (t.size(1) >= kMaxTokens) fail_argument(argument, tessel::detail::concat("fewer than ", kMaxTokens, " tokens"), t.size(1));
}

void check_lse(const TensorView& lse, const TensorView& q) {
  if (lse.empty()) return;
  check_on_cuda(lse, "lse");
  if (lse.dtype() != DType::kF32) fail_argument("lse", "dtype fp32", dtype_name(lse.dtype()));
  if (!lse.is_contiguous()) fail_argument("lse", "a contiguous (B, H, S_q) tensor", lse.describe());
}

// mask: the block mask, nullptr for dense attention.
detail::FlashParams make_params(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                                const TensorView& lse, const AttentionOptions& options, const BlockMaskView* mask) {
  check_attention_operand(q, "q");
  check_attention_operand(k, "k");
  check_attention_operand(v, "v");
  check_attention_operand(out, "out");
  check_lse(lse, q);
  const int64_t head_dim = q.size(3);
  // 96, 192 and 256 run only in the Hopper kernel (for block masks: whole blocks, query blocks a
  // multiple of its 128 rows); the sm_80 kernel has 64 and 128.
  const bool hopper_mask = mask == nullptr || mask->sub_block_bits == nullptr;
  const bool hopper_only = head_dim == 96 || head_dim == 192 || head_dim == 256;
  const bool supported =
      head_dim == 64 || head_dim == 128 ||
      (hopper_only && hopper_mask &&
       detail::flash_forward_hopper_fits(static_cast<int>(head_dim), mask != nullptr,
                                         mask != nullptr ? static_cast<int>(mask->block_q) : 0));
  if (!supported)
    fail_argument("q",
                  "head dim 64 or 128 on CUDA (96, 192 and 256 on compute capability 9.0 with a build for sm_90a, "
                  "block masks of whole blocks with block_q a multiple of 128)",
                  head_dim);
  if (k.dtype() != q.dtype() || v.dtype() != q.dtype() || out.dtype() != q.dtype())
    fail_argument("k, v, out", tessel::detail::concat("the dtype of q (", dtype_name(q.dtype()), ")"),
                  tessel::detail::concat(dtype_name(k.dtype()), ", ", dtype_name(v.dtype()), ", ", dtype_name(out.dtype())));
  for (const TensorView* t : {&k, &v, &out, &lse})
    if (!t->empty() && t->device() != q.device())
      fail_argument("k, v, out, lse", "the device of q (" + q.device().str() + ")", t->device().str());
  const float scale = attention_scale(options, head_dim);
  if (!(scale > 0.f) || !std::isfinite(scale)) fail_argument("options.scale", "a finite value > 0 on CUDA", scale);

  detail::FlashParams p{};
  p.q = q.data();
  p.k = k.data();
  p.v = v.data();
  p.out = out.data();
  p.lse = lse.empty() ? nullptr : lse.data_as<float>();
  p.q_stride_b = q.stride(0), p.q_stride_s = q.stride(1), p.q_stride_h = q.stride(2);
  p.k_stride_b = k.stride(0), p.k_stride_s = k.stride(1), p.k_stride_h = k.stride(2);
  p.v_stride_b = v.stride(0), p.v_stride_s = v.stride(1), p.v_stride_h = v.stride(2);
  p.o_stride_b = out.stride(0), p.o_stride_s = out.stride(1), p.o_stride_h = out.stride(2);
  p.seq_q = static_cast<int>(q.size(1));
  p.seq_kv = static_cast<int>(k.size(1));
  p.heads_q = static_cast<int>(q.size(2));
  p.group = static_cast<int>(q.size(2) / k.size(2));
  p.scale_log2 = scale * 1.4426950408889634f;
  p.sm_margin = options.sm_margin;

  // Visibility limits of attention.h as offsets from the query index (bottom-right aligned).
  // Windows wider than both sequences are no limit at all (and keep the int arithmetic small).
  const int64_t shift = k.size(1) - q.size(1);
  const int64_t span = q.size(1) + k.size(1);
  const bool has_right = options.window_right >= 0 && options.window_right < span;
  const bool has_left = options.window_left >= 0 && options.window_left < span;
  p.has_hi = options.causal || has_right;
  p.hi_offset = static_cast<int>(options.causal ? shift : (has_right ? shift + options.window_right : 0));
  p.has_lo = has_left;
  p.lo_offset = static_cast<int>(has_left ? shift - options.window_left : 0);
  return p;
}

detail::Fp8Shape fp8_shape_of(const AttentionDims& dims) {
  return {dims.batch, dims.seq_q, dims.seq_kv, dims.heads, dims.kv_heads, dims.head_dim};
}

// The FP8 mode's limits: head dim 128 and the Hopper kernel (block masks of whole blocks whose
// block_q is a multiple of its 128 rows). mask: nullptr for dense attention.
void check_fp8_supported(const TensorView& q, const BlockMaskView* mask) {
  if (q.size(3) != 128)
    fail_argument("options.precision", "fp8 with head dim 128", tessel::detail::concat("fp8 with head dim ", q.size(3)));
  const bool whole_blocks = mask == nullptr || mask->sub_block_bits == nullptr;
  if (!whole_blocks || !detail::flash_forward_hopper_fits(128, mask != nullptr, mask != nullptr ? static_cast<int>(mask->block_q) : 0))
    fail_argument("options.precision",
                  "fp8 on a compute capability 9.0 device of a build with sm_90a code (block masks: whole blocks, "
                  "block_q a multiple of 128)",
                  "fp8 on this device or mask");
}

// The quantized operands' slices of ctx.workspace, after the schedule's room.
detail::Fp8Operands fp8_operands_in_workspace(const ExecContext& ctx, Device device, AttentionDims dims) {
  dims.precision = AttentionPrecision::kFp8;
  const size_t needed = fp8_attention_workspace_bytes(dims);
  if (ctx.workspace == nullptr || ctx.workspace->device() != device || ctx.workspace->capacity() < needed)
    fail_argument("ctx.workspace",
                  tessel::detail::concat("a workspace on ", device.str(), " of at least ", needed,
                                         " bytes for fp8 (attention_workspace_bytes with dims.precision fp8)"),
                  ctx.workspace == nullptr ? std::string("none")
                                           : tessel::detail::concat(ctx.workspace->capacity(), " bytes on ",
                                                                    ctx.workspace->device().str()));
  WorkspaceSlicer slicer(*ctx.workspace);
  slicer.take_bytes(detail::work_order_bytes(dims.batch, dims.seq_q, dims.heads), "work order");
  return detail::take_fp8_operands(slicer.rest(), fp8_shape_of(dims));
}

detail::Fp8Operands fp8_operands_in_workspace(const ExecContext& ctx, const TensorView& q, const TensorView& k) {
  return fp8_operands_in_workspace(ctx, q.device(),
                                   AttentionDims{q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3)});
}

// The Hopper kernel variant this call's class was tuned to (attention_tuning.h).
detail::HopperVariant chosen_variant(const TensorView& q, const TensorView& k, const detail::FlashParams& p, bool sparse) {
  return detail::chosen_hopper_variant(detail::CallClass{q.device().index, static_cast<int>(q.size(3)), q.dtype(), sparse,
                                                         p.has_hi || p.has_lo, q.size(1), k.size(1)});
}

}  // namespace

size_t block_sparse_attention_workspace_bytes(const AttentionDims& dims) {
  return detail::work_order_bytes(dims.batch, dims.seq_q, dims.heads);
}

size_t fp8_attention_workspace_bytes(const AttentionDims& dims) {
  return detail::work_order_bytes(dims.batch, dims.seq_q, dims.heads) + kWorkspaceAlignment +
         detail::fp8_operand_bytes(fp8_shape_of(dims));
}

Fp8QueryKey fp8_attention_query_key(const ExecContext& ctx, Device device, const AttentionDims& dims) {
  if (dims.head_dim != 128) fail_argument("dims.head_dim", "128 (the FP8 mode's head dim)", dims.head_dim);
  const detail::Fp8Operands o = fp8_operands_in_workspace(ctx, device, dims);
  return Fp8QueryKey{o.q, o.q_scale, o.k, o.k_scale};
}

void attention_forward(const ExecContext& ctx, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                       const TensorView& lse, const AttentionOptions& options) {
  const detail::FlashParams p = make_params(q, k, v, out, lse, options, nullptr);
  const bool fp8 = options.precision == AttentionPrecision::kFp8;
  if (fp8) check_fp8_supported(q, nullptr);
  const detail::Fp8Operands fp8_operands = fp8 ? fp8_operands_in_workspace(ctx, q, k) : detail::Fp8Operands{};
  if (q.size(0) == 0 || q.size(1) == 0 || q.size(2) == 0) return;
  const int head_dim = static_cast<int>(q.size(3)), batch = static_cast<int>(q.size(0));
  if (fp8)
    detail::launch_flash_forward_hopper_fp8(p, q.dtype(), false, batch, static_cast<int>(k.size(2)), {}, fp8_operands,
                                            detail::chosen_hopper_fp8_variant(q.device().index),
                                            !options.fp8_query_key_given, ctx.stream);
  else if (detail::flash_forward_hopper_fits(head_dim, false, 0))
    detail::launch_flash_forward_hopper(p, q.dtype(), head_dim, false, batch, static_cast<int>(k.size(2)), {},
                                        chosen_variant(q, k, p, false), ctx.stream);
  else
    detail::launch_flash_forward_dense(p, q.dtype(), head_dim, batch, ctx.stream);
  check_launch("attention_forward");
}

void block_sparse_attention_forward(const ExecContext& ctx, const TensorView& q, const TensorView& k,
                                    const TensorView& v, const BlockMaskView& mask, const TensorView& out, const TensorView& lse,
                                    const AttentionOptions& options) {
  detail::FlashParams p = make_params(q, k, v, out, lse, options, &mask);
  if (!mask.device.is_cuda() || mask.device != q.device())
    fail_argument("mask", "a block mask on the device of q (" + q.device().str() + ")", mask.device.str());
  if (mask.block_q % 64 != 0) fail_argument("mask.block_q", "a multiple of 64 on CUDA", mask.block_q);
  int sub_shift = 0;
  while ((int64_t{64} << sub_shift) < mask.block_kv && sub_shift < 20) ++sub_shift;
  if ((int64_t{64} << sub_shift) != mask.block_kv)
    fail_argument("mask.block_kv", "64 times a power of two (64, 128, 256, ...) on CUDA", mask.block_kv);
  if (mask.indptr == nullptr || mask.indices == nullptr)
    fail_argument("mask", "device indptr and indices", "a null pointer");
  const int64_t heads_q = q.size(2), heads_kv = k.size(2);
  p.indptr = mask.indptr;
  p.indices = mask.indices;
  p.mask_batch = static_cast<int>(mask.mask_batch);
  p.mask_heads = static_cast<int>(mask.mask_heads);
  p.mask_head_div = mask.mask_heads == heads_q ? 1 : static_cast<int>(heads_q / heads_kv);
  p.q_blocks = static_cast<int>(mask.q_blocks);
  p.block_q = static_cast<int>(mask.block_q);
  p.block_kv = static_cast<int>(mask.block_kv);
  p.sub_shift = sub_shift;
  p.sub_block_bits = mask.sub_block_bits;
  p.sub_block_words = static_cast<int>(mask.sub_block_words());
  const bool fp8 = options.precision == AttentionPrecision::kFp8;
  if (fp8) check_fp8_supported(q, &mask);
  const detail::Fp8Operands fp8_operands = fp8 ? fp8_operands_in_workspace(ctx, q, k) : detail::Fp8Operands{};
  if (q.size(0) == 0 || q.size(1) == 0 || q.size(2) == 0) return;
  const int head_dim = static_cast<int>(q.size(3)), batch = static_cast<int>(q.size(0));
  // Sub-block masks run on the sm_80 kernel on every GPU (the Hopper kernel computes whole blocks).
  if (fp8) {
    const detail::WorkOrder order = detail::take_work_order(ctx, q.device(), batch, p.seq_q, p.heads_q);
    detail::launch_flash_forward_hopper_fp8(p, q.dtype(), true, batch, static_cast<int>(heads_kv), order, fp8_operands,
                                            detail::chosen_hopper_fp8_variant(q.device().index),
                                            !options.fp8_query_key_given, ctx.stream);
  } else if (mask.sub_block_bits == nullptr && detail::flash_forward_hopper_fits(head_dim, true, p.block_q)) {
    const detail::WorkOrder order = detail::take_work_order(ctx, q.device(), batch, p.seq_q, p.heads_q);
    detail::launch_flash_forward_hopper(p, q.dtype(), head_dim, true, batch, static_cast<int>(heads_kv), order,
                                        chosen_variant(q, k, p, true), ctx.stream);
  } else {
    const int block_m = mask.block_q % 128 == 0 ? 128 : 64;
    detail::launch_flash_forward_sparse(p, q.dtype(), head_dim, block_m, batch, ctx.stream);
  }
  check_launch("block_sparse_attention_forward");
}

void merge_attention_states(const ExecContext& ctx, const TensorView& out_a, const TensorView& lse_a, const TensorView& out_b,
                            const TensorView& lse_b, const TensorView& out, const TensorView& lse) {
  const struct {
    const TensorView* t;
    const char* name;
  } operands[] = {{&out_a, "out_a"}, {&lse_a, "lse_a"}, {&out_b, "out_b"}, {&lse_b, "lse_b"}, {&out, "out"}, {&lse, "lse"}};
  for (const auto& o : operands) {
    if (o.t->empty() && o.t == &lse) continue;
    check_on_cuda(*o.t, o.name);
    const bool is_lse = o.t == &lse_a || o.t == &lse_b || o.t == &lse;
    // Outputs may be token ranges of batched buffers (a ring step's rows); each row of D contiguous.
    if (is_lse ? !o.t->is_contiguous() : (o.t->dim() != 4 || (o.t->size(3) > 1 && o.t->stride(3) != 1)))
      fail_argument(o.name, is_lse ? "a contiguous tensor on CUDA" : "a (B, S, H, D) view with D contiguous on CUDA", o.t->describe());
    if (o.t->device() != out_a.device())
      fail_argument(o.name, "the device of out_a (" + out_a.device().str() + ")", o.t->device().str());
  }
  for (const auto& o : operands) {
    const bool is_lse = o.t == &lse_a || o.t == &lse_b || o.t == &lse;
    if (o.t->empty()) continue;
    if (is_lse && o.t->dtype() != DType::kF32) fail_argument(o.name, "dtype fp32", dtype_name(o.t->dtype()));
    if (!is_lse && o.t->dtype() != DType::kF32 && o.t->dtype() != DType::kF16 && o.t->dtype() != DType::kBF16)
      fail_argument(o.name, "dtype fp32, fp16 or bf16", dtype_name(o.t->dtype()));
  }
  detail::MergeParams p{};
  p.out_a = out_a.data();
  p.out_b = out_b.data();
  p.out = out.data();
  p.lse_a = lse_a.data_as<float>();
  p.lse_b = lse_b.data_as<float>();
  p.lse = lse.empty() ? nullptr : lse.data_as<float>();
  p.dtype_a = out_a.dtype();
  p.dtype_b = out_b.dtype();
  p.dtype_out = out.dtype();
  p.batch = out_a.size(0);
  p.seq = out_a.size(1);
  p.heads = out_a.size(2);
  p.head_dim = out_a.size(3);
  for (int axis = 0; axis < 3; ++axis) {
    p.strides_a[axis] = out_a.stride(axis);
    p.strides_b[axis] = out_b.stride(axis);
    p.strides_out[axis] = out.stride(axis);
  }
  detail::launch_merge_attention_states(p, ctx.stream);
  check_launch("merge_attention_states");
}

}  // namespace tessel::cuda
