// The Wan CUDA forward with FP8 block weights (WanWeightPrecision::kFp8) against the bf16 CUDA
// forward of the same weights, on the tiny random configs of wan_cuda_gpu_test.cc and on the
// diffusers fixture checkpoint (tests/fixtures/wan_gpu, against diffusers' float64 output). Every
// case prints its measured errors. Skips without a GPU of compute capability 8.9+ (FP8 tensor
// cores); the CPU model's refusal of kFp8 runs everywhere.
//
// Bound: e4m3 keeps 3 mantissa bits, a relative rounding of at most 2^-4 per element (RMS ~0.026
// on normal data); a GEMM with both operands quantised per row has an output rel-L2 of ~0.04
// (tests/kernels/fp8_linear_gpu_test.cc measures it). The blocks' GEMM outputs enter the fp32
// residual stream beside the patch embedding (bf16, not quantised), and the output projection
// stays bf16, so the output's error is at most that size where the blocks dominate the stream,
// smaller where they do not: allowed 0.1 against bf16 (a wrong scale, transposed weight or
// missing bias gives errors of order 1), and at least 1e-4 (the FP8 path really ran: the bf16
// model run twice is bit-equal). Against diffusers' float64 output the fp8 model is allowed
// 0.1 as well, printed beside the bf16 model's error.
//
// FP8 checkpoints (tessel/dit/wan_transformer_file.h): a LightX2V file written from a model
// directory (init-model --weights fp8) and loaded with kFp8 gives the in-memory fp8 model of the
// directory bit for bit (same e4m3 bytes and scales, so the same output: compared through the
// forward, which is deterministic), in memory and offloaded; each format's file loaded with kFp8
// (bytes as stored) stays within the FP8 bound of the bf16 model of its dequantised values.
//
// Also: the fp8 model is deterministic (bit-equal over two forwards); with offloaded blocks it is
// bit-equal to the in-memory fp8 model (random and loaded weights), its device bytes shrink by
// the block linear weights' half (less the scales); the LayerNorm kernel's fused quantisation
// gives the row quantiser's bytes.
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
#include "tessel/core/io/safetensors.h"
#include "tessel/core/random.h"
#include "tessel/diffusion/tiny_model.h"
#include "tessel/dit/wan_model.h"
#include "tessel/dit/wan_transformer_file.h"
#include "tessel/dit/wan_weights.h"

#ifdef TESSEL_WITH_CUDA
#include <cuda_runtime.h>

#include "cuda/wan_kernels.h"
#include "tessel/kernels/cuda/fp8_rows.h"
#endif

