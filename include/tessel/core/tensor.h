// TensorView (non-owning) and Tensor (owning). Shapes and strides count elements, not bytes,
// like DLPack and PyTorch. Attention tensors are BSHD: (batch, seq, heads, head_dim).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "tessel/core/allocator.h"
#include "tessel/core/device.h"
#include "tessel/core/dtype.h"

namespace tessel {

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& shape);  // "(1, 128, 8, 64)"
// Both throw Error naming the shape when a product of its extents overflows int64.
Shape contiguous_strides(const Shape& shape);
int64_t shape_numel(const Shape& shape);

class TensorView {
 public:
  TensorView() = default;
  TensorView(void* data, DType dtype, Device device, Shape shape, Shape strides = {});

  void* data() const { return data_; }
  template <typename T> T* data_as() const { return static_cast<T*>(data_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t size(int64_t axis) const;   // negative axis counts from the end
  int64_t stride(int64_t axis) const;
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  bool is_contiguous() const;
  // True for a default-constructed view (used for "no tensor", e.g. an omitted lse).
  bool empty() const { return data_ == nullptr && shape_.empty(); }
  std::string describe() const;  // "bf16 cuda:0 (1, 128, 8, 64)"

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::kF32;
  Device device_{};
  Shape shape_;
  Shape strides_;
};

class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::cpu(),
                      MemoryKind host_kind = MemoryKind::kHost);
  static Tensor zeros(const Shape& shape, DType dtype, Device device = Device::cpu());

  const TensorView& view() const { return view_; }
  operator const TensorView&() const { return view_; }
  void* data() const { return view_.data(); }
  template <typename T> T* data_as() const { return view_.data_as<T>(); }
  DType dtype() const { return view_.dtype(); }
  Device device() const { return view_.device(); }
  const Shape& shape() const { return view_.shape(); }
  int64_t size(int64_t axis) const { return view_.size(axis); }
  int64_t numel() const { return view_.numel(); }
  size_t nbytes() const { return view_.nbytes(); }
  bool defined() const { return storage_ != nullptr; }

  Tensor to(Device device) const;       // copy to another device (same dtype)
  Tensor to(DType dtype) const;         // CPU only: convert element type (RNE)
  Tensor clone() const;

 private:
  std::shared_ptr<void> storage_;
  TensorView view_;
};

// Copies (and converts dtype of) a CPU view element-wise into another CPU view of the same shape.
void copy_convert(const TensorView& src, const TensorView& dst);
// Fills a CPU floating view with one value (e.g. NaN to poison an output before a test).
void fill(const TensorView& dst, double value);
// Reads element i (row-major logical index) of a CPU floating view as double.
double element_as_double(const TensorView& view, int64_t logical_index);

// Argument checks shared by all entry points; each throws Error naming `argument`.
void check_rank(const TensorView& t, int64_t rank, const std::string& argument);
void check_dtype(const TensorView& t, DType dtype, const std::string& argument);
void check_device(const TensorView& t, Device device, const std::string& argument);
void check_contiguous(const TensorView& t, const std::string& argument);
void check_shape(const TensorView& t, const Shape& shape, const std::string& argument);

}  // namespace tessel
