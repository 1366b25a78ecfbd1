#include "tessel/sparse/block_mask.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "tessel/core/error.h"
#include "tessel/core/random.h"

namespace tessel {
namespace {

std::string row_name(const BlockMaskShape& shape, int64_t row) {
  const int64_t qb = shape.q_blocks();
  const int64_t q_block = row % qb;
  const int64_t head = (row / qb) % shape.mask_heads;
  const int64_t batch = row / (qb * shape.mask_heads);
  return detail::concat("mask row (batch ", batch, ", head ", head, ", q_block ", q_block, ")");
}

void validate_shape(const BlockMaskShape& shape) {
  if (shape.mask_batch < 1) fail_argument("mask shape.mask_batch", ">= 1", shape.mask_batch);
  if (shape.mask_heads < 1) fail_argument("mask shape.mask_heads", ">= 1", shape.mask_heads);
  if (shape.seq_q < 0) fail_argument("mask shape.seq_q", ">= 0", shape.seq_q);
  if (shape.seq_kv < 0) fail_argument("mask shape.seq_kv", ">= 0", shape.seq_kv);
  if (shape.block_q < 1) fail_argument("mask shape.block_q", ">= 1", shape.block_q);
  if (shape.block_kv < 1) fail_argument("mask shape.block_kv", ">= 1", shape.block_kv);
  // Products checked step by step: hostile extents must give this error, not a signed overflow.
  // (batch, head) pairs are bounded too: a mask with no q block still has one FlashInfer/Flex
  // entry per pair.
  int64_t pairs = 0, rows = 0, blocks = 0;
  if (__builtin_mul_overflow(shape.mask_batch, shape.mask_heads, &pairs) || pairs > INT32_MAX)
    fail_argument("mask shape", "at most 2^31-1 (batch, head) rows (mask_batch * mask_heads)",
                  detail::concat(shape.mask_batch, " x ", shape.mask_heads));
  if (__builtin_mul_overflow(pairs, shape.q_blocks(), &rows) || __builtin_mul_overflow(rows, shape.kv_blocks(), &blocks) ||
      blocks > INT32_MAX)
    fail_argument("mask shape", "at most 2^31-1 blocks in all (mask_batch * mask_heads * q_blocks * kv_blocks)",
                  detail::concat(shape.mask_batch, " x ", shape.mask_heads, " x ", shape.q_blocks(), " x ", shape.kv_blocks()));
}

int64_t block_tokens(int64_t index, int64_t block, int64_t seq) { return std::min(block, seq - index * block); }

}  // namespace

void BlockMask::validate(const BlockMaskShape& shape, const std::vector<int32_t>& indptr,
                         const std::vector<int32_t>& indices) {
  validate_shape(shape);
  const int64_t rows = shape.num_rows();
  const int64_t kv_blocks = shape.kv_blocks();
  if (static_cast<int64_t>(indptr.size()) != rows + 1)
    fail_argument("mask indptr", detail::concat(rows + 1, " entries (num_rows + 1)"), indptr.size());
  if (indptr[0] != 0) fail_argument("mask indptr[0]", "0", indptr[0]);
  if (indptr[static_cast<size_t>(rows)] != static_cast<int64_t>(indices.size()))
    fail_argument("mask indptr[num_rows]", detail::concat(indices.size(), " (number of indices)"),
                  indptr[static_cast<size_t>(rows)]);
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t begin = indptr[static_cast<size_t>(r)], end = indptr[static_cast<size_t>(r + 1)];
    if (end < begin)
      throw Error(detail::concat(row_name(shape, r), ": indptr decreases (", begin, " then ", end, ")"));
    if (end > static_cast<int64_t>(indices.size()))
      throw Error(detail::concat(row_name(shape, r), ": indptr end ", end, " exceeds the ", indices.size(),
                                 " indices"));
    for (int32_t i = begin; i < end; ++i) {
      const int32_t id = indices[static_cast<size_t>(i)];
      if (id < 0 || id >= kv_blocks)
        throw Error(detail::concat(row_name(shape, r), ": kv block index ", id, " out of range [0, ", kv_blocks,
                                   ")"));
      if (i > begin) {
        const int32_t prev = indices[static_cast<size_t>(i - 1)];
        if (id == prev) throw Error(detail::concat(row_name(shape, r), ": duplicate kv block index ", id));
        if (id < prev)
          throw Error(detail::concat(row_name(shape, r), ": kv block indices not sorted (", prev, " before ", id,
                                     ")"));
      }
    }
  }
}