namespace tessel {
namespace {

bool fp8_gpu() {
#ifdef TESSEL_WITH_CUDA
  int count = 0, device = 0, major = 0, minor = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0 || cudaGetDevice(&device) != cudaSuccess) return false;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  return major * 10 + minor >= 89;
#else
  return false;
#endif
}

#define SKIP_WITHOUT_FP8_GPU() \
  if (!fp8_gpu()) GTEST_SKIP() << "no GPU of compute capability 8.9+ visible (FP8 tensor cores): GPU test skipped"

using wan_test::Case;
using wan_test::cases;
using wan_test::Inputs;

constexpr double kMaxFp8RelativeL2 = 0.1;
constexpr double kMinFp8RelativeL2 = 1e-4;

Tensor cuda_forward(const WanTransformer& model, const Tensor& latents, const Tensor& timestep, const Tensor& text) {
  const Device gpu = Device::cuda();
  Tensor out = Tensor::zeros(latents.shape(), DType::kF32, gpu);
  Workspace workspace(gpu);
  ExecContext ctx;
  ctx.device = gpu;
  ctx.workspace = &workspace;
  model.forward(ctx, StepInfo{}, latents.to(gpu), timestep.to(gpu), text.to(gpu), out);
  return out.to(Device::cpu());
}

// The inputs' forward; with an image branch, over the inputs' CLIP features.
Tensor cuda_forward(const WanTransformer& model, const Inputs& in) {
  if (!in.image.defined()) return cuda_forward(model, in.latents, in.timestep, in.text);
  const Device gpu = Device::cuda();
  Tensor out = Tensor::zeros(wan_test::output_shape(model.config(), in.latents), DType::kF32, gpu);
  Workspace workspace(gpu);
  ExecContext ctx;
  ctx.device = gpu;
  ctx.workspace = &workspace;
  model.forward(ctx, StepInfo{}, in.latents.to(gpu), in.timestep.to(gpu), in.text.to(gpu), in.image.to(gpu), out);
  return out.to(Device::cpu());
}

bool bit_equal(const Tensor& a, const Tensor& b) { return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0; }

// Bytes fp8 precision saves on the device: each block linear weight's second byte per element,
// less its scales (slices are 256-byte aligned: `slack` bytes of rounding per tensor).
int64_t expected_saving(const WanConfig& config, int64_t& slack) {
  int64_t saving = 0;
  slack = 0;
  for (const WeightSpec& spec : wan_weight_specs(config)) {
    if (!wan_fp8_weight(spec.name)) continue;
    saving += shape_numel(spec.shape) - spec.shape[0] * 4;
    slack += 3 * 256;
  }
  return saving;
}

TEST(WanFp8, ForwardStaysNearTheBf16ForwardAndIsDeterministic) {
  SKIP_WITHOUT_FP8_GPU();
  uint64_t seed = 300;
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    // The same draws: fp8 quantises kBf16's bf16 weights.
    const WanTransformer bf16 = WanTransformer::random(c.config, seed, {}, Device::cuda());
    const WanTransformer fp8 =
        WanTransformer::random(c.config, seed, {}, Device::cuda(), WanWeightResidency::kDevice, WanWeightPrecision::kFp8);
    const Inputs in(c, seed += 10);
    const Tensor reference = cuda_forward(bf16, in);
    const Tensor first = cuda_forward(fp8, in), second = cuda_forward(fp8, in);
    const double error = rel_l2(first, reference);
    int64_t slack = 0;
    const int64_t saving = expected_saving(c.config, slack);
    const int64_t saved = static_cast<int64_t>(bf16.weight_bytes()) - static_cast<int64_t>(fp8.weight_bytes());
    std::printf("[%s] fp8 vs bf16 CUDA forward: rel-L2 %.3e (bound %.2f); fp8 run twice bit-equal: %s; weights %zu -> %zu bytes "
                "(%.1f%%; block linears save %lld expected)\n",
                c.name.c_str(), error, kMaxFp8RelativeL2, bit_equal(first, second) ? "yes" : "NO", bf16.weight_bytes(),
                fp8.weight_bytes(), 100.0 * static_cast<double>(fp8.weight_bytes()) / static_cast<double>(bf16.weight_bytes()),
                static_cast<long long>(saving));
    EXPECT_LE(error, kMaxFp8RelativeL2);
    EXPECT_GE(error, kMinFp8RelativeL2);
    EXPECT_TRUE(bit_equal(first, second));
    EXPECT_NEAR(static_cast<double>(saved), static_cast<double>(saving), static_cast<double>(slack));
  }
}

