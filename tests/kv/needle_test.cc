// Needle in a haystack at the attention level, 32K tokens of offloaded KV on the CPU engine.
//
// Shapes: S = 32768 history tokens, 4 query heads, 2 kv heads, head_dim 32, block 256, chunks of
// 4096. Haystack keys ~ N(0, 0.5²), values ~ N(0, 1). The needle key at a random position is 32·u
// (u a random unit vector per kv head) and its value is a ±3 marker vector. Queries that ask for the
// needle are 4·u + N(0, 0.3²): the needle's logit (≈22.6) dominates the ≈32K haystack logits.
//   * XAttention-BSA prefill: the final 256-token chunk is the "question" (every query points at
//     the needle: XAttention's majority vote is over query blocks, so a needle wanted by a single
//     query row is, by design, not loaded). Every query row must read the marker.
//   * Quest decode (top 4 blocks + sink + recent): the decoded token's query points at the needle.
// Both must read the marker back for every seed and position.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "kv/kv_test_util.h"
#include "tessel/kv/offloaded_attention.h"
#include "tessel/kv/policies.h"

namespace tessel::kv {
namespace {

using testing::random_bshd;
using testing::rows;

constexpr int64_t kSeq = 32768, kBlock = 256, kChunk = 4096, kHeads = 4, kKvHeads = 2, kDim = 32;
constexpr int64_t kQuestion = 256;  // final prefill chunk
constexpr float kNeedleNorm = 32.0f, kQueryNorm = 4.0f, kMarker = 3.0f;

struct Haystack {
  Tensor k, v;
  std::vector<float> u, marker;  // (kv_heads, dim)
};

Haystack make_haystack(int64_t position, uint64_t seed) {
  Haystack h{random_bshd(kSeq + 1, kKvHeads, kDim, seed, 0.5), random_bshd(kSeq + 1, kKvHeads, kDim, seed + 1), {}, {}};
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> normal;
  h.u.resize(kKvHeads * kDim);
  h.marker.resize(kKvHeads * kDim);
  for (int64_t g = 0; g < kKvHeads; ++g) {
    float norm = 0;
    for (int64_t d = 0; d < kDim; ++d) norm += (h.u[g * kDim + d] = normal(rng)) * h.u[g * kDim + d];
    for (int64_t d = 0; d < kDim; ++d) {
      h.u[g * kDim + d] /= std::sqrt(norm);
      h.marker[g * kDim + d] = (rng() & 1) ? kMarker : -kMarker;
    }
  }
  for (int64_t g = 0; g < kKvHeads; ++g)
    for (int64_t d = 0; d < kDim; ++d) {
      h.k.data_as<float>()[(position * kKvHeads + g) * kDim + d] = kNeedleNorm * h.u[g * kDim + d];
      h.v.data_as<float>()[(position * kKvHeads + g) * kDim + d] = h.marker[g * kDim + d];
    }
  return h;
}

Tensor questions(const Haystack& h, int64_t count, uint64_t seed) {
  Tensor q = random_bshd(count, kHeads, kDim, seed, 0.3);
  for (int64_t r = 0; r < count; ++r)
    for (int64_t head = 0; head < kHeads; ++head)
      for (int64_t d = 0; d < kDim; ++d)
        q.data_as<float>()[(r * kHeads + head) * kDim + d] += kQueryNorm * h.u[(head / (kHeads / kKvHeads)) * kDim + d];
  return q;
}

// Largest |out - marker| over all rows and heads of out (1, n, heads, dim).
double marker_error(const Tensor& out, const Haystack& h) {
  double worst = 0;
  for (int64_t r = 0; r < out.size(1); ++r)
    for (int64_t head = 0; head < kHeads; ++head)
      for (int64_t d = 0; d < kDim; ++d) {
        const double got = out.data_as<float>()[(r * kHeads + head) * kDim + d];
        const double want = h.marker[(head / (kHeads / kKvHeads)) * kDim + d];
        worst = std::isfinite(got) ? std::max(worst, std::abs(got - want)) : INFINITY;
      }
  return worst;
}

TEST(Needle, XAttentionPrefillAndQuestDecodeReadTheMarkerAt32K) {
  OffloadConfig config;
  config.block_size = kBlock;
  config.num_kv_heads = kKvHeads;
  config.head_dim = kDim;
  config.num_slots = 4;
  config.max_chunk_tokens = kChunk;
  config.num_host_blocks = kSeq / kBlock + 1;
  auto engine = make_cpu_offload_engine(config);
  KvBlockManager manager(config.num_host_blocks, kBlock);
  XAttentionBsaPolicy xattn;  // τ = 0.95, stride 8
  QuestOptions quest_options;
  quest_options.top_k = 4;
  QuestPolicy quest(quest_options);
  OffloadedAttention attention(*engine, manager, xattn, quest);

  std::mt19937_64 rng(7);
  const int seeds = 10;
  int prefill_found = 0, decode_found = 0;
  double density_sum = 0;
  for (int seed = 0; seed < seeds; ++seed) {
    const int64_t history = kSeq - kQuestion;
    const int64_t position = static_cast<int64_t>(rng() % static_cast<uint64_t>(history));
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " needle at " << position);
    const Haystack h = make_haystack(position, 100 + seed);
    attention.start_sequence();
    const int64_t chunks = history / kChunk + 2;
    int64_t done = 0;
    for (int64_t c = 0; done < history; ++c) {
      const int64_t n = std::min(kChunk, history - done);
      attention.begin_chunk(n, c, chunks);
      attention.store_layer_kv(0, rows(h.k.view(), done, n), rows(h.v.view(), done, n));
      attention.end_chunk();
      done += n;
    }
    // The question chunk goes through the sparse prefill path.
    const Tensor q = questions(h, kQuestion, 200 + seed);
    Tensor out = Tensor::empty({1, kQuestion, kHeads, kDim}, DType::kF32);
    fill(out.view(), NAN);
    xattn.reset_selection_stats();
    attention.begin_chunk(kQuestion, chunks - 1, chunks);
    attention.prefill_layer(ExecContext{}, 0, q.view(), rows(h.k.view(), history, kQuestion), rows(h.v.view(), history, kQuestion),
                            out.view());
    attention.end_chunk();
    const SelectionStats s = xattn.selection_stats();
    density_sum += static_cast<double>(s.selected_blocks) / static_cast<double>(s.available_blocks);
    const double prefill_error = marker_error(out, h);
    EXPECT_LT(prefill_error, 0.05);
    prefill_found += prefill_error < 0.05;

    // One decoded token asking for the needle, through Quest.
    const Tensor q_decode = questions(h, 1, 300 + seed);
    Tensor out_decode = Tensor::empty({1, 1, kHeads, kDim}, DType::kF32);
    fill(out_decode.view(), NAN);
    quest.reset_selection_stats();
    attention.begin_decode_step();
    attention.decode_layer(ExecContext{}, 0, q_decode.view(), rows(h.k.view(), kSeq, 1), rows(h.v.view(), kSeq, 1),
                           out_decode.view());
    attention.end_decode_step();
    EXPECT_EQ(quest.selection_stats().selected_blocks, 6);  // top 4 + sink + recent of 128
    const double decode_error = marker_error(out_decode, h);
    EXPECT_LT(decode_error, 0.05);
    decode_found += decode_error < 0.05;
  }
  std::printf("needle 32K: xattn prefill %d/%d, quest decode %d/%d, mean xattn density %.3f\n", prefill_found, seeds,
              decode_found, seeds, density_sum / seeds);
}

}  // namespace
}  // namespace tessel::kv
