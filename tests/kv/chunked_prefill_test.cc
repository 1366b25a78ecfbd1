// Chunked prefill and decode through the CPU offload engine with the Full policy must equal
// monolithic causal attention (fp64 reference), for random chunkings, block sizes and slot counts.
#include <gtest/gtest.h>

#include <chrono>
#include <random>

#include "kv/kv_test_util.h"
#include "tessel/core/error.h"
#include "tessel/core/parallel.h"
#include "tessel/kv/chunked_attention.h"
#include "tessel/kv/offloaded_attention.h"
#include "tessel/kv/policies.h"

namespace tessel::kv {
namespace {

using testing::max_error;
using testing::random_bshd;
using testing::xattention_options;
using testing::rows;

struct Case {
  int64_t seq, block, slots, heads, kv_heads, dim, decode_steps, layers;
  std::vector<int64_t> chunks;  // prefill chunk lengths (multiples of block except the last)
};

Case random_case(std::mt19937& rng) {
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  Case c;
  const int64_t blocks[] = {4, 8, 16, 32};
  c.block = blocks[pick(0, 3)];
  c.slots = pick(1, 4);
  c.kv_heads = pick(1, 2);
  c.heads = c.kv_heads * pick(1, 3);
  c.dim = 8 * pick(1, 3);
  c.layers = pick(1, 2);
  c.seq = pick(1, 300);
  c.decode_steps = pick(1, c.block + 3);  // often crosses a decode-block offload
  for (int64_t done = 0; done < c.seq;) {
    const int64_t chunk = std::min(c.seq - done, c.block * pick(1, 4));
    c.chunks.push_back(chunk);
    done += chunk;
  }
  return c;
}

// Runs one case through OffloadedAttention and compares every output row with the fp64 reference.
// Default policies: Full for both phases.
void run_case(const Case& c, uint64_t seed, DType dtype = DType::kF32, SparsePolicy* prefill_policy = nullptr,
              SparsePolicy* decode_policy = nullptr, double tolerance = 2e-5) {
  SCOPED_TRACE(::testing::Message() << "seq=" << c.seq << " block=" << c.block << " slots=" << c.slots << " heads="
                                    << c.heads << "/" << c.kv_heads << " dim=" << c.dim << " chunks=" << c.chunks.size()
                                    << " decode=" << c.decode_steps << " seed=" << seed);
  const int64_t total = c.seq + c.decode_steps;
  OffloadConfig config;
  config.num_layers = c.layers;
  config.block_size = c.block;
  config.num_kv_heads = c.kv_heads;
  config.head_dim = c.dim;
  config.num_slots = c.slots;
  config.num_host_blocks = total / c.block + 2;
  config.max_chunk_tokens = *std::max_element(c.chunks.begin(), c.chunks.end());
  config.dtype = dtype;
  auto engine = make_cpu_offload_engine(config);
  KvBlockManager manager(config.num_host_blocks, c.block);
  FullPolicy full;
  OffloadedAttention attention(*engine, manager, prefill_policy ? *prefill_policy : full,
                               decode_policy ? *decode_policy : full);
  attention.start_sequence();

  std::vector<Tensor> q, k, v, out;
  for (int64_t l = 0; l < c.layers; ++l) {
    q.push_back(random_bshd(total, c.heads, c.dim, seed * 10 + 3 * l).to(dtype));
    k.push_back(random_bshd(total, c.kv_heads, c.dim, seed * 10 + 3 * l + 1).to(dtype));
    v.push_back(random_bshd(total, c.kv_heads, c.dim, seed * 10 + 3 * l + 2).to(dtype));
    out.push_back(Tensor::empty({1, total, c.heads, c.dim}, dtype));
    fill(out.back().view(), NAN);
  }
  int64_t first = 0;
  for (size_t i = 0; i < c.chunks.size(); ++i) {
    const int64_t n = c.chunks[i];
    attention.begin_chunk(n, static_cast<int64_t>(i), static_cast<int64_t>(c.chunks.size()));
    for (int64_t l = 0; l < c.layers; ++l)
      attention.prefill_layer(ExecContext{}, l, rows(q[l], first, n), rows(k[l], first, n), rows(v[l], first, n),
                              rows(out[l], first, n));
    attention.end_chunk();
    first += n;
  }
  for (int64_t t = c.seq; t < total; ++t) {
    attention.begin_decode_step();
    for (int64_t l = 0; l < c.layers; ++l)
      attention.decode_layer(ExecContext{}, l, rows(q[l], t, 1), rows(k[l], t, 1), rows(v[l], t, 1), rows(out[l], t, 1));
    attention.end_decode_step();
  }
  AttentionOptions causal;
  causal.causal = true;
  for (int64_t l = 0; l < c.layers; ++l) {
    const auto ref = reference::attention(q[l].view(), k[l].view(), v[l].view(), causal);
    EXPECT_LT(max_error(out[l].view(), ref), tolerance) << "layer " << l;
  }
  EXPECT_EQ(manager.total_len(attention.sequence()), total);
}

// These cases make thousands of tiny kernel calls; one OpenMP thread keeps them fast when ctest
// runs tests side by side on a small machine (spinning OpenMP barriers under oversubscription
// are far slower; docs/perf-log.md). Correctness does not depend on the thread count.
class ScopedSingleThread {
 public:
  ScopedSingleThread() { set_num_threads(1); }
  ~ScopedSingleThread() { set_num_threads(0); }
};

TEST(ChunkedAttention, FullPolicyEqualsMonolithicCausalAttention) {
  ScopedSingleThread single_thread;
  std::mt19937 rng(2024);
  for (uint64_t trial = 0; trial < 40; ++trial) run_case(random_case(rng), trial + 1);
}

TEST(ChunkedAttention, Bf16CacheMatchesReferenceWithinBf16Rounding) {
  ScopedSingleThread single_thread;
  std::mt19937 rng(77);
  for (uint64_t trial = 0; trial < 8; ++trial) run_case(random_case(rng), 500 + trial, DType::kBF16, nullptr, nullptr, 3e-2);
}

// Sparse policies whose budget covers every block must reproduce dense attention exactly: this
// runs their selection code inside the pipeline (Quest for prefill and decode, Top-K for decode,
// XAttention with τ = 1 keeps every block that carries any attention mass).
TEST(ChunkedAttention, SparsePoliciesWithFullBudgetEqualReference) {
  ScopedSingleThread single_thread;
  std::mt19937 rng(5);
  for (uint64_t trial = 0; trial < 8; ++trial) {
    const Case c = random_case(rng);
    QuestOptions options;
    options.top_k = 1000;
    options.enable_prefill = true;
    QuestPolicy quest(options);
    TopKPolicy topk(1000);
    XAttentionBsaPolicy xattn(xattention_options(1.0, 4, 0.0));
    run_case(c, 700 + trial, DType::kF32, &quest, &quest);
    run_case(c, 800 + trial, DType::kF32, &xattn, &topk);
  }
}

TEST(ChunkedAttention, SingleTokenChunksAndOneSlot) {
  Case c{9, 4, 1, 2, 1, 8, 6, 1, {4, 4, 1}};
  run_case(c, 99);
}

// 4 blocks of 4 tokens, head_dim 8, chunks up to 8 tokens.
OffloadConfig tiny_config(int64_t kv_heads) {
  OffloadConfig config;
  config.num_host_blocks = 4;
  config.block_size = 4;
  config.num_kv_heads = kv_heads;
  config.head_dim = 8;
  config.max_chunk_tokens = 8;
  return config;
}

TEST(ChunkedAttention, UnsupportedPhasesThrow) {
  auto engine = make_cpu_offload_engine(tiny_config(1));
  KvBlockManager manager(4, 4);
  FullPolicy full;
  XAttentionBsaPolicy xattn;
  TopKPolicy topk(2);
  QuestPolicy quest;  // decode only by default
  EXPECT_THROW(OffloadedAttention(*engine, manager, topk, full), Error);
  EXPECT_THROW(OffloadedAttention(*engine, manager, full, xattn), Error);
  EXPECT_THROW(OffloadedAttention(*engine, manager, quest, quest), Error);

  const SequenceId seq = manager.create_sequence();
  const Tensor q = random_bshd(1, 1, 8, 1), out = Tensor::zeros({1, 1, 1, 8}, DType::kF32);
  ChunkedDecodeArgs decode{q.view(), out.view(), 0, 0.0f, seq};
  EXPECT_THROW(xattn.compute_chunked_decode(ExecContext{}, decode, *engine, manager), Error);
  ChunkedPrefillArgs prefill{q.view(), out.view(), 0, 0.0f, 0, 1, seq, 1};
  EXPECT_THROW(topk.compute_chunked_prefill(ExecContext{}, prefill, *engine, manager), Error);
  EXPECT_THROW(quest.compute_chunked_prefill(ExecContext{}, prefill, *engine, manager), Error);
  PolicyContext decode_ctx;
  decode_ctx.is_prefill = false;
  EXPECT_THROW(xattn.select_blocks({0, 1, 2}, *engine, decode_ctx), Error);
  // Decode with an empty decode buffer (token not stored/counted) is an error, not a silent result.
  EXPECT_THROW(full.compute_chunked_decode(ExecContext{}, decode, *engine, manager), Error);
  EXPECT_THROW(make_sparse_policy("nope"), Error);
  EXPECT_EQ(make_sparse_policy("xattention-bsa")->name(), "xattn");
}

TEST(ChunkedAttention, RejectsMisshapedQueries) {
  auto engine = make_cpu_offload_engine(tiny_config(2));
  KvBlockManager manager(4, 4);
  FullPolicy full;
  OffloadedAttention attention(*engine, manager, full, full);
  attention.start_sequence();
  attention.begin_chunk(4, 0, 1);
  const Tensor k = random_bshd(4, 2, 8, 1);
  const Tensor q_bad = random_bshd(4, 3, 8, 2);  // 3 heads is not a multiple of 2 kv heads
  const Tensor out = Tensor::zeros({1, 4, 3, 8}, DType::kF32);
  EXPECT_THROW(attention.prefill_layer(ExecContext{}, 0, q_bad.view(), k.view(), k.view(), out.view()), Error);
  const Tensor q = random_bshd(4, 2, 8, 2);
  const Tensor out_short = Tensor::zeros({1, 3, 2, 8}, DType::kF32);
  EXPECT_THROW(attention.prefill_layer(ExecContext{}, 0, q.view(), k.view(), k.view(), out_short.view()), Error);
  EXPECT_THROW(attention.begin_decode_step(), Error);  // a chunk is open
}

// The ring pipeline must overlap copies with attention. Copy latency per block is set to the
// measured attention time per block; a serialized pipeline would take compute + copy time, a
// pipelined one about the longer of the two plus one block.
TEST(ChunkedAttention, RingPipelineOverlapsCopiesWithAttention) {
  OffloadConfig config;
  config.num_host_blocks = 24;
  config.block_size = 64;
  config.num_kv_heads = 2;
  config.head_dim = 64;
  config.num_slots = 4;
  const int64_t heads = 4, queries = 128;
  const Tensor q = random_bshd(queries, heads, config.head_dim, 1);
  const Tensor out = Tensor::empty({1, queries, heads, config.head_dim}, DType::kF32);
  const Tensor lse = Tensor::empty({1, heads, queries}, DType::kF32);
  std::vector<BlockRef> blocks;
  for (int32_t b = 0; b < config.num_host_blocks; ++b) blocks.push_back({b, config.block_size});
  auto fill_host = [&](OffloadEngine& engine) {
    for (int32_t b = 0; b < config.num_host_blocks; ++b) {
      const Tensor kv = random_bshd(config.block_size, config.num_kv_heads, config.head_dim, 10 + b);
      engine.write_host_block(0, b, kv.view(), kv.view());
    }
  };
  auto seconds = [&](OffloadEngine& engine) {
    const auto start = std::chrono::steady_clock::now();
    ring_buffer_attention(ExecContext{}, q.view(), blocks, 0, 0.0f, engine, out.view(), lse.view());
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  // One compute thread and interleaved runs (best of each) keep the comparison fair on a busy machine.
  // A whole measurement is retried (up to 3 times, best overlap kept) because a burst of load from
  // other processes can stall either thread; a serialized pipeline has overlap ~0 on every attempt.
  ScopedSingleThread single_thread;
  double overlap = -1, copy = 0, pipelined = 0, compute = 1e9;
  int64_t max_loads_in_flight = 0;
  for (int attempt = 0; attempt < 3 && overlap <= 0.6; ++attempt) {
    auto fast = make_cpu_offload_engine(config);
    fill_host(*fast);
    double attempt_compute = 1e9;
    for (int i = 0; i < 3; ++i) attempt_compute = std::min(attempt_compute, seconds(*fast));
    const double per_block = attempt_compute / static_cast<double>(blocks.size());
    auto slow = make_cpu_offload_engine(config, CpuCopyOptions{0.0, per_block / 2 * 1e6});  // K and V copies
    fill_host(*slow);
    // Per run: its own copy time (copy thread busy time) against the best compute time.
    for (int i = 0; i < 4; ++i) {
      const double busy_before = slow->stats().copy_busy_seconds;
      const double total = seconds(*slow);
      const double run_copy = slow->stats().copy_busy_seconds - busy_before;
      attempt_compute = std::min(attempt_compute, seconds(*fast));
      const double run_overlap = testing::overlap_fraction(total, attempt_compute, run_copy);
      if (run_overlap > overlap)
        overlap = run_overlap, copy = run_copy, pipelined = total, compute = attempt_compute;
    }
    max_loads_in_flight = slow->stats().max_loads_in_flight;
  }
  std::printf("ring pipeline: compute %.2f ms, copies %.2f ms, pipelined %.2f ms, overlap %.2f\n", compute * 1e3,
              copy * 1e3, pipelined * 1e3, overlap);
  EXPECT_GT(overlap, 0.6) << "copies did not overlap attention";
  EXPECT_EQ(max_loads_in_flight, config.num_slots);
  EXPECT_GT(copy, 0.9 * compute);
}

}  // namespace
}  // namespace tessel::kv