TEST(WanFp8, OffloadedFp8BlocksGiveTheInMemoryFp8OutputBitForBit) {
  SKIP_WITHOUT_FP8_GPU();
  Case c = cases()[2];
  c.config.num_layers = 5;  // an odd count: the last block's slot is not the first's
  const WanTransformer resident =
      WanTransformer::random(c.config, 41, {}, Device::cuda(), WanWeightResidency::kDevice, WanWeightPrecision::kFp8);
  const WanTransformer offloaded =
      WanTransformer::random(c.config, 41, {}, Device::cuda(), WanWeightResidency::kOffloadBlocks, WanWeightPrecision::kFp8);
  const WanTransformer offloaded_bf16 = WanTransformer::random(c.config, 41, {}, Device::cuda(), WanWeightResidency::kOffloadBlocks);
  std::printf("offloaded blocks in pinned host memory: fp8 %zu bytes, bf16 %zu bytes (%.1f%%)\n", offloaded.offloaded_weight_bytes(),
              offloaded_bf16.offloaded_weight_bytes(),
              100.0 * static_cast<double>(offloaded.offloaded_weight_bytes()) / static_cast<double>(offloaded_bf16.offloaded_weight_bytes()));
  EXPECT_LT(offloaded.offloaded_weight_bytes(), offloaded_bf16.offloaded_weight_bytes());
  const size_t block = offloaded.offloaded_weight_bytes() / 5;
  EXPECT_EQ(offloaded.weight_bytes() + offloaded.offloaded_weight_bytes(), resident.weight_bytes() + 2 * block);
  for (uint64_t seed : {43u, 47u}) {
    const Inputs in(c, seed);
    EXPECT_TRUE(bit_equal(cuda_forward(resident, in), cuda_forward(offloaded, in))) << "seed " << seed;
  }
}

// Loaded weights (the quantisation at load, from the checkpoint's bf16 tensors) against
// diffusers' float64 forward of the fixture, beside the bf16 model's error; offloaded fp8 blocks
// of the loaded model equal the in-memory ones.
TEST(WanFp8, LoadedFixtureCheckpointInFp8) {
  SKIP_WITHOUT_FP8_GPU();
  const std::filesystem::path dir = wan_gpu_fixture_dir();
  const SafetensorsFile file = SafetensorsFile::open((dir / "io.safetensors").string());
  const Tensor exact = file.load("output_fp64");
  const std::string checkpoint = (dir / "checkpoint_bf16").string();
  const Device gpu = Device::cuda();
  const WanTransformer bf16 = WanTransformer::load(checkpoint, {}, gpu);
  const WanTransformer fp8 = WanTransformer::load(checkpoint, {}, gpu, nullptr, WanWeightResidency::kDevice, WanWeightPrecision::kFp8);
  const WanTransformer fp8_offloaded =
      WanTransformer::load(checkpoint, {}, gpu, nullptr, WanWeightResidency::kOffloadBlocks, WanWeightPrecision::kFp8);
  const Tensor latents = file.load("hidden_states"), timestep = file.load("timestep"), text = file.load("encoder_hidden_states");
  const Tensor out_bf16 = cuda_forward(bf16, latents, timestep, text), out_fp8 = cuda_forward(fp8, latents, timestep, text);
  const double bf16_error = rel_l2(out_bf16, exact), fp8_error = rel_l2(out_fp8, exact), fp8_vs_bf16 = rel_l2(out_fp8, out_bf16);
  std::printf("fixture vs diffusers float64: bf16 rel-L2 %.3e, fp8 rel-L2 %.3e; fp8 vs bf16 %.3e\n", bf16_error, fp8_error, fp8_vs_bf16);
  EXPECT_LE(fp8_error, kMaxFp8RelativeL2);
  EXPECT_LE(fp8_vs_bf16, kMaxFp8RelativeL2);
  EXPECT_GE(fp8_vs_bf16, kMinFp8RelativeL2);
  EXPECT_TRUE(bit_equal(out_fp8, cuda_forward(fp8_offloaded, latents, timestep, text)));
}

// A tiny CUDA-sized model directory and its FP8 files, as `init-model --weights fp8` writes them.
struct Fp8Files {
  ScratchDir scratch;
  std::string transformer, lightx2v, comfy;
  Fp8Files() {
    write_tiny_wan_model(scratch.path().string(), 17, TinyWanLayout::kOneExpert, tiny_cuda_wan_transformer_config());
    transformer = (scratch.path() / "transformer").string();
    const WanConfig config = tiny_cuda_wan_transformer_config();
    lightx2v = (scratch.path() / "transformer_fp8_lightx2v.safetensors").string();
    comfy = (scratch.path() / "transformer_fp8_comfyui.safetensors").string();
    write_wan_fp8_transformer_file(Checkpoint::open(transformer), config, lightx2v, WanFp8FileFormat::kLightX2V);
    write_wan_fp8_transformer_file(Checkpoint::open(transformer), config, comfy, WanFp8FileFormat::kComfyUi);
  }
};

