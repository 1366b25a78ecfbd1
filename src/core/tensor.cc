#include "tessel/core/tensor.h"

#include <cstring>
#include <sstream>

#include "tessel/core/error.h"

namespace tessel {

std::string shape_str(const Shape& shape) {
  std::ostringstream os;
  os << '(';
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << ')';
  return os.str();
}

namespace {

// a * b for the extents of `shape`, or an Error naming the shape when it does not fit in int64
// (a hostile file can declare extents whose product overflows, even with a zero extent elsewhere).
int64_t checked_product(int64_t a, int64_t b, const Shape& shape) {
  int64_t product = 0;
  if (__builtin_mul_overflow(a, b, &product))
    fail_argument("shape", "extents whose product fits in 64 bits", shape_str(shape));
  return product;
}

}  // namespace

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t running = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = running;
    running = checked_product(running, shape[i], shape);
  }
  return strides;
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n = checked_product(n, s, shape);
  return n;
}

TensorView::TensorView(void* data, DType dtype, Device device, Shape shape, Shape strides)
    : data_(data), dtype_(dtype), device_(device), shape_(std::move(shape)), strides_(std::move(strides)) {
  for (size_t i = 0; i < shape_.size(); ++i)
    if (shape_[i] < 0) fail_argument("shape[" + std::to_string(i) + "]", ">= 0", shape_[i]);
  if (strides_.empty()) strides_ = contiguous_strides(shape_);
  if (strides_.size() != shape_.size())
    fail_argument("strides", detail::concat(shape_.size(), " entries"), strides_.size());
}

int64_t TensorView::size(int64_t axis) const {
  const int64_t n = dim();
  const int64_t a = axis < 0 ? axis + n : axis;
  if (a < 0 || a >= n) fail_argument("axis", detail::concat("in [", -n, ", ", n, ")"), axis);
  return shape_[static_cast<size_t>(a)];
}

int64_t TensorView::stride(int64_t axis) const {
  const int64_t n = dim();
  const int64_t a = axis < 0 ? axis + n : axis;
  if (a < 0 || a >= n) fail_argument("axis", detail::concat("in [", -n, ", ", n, ")"), axis);
  return strides_[static_cast<size_t>(a)];
}

