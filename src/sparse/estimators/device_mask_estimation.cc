// Host side of the device estimators: argument checks, workspace, launches (CUDA builds); a clear
// error otherwise.
#include "tessel/sparse/estimators/device_mask_estimation.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "tessel/core/error.h"

#ifdef TESSEL_WITH_CUDA
#include "kernels/cuda/stream.h"
#include "kernels/cuda/topk_estimation.h"
#endif

namespace tessel {

#ifdef TESSEL_WITH_CUDA

DeviceEstimatedMask::DeviceEstimatedMask(const BlockMaskShape& shape, int64_t kv_heads, int64_t head_dim,
                                         Device device)
    : shape_(shape), kv_heads_(kv_heads), head_dim_(head_dim), device_(device) {
  if (!device.is_cuda()) fail_argument("device", "a CUDA device", device.str());
  if (shape.block_q < 1 || shape.block_kv < 1 || shape.seq_q < 1 || shape.seq_kv < 1)
    fail_argument("shape", "positive sequence lengths and block sizes",
                  detail::concat(shape.seq_q, "x", shape.seq_kv, " blocks ", shape.block_q, "x", shape.block_kv));
  if (kv_heads < 1 || shape.mask_heads % kv_heads != 0)
    fail_argument("kv_heads", detail::concat("a divisor of mask_heads ", shape.mask_heads), kv_heads);
  if (head_dim < 32 || head_dim > 256 || head_dim % 32 != 0)
    fail_argument("head_dim", "a multiple of 32 up to 256 on CUDA", head_dim);
  if (shape.kv_blocks() > cuda::detail::kTopkMaxKvBlocks)
    fail_argument("shape", detail::concat("at most ", cuda::detail::kTopkMaxKvBlocks, " kv blocks"), shape.kv_blocks());
  const int64_t rows = shape.num_rows(), kvb = shape.kv_blocks(), qb = shape.q_blocks();
  indptr_ = Tensor::empty({rows + 1}, DType::kI32, device);
  indices_ = Tensor::empty({rows * kvb}, DType::kI32, device);
  pooled_q_ = Tensor::empty({rows, head_dim}, DType::kF32, device);
  similar_q_ = Tensor::empty({rows}, DType::kU8, device);
  pooled_k_ = Tensor::empty({shape.mask_batch * kv_heads * kvb, head_dim}, DType::kF32, device);
  similar_k_ = Tensor::empty({shape.mask_batch * kv_heads * kvb}, DType::kU8, device);
  row_counts_ = Tensor::empty({rows}, DType::kI32, device);
  row_blocks_ = Tensor::empty({rows * kvb}, DType::kI32, device);
  (void)qb;
}

BlockMaskView DeviceEstimatedMask::view() const {
  BlockMaskView v;
  v.indptr = indptr_.data_as<const int32_t>();
  v.indices = indices_.data_as<const int32_t>();
  v.mask_batch = shape_.mask_batch;
  v.mask_heads = shape_.mask_heads;
  v.q_blocks = shape_.q_blocks();
  v.kv_blocks = shape_.kv_blocks();
  v.block_q = shape_.block_q;
  v.block_kv = shape_.block_kv;
  v.seq_q = shape_.seq_q;
  v.seq_kv = shape_.seq_kv;
  v.device = device_;
  return v;
}

BlockMask DeviceEstimatedMask::to_host() const {
  const Tensor indptr = indptr_.to(Device::cpu());
  const Tensor indices = indices_.to(Device::cpu());
  const int32_t* p = indptr.data_as<const int32_t>();
  const int64_t rows = shape_.num_rows();
  std::vector<int32_t> host_indptr(p, p + rows + 1);
  const int32_t* i = indices.data_as<const int32_t>();
  std::vector<int32_t> host_indices(i, i + host_indptr.back());
  return BlockMask::from_csr(shape_, std::move(host_indptr), std::move(host_indices));
}

namespace {
void check_operand(const TensorView& t, const char* name) {
  if (!t.device().is_cuda()) fail_argument(name, "a CUDA tensor", t.describe());
  if (t.dim() != 4) fail_argument(name, "rank 4 (B, S, H, D)", t.describe());
  if (t.dtype() != DType::kBF16 && t.dtype() != DType::kF16)
    fail_argument(name, "dtype bf16 or fp16 on CUDA", dtype_name(t.dtype()));
  if (t.stride(3) != 1) fail_argument(name, "unit stride along the head dim", t.stride(3));
}
}  // namespace

void estimate_topk_mask_device(const TensorView& q, const TensorView& k, const TopkEstimatorOptions& options,
                               DeviceEstimatedMask& mask) {
  check_operand(q, "q");
  check_operand(k, "k");
  if (k.dtype() != q.dtype()) fail_argument("k", detail::concat("the dtype of q (", dtype_name(q.dtype()), ")"), dtype_name(k.dtype()));
  if (k.device() != q.device() || mask.device_ != q.device())
    fail_argument("k, mask", "the device of q (" + q.device().str() + ")", k.device().str() + ", " + mask.device_.str());
  const BlockMaskShape want{q.size(0), q.size(2), q.size(1), k.size(1), options.block_q, options.block_kv};
  if (!(mask.shape_ == want) || mask.kv_heads_ != k.size(2) || mask.head_dim_ != q.size(3))
    fail_argument("mask", "a DeviceEstimatedMask allocated for these q, k and block sizes",
                  detail::concat("mask for ", mask.shape_.mask_batch, "x", mask.shape_.mask_heads, " S ", mask.shape_.seq_q,
                                 "/", mask.shape_.seq_kv, " blocks ", mask.shape_.block_q, "x", mask.shape_.block_kv));
  if (k.size(0) != q.size(0) || k.size(3) != q.size(3) || q.size(2) % k.size(2) != 0)
    fail_argument("k", "the batch and head dim of q and a divisor of its heads", k.describe());
  if (options.cdf_threshold > 1.0 || std::isnan(options.cdf_threshold))
    fail_argument("topk.cdf_threshold", "<= 1 (<= 0 for top-k mode)", options.cdf_threshold);
  if (options.cdf_threshold <= 0.0 && !(options.topk_ratio > 0.0 && options.topk_ratio <= 1.0))
    fail_argument("topk.topk_ratio", "in (0, 1]", options.topk_ratio);
  if (options.keep.sink_blocks < 0) fail_argument("topk.keep.sink_blocks", ">= 0", options.keep.sink_blocks);

  const int64_t kvb = want.kv_blocks();
  cuda::detail::TopkParams p{};
  p.q = q.data();
  p.k = k.data();
  p.q_stride_b = q.stride(0), p.q_stride_s = q.stride(1), p.q_stride_h = q.stride(2);
  p.k_stride_b = k.stride(0), p.k_stride_s = k.stride(1), p.k_stride_h = k.stride(2);
  p.batch = static_cast<int>(q.size(0));
  p.seq_q = static_cast<int>(q.size(1));
  p.seq_kv = static_cast<int>(k.size(1));
  p.heads_q = static_cast<int>(q.size(2));
  p.heads_kv = static_cast<int>(k.size(2));
  p.dim = static_cast<int>(q.size(3));
  p.block_q = static_cast<int>(options.block_q);
  p.block_kv = static_cast<int>(options.block_kv);
  p.q_blocks = static_cast<int>(want.q_blocks());
  p.kv_blocks = static_cast<int>(kvb);
  p.scale = options.scale != 0.0f ? options.scale : 1.0f / std::sqrt(static_cast<float>(q.size(3)));
  p.similarity_threshold = static_cast<float>(options.similarity_threshold);
  p.n_topk = static_cast<int>(std::clamp<int64_t>(std::llround(options.topk_ratio * static_cast<double>(kvb)), 1, kvb));
  p.cdf_threshold = static_cast<float>(options.cdf_threshold);
  p.keep_diagonal = options.keep.diagonal;
  p.sink_blocks = static_cast<int>(std::min<int64_t>(options.keep.sink_blocks, kvb));
  p.pooled_q = mask.pooled_q_.data_as<float>();
  p.similar_q = mask.similar_q_.data_as<uint8_t>();
  p.pooled_k = mask.pooled_k_.data_as<float>();
  p.similar_k = mask.similar_k_.data_as<uint8_t>();
  p.row_counts = mask.row_counts_.data_as<int32_t>();
  p.row_blocks = mask.row_blocks_.data_as<int32_t>();
  p.indptr = mask.indptr_.data_as<int32_t>();
  p.indices = mask.indices_.data_as<int32_t>();
  cuda::detail::launch_topk_estimation(p, q.dtype(), cuda::current_stream());
  cuda::check_launch("estimate_topk_mask_device");
}

#else

DeviceEstimatedMask::DeviceEstimatedMask(const BlockMaskShape&, int64_t, int64_t, Device device) {
  fail_argument("device", "a CUDA device in a tessel built with CUDA", device.str() + " (built without CUDA)");
}
BlockMaskView DeviceEstimatedMask::view() const { return {}; }
BlockMask DeviceEstimatedMask::to_host() const { return {}; }
void estimate_topk_mask_device(const TensorView&, const TensorView&, const TopkEstimatorOptions&, DeviceEstimatedMask&) {
  throw Error("estimate_topk_mask_device: tessel was built without CUDA (configure with -DTESSEL_CUDA=ON)");
}

#endif

}  // namespace tessel