Case fp8_file_case() { return Case{"tiny_cuda", tiny_cuda_wan_transformer_config(), 2, 3, 10, 6, 7, wan_test::Timesteps::kPerEntry}; }

TEST(WanFp8, Lightx2vFileReloadsTheInMemoryFp8ModelBitForBit) {
  SKIP_WITHOUT_FP8_GPU();
  const Fp8Files files;
  const Device gpu = Device::cuda();
  const WanTransformer in_memory =
      WanTransformer::load(files.transformer, {}, gpu, nullptr, WanWeightResidency::kDevice, WanWeightPrecision::kFp8);
  const WanTransformer from_file =
      WanTransformer::load(files.transformer, {}, gpu, nullptr, WanWeightResidency::kDevice, WanWeightPrecision::kFp8, files.lightx2v);
  const WanTransformer from_file_offloaded = WanTransformer::load(files.transformer, {}, gpu, nullptr, WanWeightResidency::kOffloadBlocks,
                                                                  WanWeightPrecision::kFp8, files.lightx2v);
  EXPECT_EQ(in_memory.weight_bytes(), from_file.weight_bytes());
  for (uint64_t seed : {51u, 53u}) {
    const Inputs in(fp8_file_case(), seed);
    const Tensor expected = cuda_forward(in_memory, in), got = cuda_forward(from_file, in);
    std::printf("[seed %llu] LightX2V file vs the in-memory fp8 model: bit-equal %s, offloaded bit-equal %s\n",
                static_cast<unsigned long long>(seed), bit_equal(got, expected) ? "yes" : "NO",
                bit_equal(cuda_forward(from_file_offloaded, in), expected) ? "yes" : "NO");
    EXPECT_TRUE(bit_equal(got, expected));
    EXPECT_TRUE(bit_equal(cuda_forward(from_file_offloaded, in), expected));
  }
}

TEST(WanFp8, Fp8FilesRunNearTheBf16ModelOfTheirDequantisedValues) {
  SKIP_WITHOUT_FP8_GPU();
  const Fp8Files files;
  const Device gpu = Device::cuda();
  const Inputs in(fp8_file_case(), 57);
  for (const std::string* file : {&files.lightx2v, &files.comfy}) {
    SCOPED_TRACE(*file);
    // kBf16 dequantises the e4m3 weights (fp32 multiply, then bf16); kFp8 runs the bytes as stored.
    const WanTransformer bf16 =
        WanTransformer::load(files.transformer, {}, gpu, nullptr, WanWeightResidency::kDevice, WanWeightPrecision::kBf16, *file);
    const WanTransformer fp8 =
        WanTransformer::load(files.transformer, {}, gpu, nullptr, WanWeightResidency::kDevice, WanWeightPrecision::kFp8, *file);
    const Tensor reference = cuda_forward(bf16, in), out = cuda_forward(fp8, in);
    const double error = rel_l2(out, reference);
    std::printf("[%s] fp8 forward of the file vs the bf16 model of its dequantised weights: rel-L2 %.3e (bound %.2f)\n",
                file->c_str(), error, kMaxFp8RelativeL2);
    EXPECT_LE(error, kMaxFp8RelativeL2);
    EXPECT_TRUE(bit_equal(out, cuda_forward(fp8, in)));
  }
}

