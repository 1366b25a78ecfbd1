// Row copies for the CPU (memcpy per row) and CUDA (one strided-copy kernel per call, whatever the
// number of rows: cuda/strided_copy.h says why).
#include "row_copy.h"

#include <cstring>

#include "tessel/core/error.h"

#ifdef TESSEL_WITH_CUDA
#include "cuda/strided_copy.h"
#endif

namespace tessel::parallel_detail {
namespace {

void check_rows(const TensorView& t, const std::string& argument) {
  if (t.dim() < 1) fail_argument(argument, "a tensor of rank >= 1", t.describe());
  if (t.size(-1) > 1 && t.stride(-1) != 1)
    fail_argument(argument, "a contiguous innermost dimension", detail::concat("strides ", shape_str(t.strides())));
  if (t.data() == nullptr && t.numel() > 0) fail_argument(argument, "a tensor with data", "a null data pointer");
}

// Calls body(offset in a, offset in b) (elements) for every index of the dimensions before the last
// two of two views of one shape (views of rank 1 are one matrix of one row).
template <typename Body>
void for_each_matrix(const TensorView& a, const TensorView& b, int64_t dim, int64_t offset_a, int64_t offset_b,
                     Body&& body) {
  if (dim >= a.dim() - 2) return body(offset_a, offset_b);
  for (int64_t i = 0; i < a.size(dim); ++i)
    for_each_matrix(a, b, dim + 1, offset_a + i * a.stride(dim), offset_b + i * b.stride(dim), body);
}

struct Matrix {
  int64_t rows, row_stride;
};
Matrix matrix_of(const TensorView& t) {
  if (t.dim() < 2) return {1, t.size(-1)};  // one row; its pitch is its own length
  return {t.size(-2), t.stride(-2)};
}

#ifdef TESSEL_WITH_CUDA
cuda::StridedLayout strided_layout(const TensorView& dst, const TensorView* src) {
  if (dst.dim() > cuda::kMaxStridedRank)
    fail_argument("dst", detail::concat("a view of rank <= ", cuda::kMaxStridedRank, " on CUDA"), dst.describe());
  cuda::StridedLayout layout;
  layout.rank = dst.dim();
  for (int d = 0; d < dst.dim(); ++d) {
    layout.sizes[d] = dst.size(d);
    layout.dst_strides[d] = d + 1 == dst.dim() ? 1 : dst.stride(d);
    layout.src_strides[d] = src == nullptr || d + 1 == dst.dim() ? 1 : src->stride(d);
  }
  return layout;
}
#endif

}  // namespace

void copy_rows(const ExecContext& ctx, const TensorView& src, const TensorView& dst) {
  check_rows(src, "src");
  check_rows(dst, "dst");
  check_shape(dst, src.shape(), "dst");
  check_dtype(dst, src.dtype(), "dst");
  check_device(dst, src.device(), "dst");
  if (src.numel() == 0) return;
  const size_t element = dtype_size(src.dtype()), row_bytes = static_cast<size_t>(src.size(-1)) * element;
  if (!src.device().is_cpu()) {
#ifdef TESSEL_WITH_CUDA
    cuda::copy_strided(ctx.stream, src.data(), dst.data(), strided_layout(dst, &src), static_cast<int>(element));
    return;
#else
    fail_argument("src.device", "cpu (tessel was built without CUDA)", src.device().str());
#endif
  }
  const Matrix s = matrix_of(src), d = matrix_of(dst);
  for_each_matrix(src, dst, 0, 0, 0, [&](int64_t src_offset, int64_t dst_offset) {
    const auto* from = static_cast<const char*>(src.data()) + src_offset * static_cast<int64_t>(element);
    auto* to = static_cast<char*>(dst.data()) + dst_offset * static_cast<int64_t>(element);
    for (int64_t r = 0; r < s.rows; ++r)
      std::memcpy(to + r * d.row_stride * static_cast<int64_t>(element), from + r * s.row_stride * static_cast<int64_t>(element), row_bytes);
  });
}

void zero_rows(const ExecContext& ctx, const TensorView& dst) {
  check_rows(dst, "dst");
  if (dst.numel() == 0) return;
  const size_t element = dtype_size(dst.dtype()), row_bytes = static_cast<size_t>(dst.size(-1)) * element;
  if (!dst.device().is_cpu()) {
#ifdef TESSEL_WITH_CUDA
    cuda::zero_strided(ctx.stream, dst.data(), strided_layout(dst, nullptr), static_cast<int>(element));
    return;
#else
    fail_argument("dst.device", "cpu (tessel was built without CUDA)", dst.device().str());
#endif
  }
  const Matrix d = matrix_of(dst);
  for_each_matrix(dst, dst, 0, 0, 0, [&](int64_t offset, int64_t) {
    auto* to = static_cast<char*>(dst.data()) + offset * static_cast<int64_t>(element);
    for (int64_t r = 0; r < d.rows; ++r) std::memset(to + r * d.row_stride * static_cast<int64_t>(element), 0, row_bytes);
  });
}

TensorView narrow(const TensorView& t, int64_t axis, int64_t begin, int64_t count) {
  if (axis < 0 || axis >= t.dim()) fail_argument("axis", detail::concat("in [0, ", t.dim(), ")"), axis);
  if (begin < 0 || count < 0 || begin + count > t.size(axis))
    fail_argument("range", detail::concat("inside [0, ", t.size(axis), ") along axis ", axis),
                  detail::concat("[", begin, ", ", begin + count, ")"));
  Shape shape = t.shape();
  shape[static_cast<size_t>(axis)] = count;
  auto* data = static_cast<char*>(t.data()) + begin * t.stride(axis) * static_cast<int64_t>(dtype_size(t.dtype()));
  return TensorView(data, t.dtype(), t.device(), shape, t.strides());
}

TensorView contiguous_prefix(const TensorView& buffer, const Shape& shape) {
  const TensorView view(buffer.data(), buffer.dtype(), buffer.device(), shape);
  if (view.nbytes() > buffer.nbytes())
    fail_argument("shape", detail::concat("at most ", buffer.nbytes(), " bytes (the buffer)"), shape_str(shape));
  return view;
}

}  // namespace tessel::parallel_detail

namespace tessel::parallel_detail {

TensorView select_first(const TensorView& t, int64_t index) {
  const TensorView one = narrow(t, 0, index, 1);
  Shape shape(one.shape().begin() + 1, one.shape().end());
  Shape strides(one.strides().begin() + 1, one.strides().end());
  return TensorView(one.data(), one.dtype(), one.device(), shape, strides);
}

}  // namespace tessel::parallel_detail
