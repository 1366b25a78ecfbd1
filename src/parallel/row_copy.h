// Copies between strided views whose innermost dimension is contiguous (rows), on the CPU or on
// ctx.stream of a CUDA device: the packing and unpacking of the parallel strategies' buffers.
#pragma once

#include "tessel/core/exec_context.h"
#include "tessel/core/tensor.h"

namespace tessel::parallel_detail {

// dst = src; same shape, dtype and device; stride 1 in the last dimension of both.
void copy_rows(const ExecContext& ctx, const TensorView& src, const TensorView& dst);
// dst = 0; stride 1 in the last dimension.
void zero_rows(const ExecContext& ctx, const TensorView& dst);
// A view of `t` restricted to [begin, begin + count) along `axis` (same strides).
TensorView narrow(const TensorView& t, int64_t axis, int64_t begin, int64_t count);
// A contiguous view of `shape` over the first bytes of `buffer` (same dtype and device), which must
// be large enough.
TensorView contiguous_prefix(const TensorView& buffer, const Shape& shape);

}  // namespace tessel::parallel_detail

namespace tessel::parallel_detail {

// The view t[index] (the first axis dropped).
TensorView select_first(const TensorView& t, int64_t index);

}  // namespace tessel::parallel_detail