#ifdef TESSEL_WITH_CUDA
// The LayerNorm that feeds the block GEMMs quantises its bf16 output itself (fused): its e4m3 bytes
// and scales equal the row quantiser's over that output, bit for bit (AdaLN, affine and plain rows,
// odd row count, a row of zeros: its scale is 1).
TEST(WanFp8, FusedLayerNormQuantisationEqualsTheRowQuantiser) {
  SKIP_WITHOUT_FP8_GPU();
  const int64_t rows = 37, dim = 320, group_rows = rows;
  const Device gpu = Device::cuda();
  Tensor x = Tensor::empty({rows, dim}, DType::kF32), table = Tensor::empty({2, dim}, DType::kF32),
         projection = Tensor::empty({1, 2 * dim}, DType::kF32), weight = Tensor::empty({dim}, DType::kF32),
         bias = Tensor::empty({dim}, DType::kF32);
  fill_normal(x.view(), 61);
  for (int64_t i = 0; i < dim; ++i) x.data_as<float>()[4 * dim + i] = 1.5f;  // a constant row: normed to zeros
  fill_normal(table.view(), 62, 0.0, 0.3);
  fill_normal(projection.view(), 63, 0.0, 0.3);
  fill_normal(weight.view(), 64, 1.0, 0.2);
  fill_normal(bias.view(), 65, 0.0, 0.1);
  const Tensor x_d = x.to(gpu), table_d = table.to(gpu), projection_d = projection.to(gpu), weight_d = weight.to(gpu),
               bias_d = bias.to(gpu);
  const float *t = table_d.data_as<float>(), *p = projection_d.data_as<float>();
  for (int kind = 0; kind < 3; ++kind) {
    SCOPED_TRACE(kind == 0 ? "AdaLN" : kind == 1 ? "affine" : "plain");
    dit::cuda::RowNormOutput output;
    if (kind == 0) {
      output.shift = dit::cuda::ModulationVector{t, p, 2 * dim};
      output.scale = dit::cuda::ModulationVector{t + dim, p + dim, 2 * dim};
    } else if (kind == 1) {
      output.weight = weight_d.data_as<float>();
      output.bias = bias_d.data_as<float>();
    }
    Tensor normed = Tensor::empty({rows, dim}, DType::kBF16, gpu);
    Tensor fused = Tensor::zeros({rows * dim}, DType::kU8, gpu), separate = Tensor::zeros({rows * dim}, DType::kU8, gpu);
    Tensor fused_scales = Tensor::zeros({rows}, DType::kF32, gpu), separate_scales = Tensor::zeros({rows}, DType::kF32, gpu);
    output.fp8 = fused.data_as<uint8_t>();
    output.fp8_scales = fused_scales.data_as<float>();
    dit::cuda::launch_layer_norm(x_d.data_as<float>(), static_cast<dit::cuda::bf16*>(normed.data()), rows, dim, group_rows, 1e-6f, output,
                                 nullptr);
    tessel::cuda::launch_quantize_rows_fp8(normed.data(), DType::kBF16, rows, dim, separate.data_as<uint8_t>(),
                                           separate_scales.data_as<float>(), nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const Tensor a = fused.to(Device::cpu()), b = separate.to(Device::cpu());
    const Tensor as = fused_scales.to(Device::cpu()), bs = separate_scales.to(Device::cpu());
    int64_t mismatches = 0;
    for (int64_t i = 0; i < rows * dim; ++i) mismatches += a.data_as<uint8_t>()[i] != b.data_as<uint8_t>()[i];
    std::printf("[fused LayerNorm + e4m3, kind %d] %lld byte mismatches against the row quantiser\n", kind,
                static_cast<long long>(mismatches));
    EXPECT_EQ(mismatches, 0);
    EXPECT_EQ(std::memcmp(as.data(), bs.data(), as.nbytes()), 0);
    if (kind == 2) EXPECT_EQ(as.data_as<float>()[4], 1.0f);  // the constant row normalises to zeros
  }
}
#endif

// FP8 is a CUDA precision: the CPU model refuses it, naming it.
TEST(WanFp8, TheCpuModelRefusesFp8Weights) {
  const Case c = cases()[0];
  try {
    (void)WanTransformer::random(c.config, 1, {}, Device::cpu(), WanWeightResidency::kDevice, WanWeightPrecision::kFp8);
    FAIL() << "a CPU model took fp8 weights";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fp8"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessel
