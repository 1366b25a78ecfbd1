#include "quality/qkv_file.h"

#include "tessel/core/error.h"
#include "tessel/core/finite_check.h"
#include "tessel/core/io/safetensors.h"

namespace tessel {

QkvTensors load_qkv_safetensors(const std::string& path) {
  const SafetensorsFile file = SafetensorsFile::open(path);
  for (const char* name : {"q", "k", "v"}) {
    const SafetensorsEntry* e = file.find(name);
    if (e == nullptr) fail_argument(path, detail::concat("a tensor named '", name, "' (BSHD)"), "none");
    if (e->shape.size() != 4) fail_argument(path + ": tensor '" + name + "' rank", "4 (B, S, H, D)", shape_str(e->shape));
    if (e->dtype != DType::kF32 && e->dtype != DType::kF16 && e->dtype != DType::kBF16)
      fail_argument(path + ": tensor '" + name + "' dtype", "F32, F16 or BF16", dtype_name(e->dtype));
  }
  const Shape& q = file.find("q")->shape;
  const Shape& k = file.find("k")->shape;
  const Shape& v = file.find("v")->shape;
  if (k != v) fail_argument(path + ": tensor 'v' shape", shape_str(k) + " (as k)", shape_str(v));
  if (k[0] != q[0] || k[3] != q[3]) fail_argument(path + ": tensor 'k' batch and head_dim", shape_str(q) + "'s", shape_str(k));
  if (q[1] < 1 || k[1] < 1 || q[3] < 1 || k[2] < 1 || q[2] % k[2] != 0)
    fail_argument(path + ": q/k heads and sizes", "non-empty, H_q a multiple of H_kv", shape_str(q) + " / " + shape_str(k));
  QkvTensors out{file.load("q"), file.load("k"), file.load("v")};
  // Captured tensors with NaN or infinities would give NaN metrics (or a perfect-looking score).
  for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"q", &out.q}, {"k", &out.k}, {"v", &out.v}})
    check_finite(t->view(), path + ": tensor '" + name + "'");
  return out;
}

}  // namespace tessel