bool TensorView::is_contiguous() const {
  int64_t expected = 1;
  for (size_t i = shape_.size(); i-- > 0;) {
    if (shape_[i] == 1) continue;
    if (strides_[i] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

std::string TensorView::describe() const {
  return detail::concat(dtype_name(dtype_), ' ', device_.str(), ' ', shape_str(shape_),
                        is_contiguous() ? "" : " non-contiguous");
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device, MemoryKind host_kind) {
  Tensor t;
  const size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  t.storage_ = allocate(bytes, device.is_cuda() ? MemoryKind::kDevice : host_kind, device.index);
  t.view_ = TensorView(t.storage_.get(), dtype, device, shape);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  if (device.is_cpu()) {
    std::memset(t.data(), 0, t.nbytes());
  } else {
    Tensor host = zeros(shape, dtype, Device::cpu());
    copy_bytes(t.data(), device, host.data(), Device::cpu(), t.nbytes());
  }
  return t;
}

Tensor Tensor::to(Device device) const {
  check_contiguous(view_, "tensor");
  Tensor out = empty(shape(), dtype(), device);
  copy_bytes(out.data(), device, data(), this->device(), nbytes());
  return out;
}

Tensor Tensor::to(DType dtype) const {
  check_device(view_, Device::cpu(), "tensor");
  Tensor out = empty(shape(), dtype, Device::cpu());
  copy_convert(view_, out.view());
  return out;
}

Tensor Tensor::clone() const { return to(device()); }

namespace {

// Visits every element of a CPU view in row-major logical order, passing its element offset.
template <typename F>
void for_each_offset(const TensorView& v, F&& f) {
  const int64_t n = v.numel();
  const int64_t rank = v.dim();
  std::vector<int64_t> index(static_cast<size_t>(rank), 0);
  int64_t offset = 0;
  for (int64_t i = 0; i < n; ++i) {
    f(i, offset);
    for (int64_t a = rank - 1; a >= 0; --a) {
      const size_t ua = static_cast<size_t>(a);
      ++index[ua];
      offset += v.strides()[ua];
      if (index[ua] < v.shape()[ua]) break;
      offset -= v.strides()[ua] * v.shape()[ua];
      index[ua] = 0;
    }
  }
}

double load(const void* base, DType dtype, int64_t offset) {
  switch (dtype) {
    case DType::kF32: return static_cast<const float*>(base)[offset];
    case DType::kF64: return static_cast<const double*>(base)[offset];
    case DType::kF16: return half_to_float(static_cast<const uint16_t*>(base)[offset]);
    case DType::kBF16: return bf16_to_float(static_cast<const uint16_t*>(base)[offset]);
    case DType::kI32: return static_cast<const int32_t*>(base)[offset];
    case DType::kU8: return static_cast<const uint8_t*>(base)[offset];
  }
  return 0;
}

void store(void* base, DType dtype, int64_t offset, double value) {
  switch (dtype) {
    case DType::kF32: static_cast<float*>(base)[offset] = static_cast<float>(value); return;
    case DType::kF64: static_cast<double*>(base)[offset] = value; return;
    case DType::kF16: static_cast<uint16_t*>(base)[offset] = float_to_half(static_cast<float>(value)); return;
    case DType::kBF16: static_cast<uint16_t*>(base)[offset] = float_to_bf16(static_cast<float>(value)); return;
    case DType::kI32: static_cast<int32_t*>(base)[offset] = static_cast<int32_t>(value); return;
    case DType::kU8: static_cast<uint8_t*>(base)[offset] = static_cast<uint8_t>(value); return;
  }
}

}  // namespace

void copy_convert(const TensorView& src, const TensorView& dst) {
  check_device(src, Device::cpu(), "src");
  check_device(dst, Device::cpu(), "dst");
  check_shape(dst, src.shape(), "dst");
  if (src.is_contiguous() && dst.is_contiguous()) {  // element i at offset i on both sides
    const int64_t n = src.numel();
    if (src.dtype() == DType::kF32 && dst.dtype() == DType::kBF16) {  // the capture and upload path, kept tight
      const float* from = static_cast<const float*>(src.data());
      uint16_t* to = static_cast<uint16_t*>(dst.data());
      for (int64_t i = 0; i < n; ++i) to[i] = float_to_bf16(from[i]);
      return;
    }
    for (int64_t i = 0; i < n; ++i) store(dst.data(), dst.dtype(), i, load(src.data(), src.dtype(), i));
    return;
  }
  std::vector<int64_t> dst_offsets;
  dst_offsets.reserve(static_cast<size_t>(dst.numel()));
  for_each_offset(dst, [&](int64_t, int64_t off) { dst_offsets.push_back(off); });
  // Every source value is exact in double; only the final store rounds (RNE), so the result
  // equals a direct conversion except fp64 -> fp16/bf16, which rounds twice (via fp32).
  for_each_offset(src, [&](int64_t i, int64_t off) {
    store(dst.data(), dst.dtype(), dst_offsets[static_cast<size_t>(i)], load(src.data(), src.dtype(), off));
  });
}

void fill(const TensorView& dst, double value) {
  check_device(dst, Device::cpu(), "dst");
  for_each_offset(dst, [&](int64_t, int64_t off) { store(dst.data(), dst.dtype(), off, value); });
}

double element_as_double(const TensorView& view, int64_t logical_index) {
  check_device(view, Device::cpu(), "view");
  if (logical_index < 0 || logical_index >= view.numel())
    fail_argument("logical_index", detail::concat("in [0, ", view.numel(), ")"), logical_index);
  int64_t offset = 0, rem = logical_index;
  for (int64_t a = view.dim() - 1; a >= 0; --a) {
    const size_t ua = static_cast<size_t>(a);
    offset += (rem % view.shape()[ua]) * view.strides()[ua];
    rem /= view.shape()[ua];
  }
  return load(view.data(), view.dtype(), offset);
}

void check_rank(const TensorView& t, int64_t rank, const std::string& argument) {
  if (t.dim() != rank) fail_argument(argument, detail::concat("rank ", rank), detail::concat("rank ", t.dim(), " ", shape_str(t.shape())));
}

void check_dtype(const TensorView& t, DType dtype, const std::string& argument) {
  if (t.dtype() != dtype) fail_argument(argument, detail::concat("dtype ", dtype_name(dtype)), detail::concat("dtype ", dtype_name(t.dtype())));
}

void check_device(const TensorView& t, Device device, const std::string& argument) {
  if (!(t.device() == device)) fail_argument(argument, detail::concat("device ", device.str()), detail::concat("device ", t.device().str()));
}

void check_contiguous(const TensorView& t, const std::string& argument) {
  if (!t.is_contiguous()) fail_argument(argument, "a contiguous tensor", detail::concat("strides ", shape_str(t.strides()), " for shape ", shape_str(t.shape())));
}

void check_shape(const TensorView& t, const Shape& shape, const std::string& argument) {
  if (t.shape() != shape) fail_argument(argument, detail::concat("shape ", shape_str(shape)), detail::concat("shape ", shape_str(t.shape())));
}

}  // namespace tessel
