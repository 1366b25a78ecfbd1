#include "host_floats.h"

#include "tessel/core/error.h"

namespace tessel::kv {

std::vector<float> to_host_floats(const TensorView& view) {
  check_contiguous(view, "view");
  std::vector<float> result(static_cast<size_t>(view.numel()));
  const TensorView dst(result.data(), DType::kF32, Device::cpu(), view.shape());
  if (view.device().is_cpu()) {
    copy_convert(view, dst);
    return result;
  }
  Tensor staging = Tensor::empty(view.shape(), view.dtype(), Device::cpu());
  copy_bytes(staging.data(), Device::cpu(), view.data(), view.device(), view.nbytes());
  copy_convert(staging.view(), dst);
  return result;
}

}  // namespace tessel::kv