BlockMask BlockMask::from_csr(const BlockMaskShape& shape, std::vector<int32_t> indptr, std::vector<int32_t> indices) {
  validate(shape, indptr, indices);
  BlockMask mask;
  mask.shape_ = shape;
  mask.indptr_ = std::move(indptr);
  mask.indices_ = std::move(indices);
  return mask;
}

BlockMask BlockMask::from_rows(const BlockMaskShape& shape, const std::vector<std::vector<int32_t>>& rows) {
  validate_shape(shape);
  if (static_cast<int64_t>(rows.size()) != shape.num_rows())
    fail_argument("rows", detail::concat(shape.num_rows(), " rows (mask_batch * mask_heads * q_blocks)"),
                  rows.size());
  std::vector<int32_t> indptr{0}, indices;
  for (const auto& row : rows) {
    indices.insert(indices.end(), row.begin(), row.end());
    indptr.push_back(static_cast<int32_t>(indices.size()));
  }
  return from_csr(shape, std::move(indptr), std::move(indices));
}

BlockMask BlockMask::from_dense(const BlockMaskShape& shape, const std::vector<uint8_t>& dense) {
  validate_shape(shape);
  const int64_t rows = shape.num_rows(), kvb = shape.kv_blocks();
  if (static_cast<int64_t>(dense.size()) != rows * kvb)
    fail_argument("dense", detail::concat(rows * kvb, " entries (B_m * H_m * Qb * KVb)"), dense.size());
  std::vector<int32_t> indptr{0}, indices;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < kvb; ++j)
      if (dense[static_cast<size_t>(r * kvb + j)]) indices.push_back(static_cast<int32_t>(j));
    indptr.push_back(static_cast<int32_t>(indices.size()));
  }
  return from_csr(shape, std::move(indptr), std::move(indices));
}

BlockMask BlockMask::full(const BlockMaskShape& shape) {
  validate_shape(shape);
  return from_dense(shape, std::vector<uint8_t>(static_cast<size_t>(shape.num_rows() * shape.kv_blocks()), 1));
}

BlockMask BlockMask::random(const BlockMaskShape& shape, double density, uint64_t seed) {
  validate_shape(shape);
  if (!(density > 0.0 && density <= 1.0)) fail_argument("density", "in (0, 1]", density);
  const int64_t qb = shape.q_blocks(), kvb = shape.kv_blocks();
  const int64_t shift = shape.seq_kv - shape.seq_q;  // bottom-right alignment
  const int64_t target = std::max<int64_t>(1, std::llround(density * static_cast<double>(kvb)));
  SplitMix64 rng{seed};
  std::vector<int32_t> indptr{0}, indices;
  std::vector<int32_t> pool;
  std::vector<uint8_t> kept(static_cast<size_t>(kvb));
  for (int64_t r = 0; r < shape.num_rows(); ++r) {
    std::fill(kept.begin(), kept.end(), 0);
    int64_t count = 0;
    // Diagonal: kv blocks holding the keys aligned with this q block's first and last token.
    const int64_t q_block = r % qb;
    const int64_t q_first = q_block * shape.block_q;
    const int64_t q_last = std::min(shape.seq_q, q_first + shape.block_q) - 1;
    const int64_t lo = std::max<int64_t>(0, q_first + shift), hi = std::min(shape.seq_kv - 1, q_last + shift);
    if (lo <= hi) {
      for (int64_t j = lo / shape.block_kv; j <= hi / shape.block_kv; ++j) {
        kept[static_cast<size_t>(j)] = 1;
        ++count;
      }
    }
    pool.clear();
    for (int64_t j = 0; j < kvb; ++j)
      if (!kept[static_cast<size_t>(j)]) pool.push_back(static_cast<int32_t>(j));
    // Partial Fisher-Yates: the first `extra` entries of the pool become a uniform sample.
    const int64_t extra = std::clamp<int64_t>(target - count, 0, static_cast<int64_t>(pool.size()));
    for (int64_t i = 0; i < extra; ++i) {
      const int64_t pick = i + static_cast<int64_t>(rng.below(static_cast<uint64_t>(pool.size() - i)));
      std::swap(pool[static_cast<size_t>(i)], pool[static_cast<size_t>(pick)]);
      kept[static_cast<size_t>(pool[static_cast<size_t>(i)])] = 1;
    }
    for (int64_t j = 0; j < kvb; ++j)
      if (kept[static_cast<size_t>(j)]) indices.push_back(static_cast<int32_t>(j));
    indptr.push_back(static_cast<int32_t>(indices.size()));
  }
  return from_csr(shape, std::move(indptr), std::move(indices));
}

