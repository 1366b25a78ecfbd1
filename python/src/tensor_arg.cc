#include "tensor_arg.h"

#include "tessel/core/error.h"

namespace nb = nanobind;

namespace tessel::python {
namespace {

// DLPack device types tessel can address (dlpack.h: kDLCPU 1, kDLCUDA 2, kDLCUDAHost 3).
constexpr int kDlpackCpu = 1;
constexpr int kDlpackCuda = 2;
constexpr int kDlpackCudaHost = 3;

DType tessel_dtype(nb::dlpack::dtype dtype, const std::string& argument) {
  const auto code = static_cast<nb::dlpack::dtype_code>(dtype.code);
  if (dtype.lanes != 1) fail_argument(argument, "a scalar element type (1 lane)", detail::concat(dtype.lanes, " lanes"));
  using Code = nb::dlpack::dtype_code;
  if (code == Code::Float && dtype.bits == 32) return DType::kF32;
  if (code == Code::Float && dtype.bits == 16) return DType::kF16;
  if (code == Code::Float && dtype.bits == 64) return DType::kF64;
  if (code == Code::Bfloat && dtype.bits == 16) return DType::kBF16;
  if (code == Code::Int && dtype.bits == 32) return DType::kI32;
  if ((code == Code::UInt || code == Code::Bool) && dtype.bits == 8) return DType::kU8;
  static constexpr const char* kCodeNames[] = {"int", "uint", "float", "opaque", "bfloat", "complex", "bool"};
  const std::string name = dtype.code < 7 ? kCodeNames[dtype.code] : "code " + std::to_string(dtype.code);
  fail_argument(argument, "dtype float32, float16, bfloat16, float64, int32, uint8 or bool",
                detail::concat(name, dtype.bits));
}

Device tessel_device(int device_type, int device_id, const std::string& argument) {
  if (device_type == kDlpackCpu || device_type == kDlpackCudaHost) return Device::cpu();
  if (device_type == kDlpackCuda) return Device::cuda(device_id);
  fail_argument(argument, "a CPU or CUDA tensor", detail::concat("DLPack device type ", device_type));
}

template <typename Array>
TensorView view_of(const Array& array, const std::string& argument) {
  const DType dtype = tessel_dtype(array.dtype(), argument);
  const Device device = tessel_device(array.device_type(), array.device_id(), argument);
  Shape shape(array.ndim()), strides(array.ndim());
  for (size_t axis = 0; axis < array.ndim(); ++axis) {
    shape[axis] = static_cast<int64_t>(array.shape(axis));
    strides[axis] = array.stride(axis);
    // Kernels address elements as base + index · stride with non-negative strides.
    if (strides[axis] < 0)
      fail_argument(argument, "non-negative strides", detail::concat("strides with ", strides[axis], " on axis ", axis));
  }
  return TensorView(const_cast<void*>(static_cast<const void*>(array.data())), dtype, device, std::move(shape),
                    std::move(strides));
}

}  // namespace

TensorView tensor_view(const AnyArray& array, const std::string& argument) { return view_of(array, argument); }
TensorView tensor_view(const ReadOnlyArray& array, const std::string& argument) { return view_of(array, argument); }

TensorView optional_tensor_view(const std::optional<AnyArray>& array, const std::string& argument) {
  return array ? view_of(*array, argument) : TensorView{};
}

}  // namespace tessel::python
