// CPU offload engine: data paths, ordering rules, argument errors, and copy/compute overlap.
#include "tessel/kv/offload_engine.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "kv/kv_test_util.h"
#include "tessel/core/error.h"

namespace tessel::kv {
namespace {

using testing::random_bshd;
using testing::rows;

OffloadConfig small_config() {
  OffloadConfig c;
  c.num_layers = 2;
  c.num_host_blocks = 8;
  c.block_size = 4;
  c.num_kv_heads = 2;
  c.head_dim = 3;
  c.num_slots = 2;
  c.max_chunk_tokens = 8;
  return c;
}

bool same_bytes(const TensorView& a, const TensorView& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

TEST(CpuOffloadEngine, PrefillOffloadThenLoadRoundTrips) {
  auto engine = make_cpu_offload_engine(small_config());
  const Tensor k = random_bshd(7, 2, 3, 1), v = random_bshd(7, 2, 3, 2);
  engine->store_prefill_kv(1, k.view(), v.view());
  const int32_t blocks[] = {5, 2};
  engine->offload_prefill_blocks(1, blocks, 7);
  // Loads issued right after the offload must see the offloaded data (ordering rule).
  engine->load_to_slot_layer(0, 1, 5);
  engine->load_to_slot_layer(1, 1, 2);
  engine->wait_slot_layer(0);
  engine->wait_slot_layer(1);
  EXPECT_TRUE(same_bytes(engine->get_kv_for_slot(0).first, rows(k.view(), 0, 4)));
  EXPECT_TRUE(same_bytes(engine->get_kv_for_slot(0).second, rows(v.view(), 0, 4)));
  EXPECT_TRUE(same_bytes(engine->get_kv_for_slot(1, 3).first, rows(k.view(), 4, 3)));
  EXPECT_TRUE(same_bytes(engine->get_kv_for_slot(1, 3).second, rows(v.view(), 4, 3)));
  engine->wait_offloads(1);
  EXPECT_EQ(std::memcmp(engine->host_block(1, 2).first.data(), rows(k.view(), 4, 3).data(), 3 * 6 * 4), 0);
  const OffloadStats stats = engine->stats();
  EXPECT_EQ(stats.loads, 2);
  EXPECT_EQ(stats.offloads, 2);
  EXPECT_EQ(stats.bytes_h2d, 2 * 2 * 4 * 6 * 4);
  EXPECT_EQ(stats.bytes_d2h, 2 * 7 * 6 * 4);
}

TEST(CpuOffloadEngine, DecodeBufferOffloadAndSlices) {
  auto engine = make_cpu_offload_engine(small_config());
  const Tensor k = random_bshd(4, 2, 3, 3), v = random_bshd(4, 2, 3, 4);
  for (int64_t t = 0; t < 4; ++t) engine->store_decode_kv(0, t, rows(k.view(), t, 1), rows(v.view(), t, 1));
  EXPECT_TRUE(same_bytes(engine->decode_buffer_slice(0, 1, 3).first, rows(k.view(), 1, 2)));
  engine->offload_decode_block(0, 6, 4);
  // The next store into the decode buffer waits for the offload to have read it.
  const Tensor k2 = random_bshd(1, 2, 3, 5);
  engine->store_decode_kv(0, 0, k2.view(), k2.view());
  engine->wait_offloads(0);
  EXPECT_TRUE(same_bytes(engine->host_block(0, 6).first, k.view()));
  EXPECT_TRUE(same_bytes(engine->host_block(0, 6).second, v.view()));
}

// load_keys: the K of the listed blocks (whole blocks, in list order, consecutive host blocks in one
// copy) right after the offloads that wrote them; V untouched; bytes counted.
TEST(CpuOffloadEngine, LoadKeysCopiesTheKeysOfTheListedBlocksAfterTheirOffload) {
  OffloadConfig c = small_config();
  auto engine = make_cpu_offload_engine(c, CpuCopyOptions{0.0, 2000.0});  // slow copies: ordering matters
  const Tensor k = random_bshd(8, 2, 3, 1), v = random_bshd(8, 2, 3, 2);
  engine->store_prefill_kv(1, k.view(), v.view());
  const int32_t blocks[] = {3, 4};
  engine->offload_prefill_blocks(1, blocks, 8);
  const Tensor k2 = random_bshd(4, 2, 3, 3);
  engine->store_decode_kv(1, 0, k2.view(), k2.view());
  engine->offload_decode_block(1, 0, 4);
  Tensor dst = Tensor::zeros({1, 16, 2, 3}, DType::kF32);
  const int32_t wanted[] = {4, 0, 3, 4};  // a repeat, a decode block, a run split by the list order
  engine->load_keys(1, wanted, dst.view());
  EXPECT_TRUE(same_bytes(rows(dst.view(), 0, 4), rows(k.view(), 4, 4)));
  EXPECT_TRUE(same_bytes(rows(dst.view(), 4, 4), k2.view()));
  EXPECT_TRUE(same_bytes(rows(dst.view(), 8, 4), rows(k.view(), 0, 4)));
  EXPECT_TRUE(same_bytes(rows(dst.view(), 12, 4), rows(k.view(), 4, 4)));
  const int32_t run[] = {3, 4};
  Tensor pair = Tensor::zeros({1, 9, 2, 3}, DType::kF32);  // more rows than needed is fine
  engine->load_keys(1, run, pair.view());
  EXPECT_TRUE(same_bytes(rows(pair.view(), 0, 8), k.view()));
  const OffloadStats stats = engine->stats();
  EXPECT_EQ(stats.key_loads, 6);
  EXPECT_EQ(stats.bytes_h2d_keys, 6 * 4 * 6 * 4);
  EXPECT_EQ(stats.bytes_h2d, stats.bytes_h2d_keys);  // no slot loads: only the keys
  EXPECT_EQ(stats.loads, 0);

  Tensor short_dst = Tensor::zeros({1, 15, 2, 3}, DType::kF32);
  EXPECT_THROW(engine->load_keys(1, wanted, short_dst.view()), Error);  // 4 blocks need 16 rows
  EXPECT_THROW(engine->load_keys(2, run, dst.view()), Error);           // layer
  const int32_t out_of_range[] = {8};
  EXPECT_THROW(engine->load_keys(0, out_of_range, dst.view()), Error);
  Tensor half = Tensor::zeros({1, 16, 2, 3}, DType::kF16);
  EXPECT_THROW(engine->load_keys(0, run, half.view()), Error);
  EXPECT_EQ(engine->stats().key_loads, 6);
}

TEST(CpuOffloadEngine, RejectsBadArgumentsWithoutIssuingWork) {
  auto engine = make_cpu_offload_engine(small_config());
  EXPECT_THROW(engine->load_to_slot_layer(2, 0, 0), Error);   // slot out of range
  EXPECT_THROW(engine->load_to_slot_layer(0, 2, 0), Error);   // layer
  EXPECT_THROW(engine->load_to_slot_layer(0, 0, 8), Error);   // host block
  EXPECT_THROW(engine->get_kv_for_slot(0, 5), Error);
  EXPECT_THROW(engine->get_prefill_buffer_slice(0, 9), Error);
  EXPECT_THROW(engine->decode_buffer_slice(0, 2, 2), Error);
  const Tensor wrong_heads = random_bshd(2, 3, 3, 1);
  EXPECT_THROW(engine->store_prefill_kv(0, wrong_heads.view(), wrong_heads.view()), Error);
  const Tensor too_long = random_bshd(9, 2, 3, 1);
  EXPECT_THROW(engine->store_prefill_kv(0, too_long.view(), too_long.view()), Error);
  const Tensor half = Tensor::zeros({1, 2, 2, 3}, DType::kF16);
  EXPECT_THROW(engine->store_prefill_kv(0, half.view(), half.view()), Error);
  const int32_t one_block[] = {0};
  EXPECT_THROW(engine->offload_prefill_blocks(0, one_block, 5), Error);  // 5 tokens need 2 blocks
  const Tensor k = random_bshd(1, 2, 3, 1);
  EXPECT_THROW(engine->store_decode_kv(0, 4, k.view(), k.view()), Error);
  EXPECT_EQ(engine->stats().loads, 0);
  OffloadConfig bad = small_config();
  bad.num_slots = 0;
  EXPECT_THROW(make_cpu_offload_engine(bad), Error);
  bad = small_config();
  bad.dtype = DType::kI32;
  EXPECT_THROW(make_cpu_offload_engine(bad), Error);
  EXPECT_THROW(make_cpu_offload_engine(small_config(), CpuCopyOptions{-1.0, 0.0}), Error);
}

// A pipelined caller (preload all slots, then wait → compute → reload) must have copies run while
// it computes. Compute is a sleep so the test measures the engine, not the CPU; compute and copy
// times are measured (sleeps overshoot on a busy machine) and the overlap is judged against them.
TEST(CpuOffloadEngine, CopiesOverlapCompute) {
  OffloadConfig c = small_config();
  c.num_slots = 3;
  const double copy_ms = 20.0;  // per load: K and V, 10 ms each (long against scheduler delays)
  auto engine = make_cpu_offload_engine(c, CpuCopyOptions{0.0, copy_ms * 1000.0 / 2});
  const int64_t blocks = 8;
  double best = -1;
  for (int attempt = 0; attempt < 3 && best < 0.5; ++attempt) {
    using Clock = std::chrono::steady_clock;
    const double busy_before = engine->stats().copy_busy_seconds;
    double compute = 0;
    const auto start = Clock::now();
    for (int64_t i = 0; i < c.num_slots; ++i) engine->load_to_slot_layer(i, 0, i);
    for (int64_t i = 0; i < blocks; ++i) {
      const int64_t slot = i % c.num_slots;
      engine->wait_slot_layer(slot);
      const auto compute_start = Clock::now();
      std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(copy_ms * 1000)));
      compute += std::chrono::duration<double>(Clock::now() - compute_start).count();
      engine->record_slot_compute_done(slot);
      if (i + c.num_slots < blocks) engine->load_to_slot_layer(slot, 0, (i + c.num_slots) % c.num_host_blocks);
    }
    const double total = std::chrono::duration<double>(Clock::now() - start).count();
    const double copy = engine->stats().copy_busy_seconds - busy_before;
    best = std::max(best, testing::overlap_fraction(total, compute, copy));
  }
  EXPECT_GT(best, 0.5) << "copies did not overlap compute (fraction of the shorter part hidden)";
  EXPECT_EQ(engine->stats().max_loads_in_flight, c.num_slots);
}

TEST(OffloadEngineFactory, CudaEngineNeedsAGpu) {
  if (cuda_available()) GTEST_SKIP() << "a GPU is present; covered by offload_engine_gpu_test";
  ExecContext cuda_ctx;
  cuda_ctx.device = Device::cuda(0);
  EXPECT_THROW(make_offload_engine(cuda_ctx, small_config()), Error);
}

}  // namespace
}  // namespace tessel::kv