BlockMask BlockMask::from_flashinfer(const BlockMaskShape& shape, const std::vector<FlashInferBsr>& per_batch_head) {
  validate_shape(shape);
  const int64_t heads = shape.mask_batch * shape.mask_heads, qb = shape.q_blocks();
  if (static_cast<int64_t>(per_batch_head.size()) != heads)
    fail_argument("per_batch_head", detail::concat(heads, " entries (mask_batch * mask_heads)"),
                  per_batch_head.size());
  std::vector<int32_t> indptr{0}, indices;
  for (int64_t bh = 0; bh < heads; ++bh) {
    const FlashInferBsr& bsr = per_batch_head[static_cast<size_t>(bh)];
    const std::string name = detail::concat("per_batch_head[", bh, "]");
    if (static_cast<int64_t>(bsr.indptr.size()) != qb + 1)
      fail_argument(name + ".indptr", detail::concat(qb + 1, " entries (q_blocks + 1)"), bsr.indptr.size());
    if (bsr.indptr.front() != 0) fail_argument(name + ".indptr[0]", "0", bsr.indptr.front());
    if (bsr.indptr.back() != static_cast<int64_t>(bsr.indices.size()))
      fail_argument(name + ".indptr[q_blocks]", detail::concat(bsr.indices.size(), " (number of indices)"),
                    bsr.indptr.back());
    const int32_t base = static_cast<int32_t>(indices.size());
    for (int64_t q = 1; q <= qb; ++q) indptr.push_back(base + bsr.indptr[static_cast<size_t>(q)]);
    indices.insert(indices.end(), bsr.indices.begin(), bsr.indices.end());
  }
  return from_csr(shape, std::move(indptr), std::move(indices));
}

BlockMask BlockMask::from_flex(const BlockMaskShape& shape, const FlexBlockMask& flex) {
  validate_shape(shape);
  const int64_t rows = shape.num_rows(), kvb = shape.kv_blocks();
  if (static_cast<int64_t>(flex.kv_num_blocks.size()) != rows)
    fail_argument("flex.kv_num_blocks", detail::concat(rows, " entries (B_m * H_m * Qb)"), flex.kv_num_blocks.size());
  if (static_cast<int64_t>(flex.kv_indices.size()) != rows * kvb)
    fail_argument("flex.kv_indices", detail::concat(rows * kvb, " entries (B_m * H_m * Qb * KVb)"),
                  flex.kv_indices.size());
  std::vector<int32_t> indptr{0}, indices;
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t n = flex.kv_num_blocks[static_cast<size_t>(r)];
    if (n < 0 || n > kvb)
      throw Error(detail::concat(row_name(shape, r), ": kv_num_blocks ", n, " out of range [0, ", kvb, "]"));
    const auto first = flex.kv_indices.begin() + r * kvb;
    indices.insert(indices.end(), first, first + n);
    indptr.push_back(static_cast<int32_t>(indices.size()));
  }
  return from_csr(shape, std::move(indptr), std::move(indices));
}

std::vector<uint8_t> BlockMask::to_dense() const {
  const int64_t kvb = shape_.kv_blocks();
  std::vector<uint8_t> dense(static_cast<size_t>(shape_.num_rows() * kvb), 0);
  for (int64_t r = 0; r < shape_.num_rows(); ++r)
    for (int32_t i = indptr_[static_cast<size_t>(r)]; i < indptr_[static_cast<size_t>(r + 1)]; ++i)
      dense[static_cast<size_t>(r * kvb + indices_[static_cast<size_t>(i)])] = 1;
  return dense;
}

std::vector<FlashInferBsr> BlockMask::to_flashinfer() const {
  const int64_t qb = shape_.q_blocks();
  std::vector<FlashInferBsr> out(static_cast<size_t>(shape_.mask_batch * shape_.mask_heads));
  for (size_t bh = 0; bh < out.size(); ++bh) {
    const int64_t first_row = static_cast<int64_t>(bh) * qb;
    const int32_t base = indptr_[static_cast<size_t>(first_row)];
    FlashInferBsr& bsr = out[bh];
    for (int64_t q = 0; q <= qb; ++q) bsr.indptr.push_back(indptr_[static_cast<size_t>(first_row + q)] - base);
    bsr.indices.assign(indices_.begin() + base, indices_.begin() + indptr_[static_cast<size_t>(first_row + qb)]);
  }
  return out;
}

