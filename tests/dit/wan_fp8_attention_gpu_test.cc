// FP8 self-attention in the Wan CUDA runtime (WanAttentionOptions::precision kFp8):
//  - the RMSNorm + RoPE kernel that also quantizes (launch_rms_norm_rope_fp8) gives, bit for bit,
//    the bf16 values of launch_rms_norm_rope and the e4m3 bytes and 64-token scales that the FP8
//    attention's own quantizer makes of them (read back from the attention's workspace through
//    fp8_attention_query_key), with and without storing the bf16 values, on sequences that end in a
//    partial 64-token block;
//  - attention given those operands (AttentionOptions::fp8_query_key_given, its q/k slots poisoned
//    first) gives the output of attention that quantizes q and k itself, bit for bit, and stays
//    within the FP8 mode's bound of the bf16 attention: relative L2 <= 6.5 %
//    (tests/kernels/attention_fp8_gpu_test.cc: e4m3's 3-bit mantissa on q, k, v and P);
//  - the whole transformer with fp8 self-attention against the same weights with bf16 attention:
//    within the same 6.5 % (the attention output's error enters the fp32 residual stream through
//    the output projection, beside the bf16 paths that do not change, so the output's error is at
//    most the attention's), and above 1e-5 (the FP8 path ran), deterministic;
//  - the refusals a GPU can see: head dim 64, a sparse configuration.
// Every case prints its errors. Skips without a compute capability 9.0 GPU (the FP8 attention
// kernel's); the CPU refusals are in wan_parity_test.cc.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "dit_test_util.h"
#include "wan_tiny_cases.h"
#include "tessel/core/device.h"
#include "tessel/core/error.h"
#include "tessel/core/exec_context.h"
#include "tessel/dit/wan_model.h"
#include "tessel/kernels/attention.h"
#include "tessel/kernels/attention_tuning.h"
#include "tessel/sparse/registry.h"

#ifdef TESSEL_WITH_CUDA
#include <cuda_runtime.h>

#include "cuda/wan_kernels.h"
#endif

