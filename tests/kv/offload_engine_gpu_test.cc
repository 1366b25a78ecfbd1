// CUDA offload engine (skips without a GPU): copy paths and their ordering, and chunked prefill /
// decode with the Full policy against the fp64 reference through the CUDA attention entry points.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "kv/kv_test_util.h"
#include "tessel/core/device.h"
#include "tessel/kv/offloaded_attention.h"
#include "tessel/kv/policies.h"

#ifdef TESSEL_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace tessel::kv {
namespace {

using testing::random_bshd;
using testing::rows;

#define SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible"

OffloadConfig gpu_config() {
  OffloadConfig c;
  c.num_layers = 2;
  c.num_host_blocks = 64;
  c.block_size = 64;
  c.num_kv_heads = 2;
  c.head_dim = 64;
  c.num_slots = 3;
  c.max_chunk_tokens = 256;
  c.dtype = DType::kBF16;
  return c;
}

Tensor random_bf16(int64_t seq, int64_t heads, int64_t dim, uint64_t seed) {
  return random_bshd(seq, heads, dim, seed).to(DType::kBF16);
}

bool device_equals_host(const TensorView& device_view, const TensorView& host_view) {
  std::vector<char> bytes(device_view.nbytes());
  copy_bytes(bytes.data(), Device::cpu(), device_view.data(), device_view.device(), device_view.nbytes());
  return host_view.nbytes() == bytes.size() && std::memcmp(bytes.data(), host_view.data(), bytes.size()) == 0;
}

// Store a chunk, offload it, and immediately load its blocks back: every load must see the chunk
// just offloaded (offload → load ordering), and the next store must not clobber an offload in flight.
TEST(CudaOffloadEngine, OffloadThenLoadOrderingHoldsAcrossManyChunks) {
  SKIP_WITHOUT_GPU();
  const OffloadConfig c = gpu_config();
  auto engine = make_cuda_offload_engine(ExecContext{}, c);
  std::vector<Tensor> ks, vs;
  for (int32_t chunk = 0; chunk < 12; ++chunk) {
    ks.push_back(random_bf16(256, c.num_kv_heads, c.head_dim, 100 + chunk));
    vs.push_back(random_bf16(256, c.num_kv_heads, c.head_dim, 200 + chunk));
    engine->store_prefill_kv(chunk % 2, ks.back().view(), vs.back().view());
    const int32_t blocks[] = {4 * chunk, 4 * chunk + 1, 4 * chunk + 2, 4 * chunk + 3};
    engine->offload_prefill_blocks(chunk % 2, blocks, 256);
    for (int64_t i = 0; i < 3; ++i) engine->load_to_slot_layer(i, chunk % 2, blocks[i + 1]);
    for (int64_t i = 0; i < 3; ++i) {
      engine->wait_slot_layer(i);
      engine->synchronize();
      const auto [k, v] = engine->get_kv_for_slot(i);
      EXPECT_TRUE(device_equals_host(k, rows(ks.back().view(), 64 * (i + 1), 64))) << "chunk " << chunk << " slot " << i;
      EXPECT_TRUE(device_equals_host(v, rows(vs.back().view(), 64 * (i + 1), 64))) << "chunk " << chunk << " slot " << i;
      engine->record_slot_compute_done(i);
    }
  }
  engine->synchronize();
  for (int32_t chunk = 0; chunk < 12; ++chunk) {
    const auto [hk, hv] = engine->host_block(chunk % 2, 4 * chunk + 3);
    EXPECT_EQ(std::memcmp(hk.data(), rows(ks[chunk].view(), 192, 64).data(), hk.nbytes()), 0) << chunk;
    EXPECT_EQ(std::memcmp(hv.data(), rows(vs[chunk].view(), 192, 64).data(), hv.nbytes()), 0) << chunk;
  }
  const OffloadStats stats = engine->stats();
  EXPECT_EQ(stats.loads, 36);
  EXPECT_EQ(stats.offloads, 48);
  EXPECT_GT(engine->measure_peak_h2d_bandwidth(), 1.0);
}

TEST(CudaOffloadEngine, DecodeBufferOffload) {
  SKIP_WITHOUT_GPU();
  const OffloadConfig c = gpu_config();
  auto engine = make_cuda_offload_engine(ExecContext{}, c);
  const Tensor k = random_bf16(64, c.num_kv_heads, c.head_dim, 1), v = random_bf16(64, c.num_kv_heads, c.head_dim, 2);
  for (int64_t t = 0; t < 64; ++t) engine->store_decode_kv(1, t, rows(k.view(), t, 1), rows(v.view(), t, 1));
  EXPECT_TRUE(device_equals_host(engine->decode_buffer_slice(1, 10, 20).first, rows(k.view(), 10, 10)));
  engine->offload_decode_block(1, 9, 64);
  engine->wait_offloads(1);
  EXPECT_EQ(std::memcmp(engine->host_block(1, 9).first.data(), k.data(), k.nbytes()), 0);
  EXPECT_EQ(std::memcmp(engine->host_block(1, 9).second.data(), v.data(), v.nbytes()), 0);
}

// load_keys issued right after offloads (no host wait) copies the keys those offloads wrote, in list
// order, and compute issued afterwards on the engine's compute stream sees them.
TEST(CudaOffloadEngine, LoadKeysRightAfterOffloadsSeesTheOffloadedKeys) {
  SKIP_WITHOUT_GPU();
  const OffloadConfig c = gpu_config();
  auto engine = make_cuda_offload_engine(ExecContext{}, c);
  const int64_t block_rows = c.block_size;
  Tensor dst = Tensor::zeros({1, 40 * block_rows, c.num_kv_heads, c.head_dim}, DType::kBF16, Device::cuda(0));
  Tensor mirror = Tensor::zeros(dst.shape(), DType::kBF16, Device::cuda(0));
  std::vector<Tensor> ks;
  std::vector<int32_t> offloaded;
  int64_t expected_blocks = 0;
  for (int32_t chunk = 0; chunk < 8; ++chunk) {
    ks.push_back(random_bf16(256, c.num_kv_heads, c.head_dim, 300 + chunk));
    const Tensor v = random_bf16(256, c.num_kv_heads, c.head_dim, 400 + chunk);
    engine->store_prefill_kv(0, ks.back().view(), v.view());
    const int32_t blocks[] = {4 * chunk, 4 * chunk + 1, 4 * chunk + 2, 4 * chunk + 3};
    engine->offload_prefill_blocks(0, blocks, 256);
    offloaded.insert(offloaded.end(), std::begin(blocks), std::end(blocks));
    // Newest first, so runs of consecutive blocks and the freshly offloaded ones are both exercised.
    std::vector<int32_t> order(offloaded.rbegin(), offloaded.rend());
    std::swap(order[0], order[order.size() - 1]);
    engine->load_keys(0, order, dst.view());
    expected_blocks += static_cast<int64_t>(order.size());
#ifdef TESSEL_WITH_CUDA
    ASSERT_EQ(cudaMemcpyAsync(mirror.data(), dst.data(), order.size() * block_rows * c.num_kv_heads * c.head_dim * 2,
                              cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(engine->compute_stream())),
              cudaSuccess);
#endif
    engine->synchronize();
    for (size_t i = 0; i < order.size(); ++i) {
      const TensorView want = rows(ks[order[i] / 4].view(), (order[i] % 4) * block_rows, block_rows);
      EXPECT_TRUE(device_equals_host(rows(mirror.view(), static_cast<int64_t>(i) * block_rows, block_rows), want))
          << "chunk " << chunk << " position " << i << " block " << order[i];
    }
  }
  // A decode block offloaded a moment ago.
  const Tensor kd = random_bf16(64, c.num_kv_heads, c.head_dim, 500);
  engine->store_decode_kv(0, 0, kd.view(), kd.view());
  engine->offload_decode_block(0, 33, 64);
  const int32_t with_decode[] = {33, 0};
  engine->load_keys(0, with_decode, dst.view());
  engine->synchronize();
  EXPECT_TRUE(device_equals_host(rows(dst.view(), 0, block_rows), kd.view()));
  EXPECT_TRUE(device_equals_host(rows(dst.view(), block_rows, block_rows), rows(ks[0].view(), 0, block_rows)));
  const OffloadStats stats = engine->stats();
  EXPECT_EQ(stats.key_loads, expected_blocks + 2);
  EXPECT_EQ(stats.bytes_h2d_keys, (expected_blocks + 2) * block_rows * c.num_kv_heads * c.head_dim * 2);
}

// Full chunked prefill + decode on the GPU equals monolithic causal attention (bf16 tolerance).
TEST(CudaOffloadEngine, FullPolicyChunkedPrefillAndDecodeMatchReference) {
  SKIP_WITHOUT_GPU();
  const OffloadConfig c = gpu_config();
  const int64_t heads = 4, seq = 700, decode = 70, total = seq + decode;
  auto engine = make_cuda_offload_engine(ExecContext{}, c);
  KvBlockManager manager(c.num_host_blocks, c.block_size);
  FullPolicy full;
  OffloadedAttention attention(*engine, manager, full, full);
  attention.start_sequence();
  const Tensor q = random_bf16(total, heads, c.head_dim, 11), k = random_bf16(total, c.num_kv_heads, c.head_dim, 12),
               v = random_bf16(total, c.num_kv_heads, c.head_dim, 13);
  const Tensor qd = q.to(Device::cuda(0)), kd = k.to(Device::cuda(0)), vd = v.to(Device::cuda(0));
  Tensor out = Tensor::zeros({1, total, heads, c.head_dim}, DType::kBF16, Device::cuda(0));
  const int64_t chunk_sizes[] = {128, 256, 64, 192, 60};
  int64_t first = 0, index = 0;
  for (int64_t n : chunk_sizes) {
    attention.begin_chunk(n, index++, 5);
    for (int64_t l = 0; l < 2; ++l)
      attention.prefill_layer(ExecContext{}, l, rows(qd, first, n), rows(kd, first, n), rows(vd, first, n), rows(out, first, n));
    attention.end_chunk();
    first += n;
  }
  for (int64_t t = seq; t < total; ++t) {
    attention.begin_decode_step();
    for (int64_t l = 0; l < 2; ++l)
      attention.decode_layer(ExecContext{}, l, rows(qd, t, 1), rows(kd, t, 1), rows(vd, t, 1), rows(out, t, 1));
    attention.end_decode_step();
  }
  engine->synchronize();
  AttentionOptions causal;
  causal.causal = true;
  const auto ref = reference::attention(q.view(), k.view(), v.view(), causal);
  EXPECT_LT(testing::max_error(out.to(Device::cpu()).view(), ref), 3e-2);
}

}  // namespace
}  // namespace tessel::kv
