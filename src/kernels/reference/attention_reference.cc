// The fp64 oracle: for each query row, the plain formula softmax(scale * q k^T) v over the keys
// it may see, with the max subtracted for stability. No tiling, no tricks.
#include <algorithm>
#include <cmath>
#include <limits>

#include "tessel/core/error.h"
#include "tessel/kernels/reference.h"

namespace tessel::reference {
namespace {

void check_input(const TensorView& t, const char* name) {
  check_device(t, Device::cpu(), name);
  check_rank(t, 4, name);
  if (t.dtype() != DType::kF32 && t.dtype() != DType::kF16 && t.dtype() != DType::kBF16 && t.dtype() != DType::kF64)
    fail_argument(name, "a floating dtype", dtype_name(t.dtype()));
}

// Element (b, s, h, d) of a BSHD view of any float dtype and any strides, as double.
double at(const TensorView& t, int64_t b, int64_t s, int64_t h, int64_t d) {
  const int64_t off = b * t.stride(0) + s * t.stride(1) + h * t.stride(2) + d * t.stride(3);
  switch (t.dtype()) {
    case DType::kF32: return t.data_as<const float>()[off];
    case DType::kF64: return t.data_as<const double>()[off];
    case DType::kF16: return half_to_float(t.data_as<const uint16_t>()[off]);
    default: return bf16_to_float(t.data_as<const uint16_t>()[off]);
  }
}

// Rows [0, seq) of head h of batch b as a dense fp64 (seq, D) array.
std::vector<double> head_rows(const TensorView& t, int64_t b, int64_t h) {
  const int64_t seq = t.size(1), dim = t.size(3);
  std::vector<double> rows(static_cast<size_t>(seq * dim));
  for (int64_t s = 0; s < seq; ++s)
    for (int64_t d = 0; d < dim; ++d) rows[static_cast<size_t>(s * dim + d)] = at(t, b, s, h, d);
  return rows;
}

// keep(b, h, i, j) says whether the mask keeps the pair (query i, key j) of query head h.
template <typename Keep>
AttentionResult run(const TensorView& q, const TensorView& k, const TensorView& v, const AttentionOptions& options,
                    const std::vector<int64_t>& q_rows_in, Keep&& keep) {
  check_input(q, "q");
  check_input(k, "k");
  check_input(v, "v");
  const int64_t batch = q.size(0), seq_q = q.size(1), heads = q.size(2), head_dim = q.size(3);
  const int64_t seq_kv = k.size(1), kv_heads = k.size(2);
  if (k.shape() != v.shape()) fail_argument("v", "the shape of k " + shape_str(k.shape()), shape_str(v.shape()));
  if (k.size(0) != batch || k.size(3) != head_dim)
    fail_argument("k", detail::concat("batch ", batch, " and head_dim ", head_dim), shape_str(k.shape()));
  if (kv_heads < 1 || heads % kv_heads != 0)
    fail_argument("k heads", detail::concat("a divisor of ", heads), kv_heads);
  const int64_t group = heads / kv_heads;
  const double scale = attention_scale(options, head_dim);

  AttentionResult result;
  result.batch = batch;
  result.heads = heads;
  result.head_dim = head_dim;
  result.q_rows = q_rows_in;
  if (result.q_rows.empty())
    for (int64_t i = 0; i < seq_q; ++i) result.q_rows.push_back(i);
  for (int64_t i : result.q_rows)
    if (i < 0 || i >= seq_q) fail_argument("q_rows", detail::concat("positions in [0, ", seq_q, ")"), i);
  const int64_t rows = result.rows();
  result.out.assign(static_cast<size_t>(batch * rows * heads * head_dim), 0.0);
  result.lse.assign(static_cast<size_t>(batch * heads * rows), -std::numeric_limits<double>::infinity());

  std::vector<double> scores(static_cast<size_t>(seq_kv)), qi(static_cast<size_t>(head_dim));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t hk = 0; hk < kv_heads; ++hk) {
      const std::vector<double> kd = head_rows(k, b, hk), vd = head_rows(v, b, hk);
      for (int64_t h = hk * group; h < (hk + 1) * group; ++h)
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t i = result.q_rows[static_cast<size_t>(r)];
          for (int64_t d = 0; d < head_dim; ++d) qi[static_cast<size_t>(d)] = at(q, b, i, h, d);
          double max_score = -std::numeric_limits<double>::infinity();
          for (int64_t j = 0; j < seq_kv; ++j) {
            double s = -std::numeric_limits<double>::infinity();
            if (key_visible(i, j, seq_q, seq_kv, options) && keep(b, h, i, j)) {
              s = 0.0;
              for (int64_t d = 0; d < head_dim; ++d) s += qi[static_cast<size_t>(d)] * kd[static_cast<size_t>(j * head_dim + d)];
              s *= scale;
            }
            scores[static_cast<size_t>(j)] = s;
            max_score = std::max(max_score, s);
          }
          if (max_score == -std::numeric_limits<double>::infinity()) continue;  // no key: out 0, lse -inf
          double sum = 0.0;
          double* o = &result.out[static_cast<size_t>(((b * rows + r) * heads + h) * head_dim)];
          for (int64_t j = 0; j < seq_kv; ++j) {
            const double p = std::exp(scores[static_cast<size_t>(j)] - max_score);
            if (p == 0.0) continue;
            sum += p;
            for (int64_t d = 0; d < head_dim; ++d) o[d] += p * vd[static_cast<size_t>(j * head_dim + d)];
          }
          for (int64_t d = 0; d < head_dim; ++d) o[d] /= sum;
          result.lse[static_cast<size_t>((b * heads + h) * rows + r)] = max_score + std::log(sum);
        }
    }
  return result;
}

}  // namespace

bool key_visible(int64_t i, int64_t j, int64_t seq_q, int64_t seq_kv, const AttentionOptions& options) {
  const int64_t diagonal = i + (seq_kv - seq_q);  // the key aligned with query i (bottom-right)
  if (options.causal && j > diagonal) return false;
  if (options.window_right >= 0 && j > diagonal + options.window_right) return false;
  if (options.window_left >= 0 && j < diagonal - options.window_left) return false;
  return true;
}

bool block_mask_keeps(const BlockMaskView& mask, int64_t batch, int64_t head, int64_t heads, int64_t kv_heads,
                      int64_t i, int64_t j) {
  const int64_t row = mask.row(batch, mask.mask_head_for(head, heads, kv_heads), i / mask.block_q);
  const int32_t block = static_cast<int32_t>(j / mask.block_kv);
  const int32_t* kept_end = mask.indices + mask.indptr[row + 1];
  const int32_t* found = std::lower_bound(mask.indices + mask.indptr[row], kept_end, block);
  if (found == kept_end || *found != block) return false;
  if (mask.sub_block_bits == nullptr) return true;
  const int64_t position = found - mask.indices, r = i % mask.block_q, c = j % mask.block_kv;
  const uint32_t word = mask.sub_block_bits[(position * mask.block_q + r) * mask.sub_block_words() + c / 32];
  return ((word >> (c % 32)) & 1u) != 0;
}

AttentionResult attention(const TensorView& q, const TensorView& k, const TensorView& v,
                          const AttentionOptions& options, const std::vector<int64_t>& q_rows) {
  return run(q, k, v, options, q_rows, [](int64_t, int64_t, int64_t, int64_t) { return true; });
}

AttentionResult block_sparse_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                                       const BlockMaskView& mask, const AttentionOptions& options,
                                       const std::vector<int64_t>& q_rows) {
  check_device(q, Device::cpu(), "q");
  if (!mask.device.is_cpu()) fail_argument("mask.device", "cpu", mask.device.str());
  const int64_t heads = q.size(2), kv_heads = k.size(2);
  if (mask.seq_q != q.size(1)) fail_argument("mask.seq_q", q.size(1), mask.seq_q);
  if (mask.seq_kv != k.size(1)) fail_argument("mask.seq_kv", k.size(1), mask.seq_kv);
  if (mask.mask_batch != 1 && mask.mask_batch != q.size(0))
    fail_argument("mask.mask_batch", detail::concat("1 or ", q.size(0)), mask.mask_batch);
  if (mask.mask_heads != 1 && mask.mask_heads != heads && mask.mask_heads != kv_heads)
    fail_argument("mask.mask_heads", detail::concat("1, ", kv_heads, " or ", heads), mask.mask_heads);
  auto keep = [&](int64_t b, int64_t h, int64_t i, int64_t j) {
    return block_mask_keeps(mask, b, h, heads, kv_heads, i, j);
  };
  return run(q, k, v, options, q_rows, keep);
}

}  // namespace tessel::reference