namespace tessel {
namespace {

constexpr double kFp8AttentionRelativeL2 = 0.065;  // attention_fp8_gpu_test.cc's bound
constexpr double kMinFp8RelativeL2 = 1e-5;

bool fp8_attention_gpu() {
#ifdef TESSEL_WITH_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) return false;
  return !attention_kernel_variants(Device::cuda(), 128, AttentionPrecision::kFp8).empty();
#else
  return false;
#endif
}

#define SKIP_WITHOUT_FP8_ATTENTION_GPU() \
  if (!fp8_attention_gpu()) GTEST_SKIP() << "no compute capability 9.0 GPU visible (the FP8 attention kernel's): GPU test skipped"

bool bit_equal(const Tensor& a, const Tensor& b) { return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0; }

#ifdef TESSEL_WITH_CUDA
using dit::cuda::bf16;

int64_t differing_bytes(const Tensor& a, const Tensor& b) {
  const auto* x = static_cast<const uint8_t*>(a.data());
  const auto* y = static_cast<const uint8_t*>(b.data());
  int64_t n = 0;
  for (size_t i = 0; i < a.nbytes(); ++i) n += x[i] != y[i];
  return n;
}

// The bf16 attention output (B, S, H, D) as fp32 on the host.
Tensor host_f32(const Tensor& bf16_device) { return bf16_device.to(Device::cpu()).to(DType::kF32); }

struct NormCase {
  int64_t batch, frames, height, width, heads;
  bool rope;
};

Tensor copy_of(const Tensor& t) {
  Tensor c = Tensor::empty(t.shape(), t.dtype(), t.device());
  EXPECT_EQ(cudaMemcpy(c.data(), t.data(), t.nbytes(), cudaMemcpyDeviceToDevice), cudaSuccess);
  return c;
}

// `count` device bytes at `data` as a host tensor of `dtype`.
Tensor from_device(const void* data, const Shape& shape, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype);
  EXPECT_EQ(cudaMemcpy(t.data(), data, t.nbytes(), cudaMemcpyDeviceToHost), cudaSuccess);
  return t;
}

TEST(WanFp8Attention, FusedQuantizationGivesTheAttentionQuantizersBytes) {
  SKIP_WITHOUT_FP8_ATTENTION_GPU();
  const Device gpu = Device::cuda();
  // The call given q and k cannot smooth K (the fused kernel has no channel means), so the call that
  // quantizes for itself runs a variant without smoothing too: plain "fp8" (the default smooths).
  force_attention_kernel_variant(gpu, 128, "fp8", AttentionPrecision::kFp8);
  struct LiftForcedVariant {
    Device device;
    ~LiftForcedVariant() { force_attention_kernel_variant(device, 128, "", AttentionPrecision::kFp8); }
  } lift{gpu};
  constexpr int64_t kD = 128;
  constexpr float kEps = 1e-6f;
  uint64_t seed = 900;
  for (const NormCase& c : {NormCase{2, 2, 10, 10, 3, true}, NormCase{1, 1, 8, 8, 2, true}, NormCase{1, 2, 5, 13, 5, true},
                            NormCase{2, 3, 7, 9, 4, false}}) {
    const int64_t seq = c.frames * c.height * c.width, dim = c.heads * kD, blocks = (seq + 63) / 64;
    SCOPED_TRACE(testing::Message() << "B=" << c.batch << " S=" << seq << " H=" << c.heads << (c.rope ? " rope" : " no rope"));
    const Tensor x = Tensor::empty({c.batch, seq, c.heads, kD}, DType::kBF16, gpu);
    const Tensor v = Tensor::empty({c.batch, seq, c.heads, kD}, DType::kBF16, gpu);
    const Tensor weight = Tensor::empty({dim}, DType::kF32, gpu);
    const Tensor cos = Tensor::empty({seq, kD / 2}, DType::kF32, gpu), sin = Tensor::empty({seq, kD / 2}, DType::kF32, gpu);
    // Channel offsets and a wide spread, as q and k projections have before their norm.
    dit::cuda::launch_fill_random(x.data(), true, x.numel(), seed++, true, 0.7f, 3.0f, nullptr);
    dit::cuda::launch_fill_random(v.data(), true, v.numel(), seed++, true, 0.0f, 1.0f, nullptr);
    dit::cuda::launch_fill_random(weight.data(), false, dim, seed++, false, 0.25f, 2.0f, nullptr);
    dit::cuda::launch_wan_rope_tables(c.frames, c.height, c.width, kD, cos.data_as<float>(), sin.data_as<float>(), nullptr);
    const float* cos_table = c.rope ? cos.data_as<float>() : nullptr;
    const float* sin_table = c.rope ? sin.data_as<float>() : nullptr;
    const float* w = weight.data_as<float>();

    // The unfused kernel's bf16 values, and the fused kernel's (stored, and not stored).
    const Tensor unfused = copy_of(x), fused = copy_of(x), fused_quiet = copy_of(x);
    dit::cuda::launch_rms_norm_rope(static_cast<bf16*>(unfused.data()), c.batch * seq, seq, c.heads, kD, kEps, w, cos_table, sin_table,
                                    nullptr);
    Tensor bytes = Tensor::empty({c.batch, seq, c.heads, kD}, DType::kU8, gpu), scales = Tensor::empty({c.batch, c.heads, blocks}, DType::kF32, gpu);
    Tensor bytes_quiet = Tensor::empty(bytes.shape(), DType::kU8, gpu), scales_quiet = Tensor::empty(scales.shape(), DType::kF32, gpu);
    for (const Tensor* t : {&bytes, &scales, &bytes_quiet, &scales_quiet}) ASSERT_EQ(cudaMemset(t->data(), 0xFF, t->nbytes()), cudaSuccess);
    dit::cuda::launch_rms_norm_rope_fp8(static_cast<bf16*>(fused.data()), c.batch, seq, c.heads, kD, kEps, w, cos_table, sin_table, true,
                                        {static_cast<uint8_t*>(bytes.data()), scales.data_as<float>()}, nullptr);
    dit::cuda::launch_rms_norm_rope_fp8(static_cast<bf16*>(fused_quiet.data()), c.batch, seq, c.heads, kD, kEps, w, cos_table, sin_table,
                                        false, {static_cast<uint8_t*>(bytes_quiet.data()), scales_quiet.data_as<float>()}, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_TRUE(bit_equal(fused.to(Device::cpu()), unfused.to(Device::cpu()))) << "the fused kernel's bf16 values differ";
    EXPECT_TRUE(bit_equal(fused_quiet.to(Device::cpu()), x.to(Device::cpu()))) << "store_bf16 false changed x";

    // The attention's own quantizer on the unfused values, read back from its workspace.
    const AttentionDims dims{c.batch, seq, seq, c.heads, c.heads, kD, AttentionPrecision::kFp8};
    Workspace workspace(gpu);
    ExecContext ctx;
    ctx.device = gpu;
    ctx.workspace = &workspace;
    workspace.reserve(attention_workspace_bytes(ctx, gpu, dims));
    AttentionOptions fp8;
    fp8.precision = AttentionPrecision::kFp8;
    const Tensor out_quantizer = Tensor::empty(x.shape(), DType::kBF16, gpu), out_given = Tensor::empty(x.shape(), DType::kBF16, gpu);
    const Tensor out_bf16 = Tensor::empty(x.shape(), DType::kBF16, gpu);
    attention_forward(ctx, unfused.view(), unfused.view(), v.view(), out_quantizer.view(), TensorView{}, fp8);
    const Fp8QueryKey slots = fp8_attention_query_key(ctx, gpu, dims);
    const Tensor quantizer_bytes = from_device(slots.q, bytes.shape(), DType::kU8);
    const Tensor quantizer_scales = from_device(slots.q_scales, scales.shape(), DType::kF32);
    const Tensor fused_bytes = bytes.to(Device::cpu()), fused_scales = scales.to(Device::cpu());
    std::printf("[B=%lld S=%lld H=%lld%s] fused vs quantizer: %lld of %zu e4m3 bytes differ, scales %s\n",
                static_cast<long long>(c.batch), static_cast<long long>(seq), static_cast<long long>(c.heads), c.rope ? " rope" : "",
                static_cast<long long>(differing_bytes(fused_bytes, quantizer_bytes)), fused_bytes.nbytes(),
                bit_equal(fused_scales, quantizer_scales) ? "bit-equal" : "DIFFER");
    EXPECT_TRUE(bit_equal(fused_bytes, quantizer_bytes));
    EXPECT_TRUE(bit_equal(fused_scales, quantizer_scales));
    EXPECT_TRUE(bit_equal(bytes_quiet.to(Device::cpu()), fused_bytes));
    EXPECT_TRUE(bit_equal(scales_quiet.to(Device::cpu()), fused_scales));

    // Attention given the fused kernel's q and k (their slots poisoned first): the same output.
    const size_t q_bytes = static_cast<size_t>(c.batch * seq * c.heads * kD), scale_bytes = static_cast<size_t>(c.batch * c.heads * blocks) * 4;
    for (void* slot : {static_cast<void*>(slots.q), static_cast<void*>(slots.k)}) ASSERT_EQ(cudaMemset(slot, 0xFF, q_bytes), cudaSuccess);
    for (void* slot : {static_cast<void*>(slots.q_scales), static_cast<void*>(slots.k_scales)})
      ASSERT_EQ(cudaMemset(slot, 0xFF, scale_bytes), cudaSuccess);
    const Tensor q_in = copy_of(x), k_in = copy_of(x);
    dit::cuda::launch_rms_norm_rope_fp8(static_cast<bf16*>(q_in.data()), c.batch, seq, c.heads, kD, kEps, w, cos_table, sin_table, false,
                                        {slots.q, slots.q_scales}, nullptr);
    dit::cuda::launch_rms_norm_rope_fp8(static_cast<bf16*>(k_in.data()), c.batch, seq, c.heads, kD, kEps, w, cos_table, sin_table, false,
                                        {slots.k, slots.k_scales}, nullptr);
    AttentionOptions given = fp8;
    given.fp8_query_key_given = true;
    attention_forward(ctx, q_in.view(), k_in.view(), v.view(), out_given.view(), TensorView{}, given);
    attention_forward(ctx, unfused.view(), unfused.view(), v.view(), out_bf16.view(), TensorView{});
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const Tensor given_host = host_f32(out_given), bf16_host = host_f32(out_bf16);
    const double error = rel_l2(given_host, bf16_host);
    std::printf("    given operands vs own quantization: %s; fp8 vs bf16 attention rel-L2 %.4f (bound %.3f)\n",
                bit_equal(out_given.to(Device::cpu()), out_quantizer.to(Device::cpu())) ? "bit-equal" : "DIFFER", error,
                kFp8AttentionRelativeL2);
    EXPECT_TRUE(bit_equal(out_given.to(Device::cpu()), out_quantizer.to(Device::cpu())));
    EXPECT_LE(error, kFp8AttentionRelativeL2);
    EXPECT_GE(error, kMinFp8RelativeL2);
  }
}
#endif

Tensor cuda_forward(const WanTransformer& model, const wan_test::Inputs& in) {
  const Device gpu = Device::cuda();
  Tensor out = Tensor::zeros(in.latents.shape(), DType::kF32, gpu);
  Workspace workspace(gpu);
  ExecContext ctx;
  ctx.device = gpu;
  ctx.workspace = &workspace;
  model.forward(ctx, StepInfo{}, in.latents.to(gpu), in.timestep.to(gpu), in.text.to(gpu), out);
  return out.to(Device::cpu());
}

TEST(WanFp8Attention, TransformerWithFp8SelfAttentionStaysWithinTheFp8Bound) {
  SKIP_WITHOUT_FP8_ATTENTION_GPU();
  WanAttentionOptions fp8;
  fp8.precision = AttentionPrecision::kFp8;
  uint64_t seed = 500;
  // Head dim 128 (the FP8 mode's): 1 and 2 blocks, 2 and 3 heads, sequences of 320 and 405 tokens
  // (a partial last 64-token block), batch 1 and 2.
  const std::vector<wan_test::Case> shapes = {
      {"2x128_batch2_1_block_320_tokens", wan_test::tiny_config(2, 128, 256, 48, 1, true), 2, 5, 16, 16, 7, wan_test::Timesteps::kPerEntry},
      {"3x128_batch1_2_blocks_405_tokens", wan_test::tiny_config(3, 128, 384, 40, 2, false), 1, 5, 18, 18, 13,
       wan_test::Timesteps::kPerEntry},
  };
  for (const wan_test::Case& c : shapes) {
    SCOPED_TRACE(c.name);
    const WanTransformer bf16 = WanTransformer::random(c.config, seed, {}, Device::cuda());
    const WanTransformer with_fp8 = bf16.with_attention(fp8);
    const WanTransformer random_fp8 = WanTransformer::random(c.config, seed, fp8, Device::cuda());
    const wan_test::Inputs in(c, seed += 10);
    const Tensor reference = cuda_forward(bf16, in);
    const Tensor first = cuda_forward(with_fp8, in), second = cuda_forward(with_fp8, in);
    const double error = rel_l2(first, reference);
    std::printf("[%s] fp8 vs bf16 self-attention, whole output: rel-L2 %.4f (bound %.3f); twice bit-equal: %s\n", c.name.c_str(), error,
                kFp8AttentionRelativeL2, bit_equal(first, second) ? "yes" : "NO");
    EXPECT_LE(error, kFp8AttentionRelativeL2);
    EXPECT_GE(error, kMinFp8RelativeL2);
    EXPECT_TRUE(bit_equal(first, second));
    EXPECT_TRUE(bit_equal(first, cuda_forward(random_fp8, in))) << "random(..., fp8) and with_attention(fp8) differ";
  }
}

TEST(WanFp8Attention, RefusalsNameTheOption) {
  SKIP_WITHOUT_FP8_ATTENTION_GPU();
  WanAttentionOptions fp8;
  fp8.precision = AttentionPrecision::kFp8;
  const auto expect_refusal = [](const std::string& what, const auto& call) {
    try {
      call();
      ADD_FAILURE() << "no Error: " << what;
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("--attention-dtype"), std::string::npos) << message;
      EXPECT_NE(message.find(what), std::string::npos) << message;
    }
  };
  expect_refusal("head dim 128", [&] { WanTransformer::random(wan_test::tiny_config(2, 64, 256, 48, 1, true), 1, fp8, Device::cuda()); });
  BackendRegistry registry(false);
  WanAttentionOptions sparse = fp8;
  sparse.registry = &registry;
  expect_refusal("dense self-attention",
                 [&] { WanTransformer::random(wan_test::tiny_config(2, 128, 256, 48, 1, true), 1, sparse, Device::cuda()); });
}

}  // namespace
}  // namespace tessel