FlexBlockMask BlockMask::to_flex() const {
  const int64_t rows = shape_.num_rows(), kvb = shape_.kv_blocks();
  FlexBlockMask flex;
  flex.kv_num_blocks.resize(static_cast<size_t>(rows));
  flex.kv_indices.assign(static_cast<size_t>(rows * kvb), 0);
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t begin = indptr_[static_cast<size_t>(r)], end = indptr_[static_cast<size_t>(r + 1)];
    flex.kv_num_blocks[static_cast<size_t>(r)] = end - begin;
    std::copy(indices_.begin() + begin, indices_.begin() + end, flex.kv_indices.begin() + r * kvb);
  }
  return flex;
}

double BlockMask::density() const {
  const int64_t all = shape_.num_rows() * shape_.kv_blocks();
  return all == 0 ? 0.0 : static_cast<double>(nnz()) / static_cast<double>(all);
}

double BlockMask::token_density() const {
  const double all = static_cast<double>(shape_.mask_batch * shape_.mask_heads) * static_cast<double>(shape_.seq_q) *
                     static_cast<double>(shape_.seq_kv);
  if (all == 0.0) return 0.0;
  const int64_t qb = shape_.q_blocks();
  double kept = 0.0;
  for (int64_t r = 0; r < shape_.num_rows(); ++r) {
    const double q_tokens = static_cast<double>(block_tokens(r % qb, shape_.block_q, shape_.seq_q));
    for (int32_t i = indptr_[static_cast<size_t>(r)]; i < indptr_[static_cast<size_t>(r + 1)]; ++i)
      kept += q_tokens * static_cast<double>(block_tokens(indices_[static_cast<size_t>(i)], shape_.block_kv, shape_.seq_kv));
  }
  return kept / all;
}

std::vector<int32_t> BlockMask::row(int64_t batch, int64_t head, int64_t q_block) const {
  if (batch < 0 || batch >= shape_.mask_batch) fail_argument("batch", detail::concat("in [0, ", shape_.mask_batch, ")"), batch);
  if (head < 0 || head >= shape_.mask_heads) fail_argument("head", detail::concat("in [0, ", shape_.mask_heads, ")"), head);
  if (q_block < 0 || q_block >= shape_.q_blocks())
    fail_argument("q_block", detail::concat("in [0, ", shape_.q_blocks(), ")"), q_block);
  const int64_t r = (batch * shape_.mask_heads + head) * shape_.q_blocks() + q_block;
  return {indices_.begin() + indptr_[static_cast<size_t>(r)], indices_.begin() + indptr_[static_cast<size_t>(r + 1)]};
}

BlockMaskView make_block_mask_view(const BlockMaskShape& shape, const int32_t* indptr, const int32_t* indices,
                                   Device device) {
  BlockMaskView v;
  v.indptr = indptr;
  v.indices = indices;
  v.mask_batch = shape.mask_batch;
  v.mask_heads = shape.mask_heads;
  v.q_blocks = shape.q_blocks();
  v.kv_blocks = shape.kv_blocks();
  v.block_q = shape.block_q;
  v.block_kv = shape.block_kv;
  v.seq_q = shape.seq_q;
  v.seq_kv = shape.seq_kv;
  v.device = device;
  return v;
}

BlockMaskView BlockMask::view() const { return make_block_mask_view(shape_, indptr_.data(), indices_.data(), Device::cpu()); }

BlockMaskView BlockMask::DeviceCopy::view() const {
  return make_block_mask_view(shape, indptr.data_as<const int32_t>(), indices.data_as<const int32_t>(), indptr.device());
}

BlockMask::DeviceCopy BlockMask::to_device(Device device) const {
  if (indptr_.empty()) throw Error("BlockMask::to_device: the mask is empty (default-constructed)");
  DeviceCopy copy;
  copy.shape = shape_;
  Tensor host_indptr = Tensor::empty({static_cast<int64_t>(indptr_.size())}, DType::kI32);
  Tensor host_indices = Tensor::empty({nnz()}, DType::kI32);
  std::copy(indptr_.begin(), indptr_.end(), host_indptr.data_as<int32_t>());
  std::copy(indices_.begin(), indices_.end(), host_indices.data_as<int32_t>());
  if (device.is_cpu()) {
    copy.indptr = std::move(host_indptr);
    copy.indices = std::move(host_indices);
    return copy;
  }
#ifdef TESSEL_WITH_CUDA
  copy.indptr = host_indptr.to(device);
  copy.indices = host_indices.to(device);
  return copy;
#else
  fail_argument("device", "cpu (tessel was built without CUDA)", device.str());
#endif
}

}  // namespace tessel
