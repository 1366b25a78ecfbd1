// The UMT5 encoder's bf16 CUDA forward against transformers (the tests/fixtures/diffusion/umt5
// fixture, float64) and against tessel's fp32 CPU forward on random configs with odd sizes: head
// dims that are not a multiple of 4, sequences that end mid-tile (70 tokens: 3 query tiles of 32, 2
// key tiles of 64), a padded second row, several layers.
//
// Yardstick: the CPU forward on the weights rounded to bf16 where the CUDA encoder keeps them in
// bf16 differs from the plain CPU forward by E_round, the error bf16 storage alone implies; the CUDA
// forward also rounds every GEMM operand (norm outputs, q/k/v, attention output, the gated FFN
// hidden) once, so its error is expected near 2 x E_round and is held to 4 x E_round. A wrong
// bucket, a missing bias or mask, or a wrong gate moves the output by tens of percent. Rows of
// padding are not compared (transformers' output there is not used). Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "tessel/core/device.h"
#include "tessel/core/error.h"
#include "tessel/core/io/safetensors.h"
#include "tessel/core/random.h"
#include "tessel/diffusion/umt5_encoder.h"
#include "diffusion/diffusion_test_util.h"

namespace tessel {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible (or tessel built without CUDA): GPU test skipped"

const std::string kDir = std::string(TESSEL_SOURCE_DIR) + "/tests/fixtures/diffusion/umt5";

// Weights the CUDA encoder stores in bf16 (the embedding and the linears) rounded to bf16.
std::map<std::string, Tensor> rounded_like_cuda(const std::map<std::string, Tensor>& weights) {
  std::map<std::string, Tensor> out;
  for (const auto& [name, tensor] : weights) {
    const bool kept_fp32 = name.find("layer_norm") != std::string::npos || name.find("relative_attention_bias") != std::string::npos;
    out[name] = kept_fp32 ? tensor.clone() : tensor.to(DType::kBF16).to(DType::kF32);
  }
  return out;
}

// rel-L2 over the rows whose mask is 1.
double masked_rel_l2(const Tensor& actual, const Tensor& expected, const Tensor& mask) {
  const int64_t width = expected.size(2);
  double diff = 0.0, norm = 0.0;
  for (int64_t row = 0; row < mask.numel(); ++row) {
    if (mask.data_as<int32_t>()[row] == 0) continue;
    for (int64_t i = 0; i < width; ++i) {
      const double want = expected.data_as<float>()[row * width + i], got = actual.data_as<float>()[row * width + i];
      diff += (got - want) * (got - want);
      norm += want * want;
    }
  }
  return std::sqrt(diff / norm);
}

Tensor run(const UMT5Encoder& encoder, const Tensor& ids, const Tensor& mask) {
  Tensor out = Tensor::empty({ids.size(0), ids.size(1), encoder.config().d_model}, DType::kF32);
  fill(out.view(), std::nan(""));  // poisoned: every row must be written
  encoder.forward(ExecContext{}, ids, mask, out);
  return out;
}

TEST(UMT5EncoderCuda, MatchesTransformersAndTheCpuForward) {
  SKIP_WITHOUT_GPU();
  const auto [config, weights] = load_umt5_fixture(kDir);
  const UMT5Encoder cpu(config, weights), cpu_rounded(config, rounded_like_cuda(weights));
  const UMT5Encoder cuda = UMT5Encoder::load(kDir, Device::cuda());
  EXPECT_TRUE(cuda.device().is_cuda());
  const SafetensorsFile io = SafetensorsFile::open(kDir + "/io.safetensors");
  const Tensor ids = io.load("input_ids"), mask = io.load("attention_mask"), expected = io.load("last_hidden_state");
  const Tensor on_gpu = run(cuda, ids, mask);
  const double e_round = masked_rel_l2(run(cpu_rounded, ids, mask), run(cpu, ids, mask), mask);
  const double vs_cpu = masked_rel_l2(on_gpu, run(cpu, ids, mask), mask);
  const double vs_transformers = masked_rel_l2(on_gpu, expected, mask);
  std::printf("UMT5 fixture: CUDA rel-L2 vs CPU %.3e, vs transformers float64 %.3e, bf16 storage alone %.3e\n", vs_cpu,
              vs_transformers, e_round);
  EXPECT_GT(e_round, 0.0);
  EXPECT_LE(vs_cpu, 4.0 * e_round);
  EXPECT_LE(vs_transformers, 4.0 * e_round + 1e-5);
}

TEST(UMT5EncoderCuda, RandomOddConfigsMatchTheCpuForward) {
  SKIP_WITHOUT_GPU();
  struct Case {
    int64_t d_model, heads, d_kv, d_ff, layers, length;
  };
  for (const Case& c : {Case{96, 3, 40, 136, 3, 70}, Case{64, 2, 128, 96, 2, 33}, Case{48, 4, 12, 40, 2, 5}}) {
    UMT5Config config;
    config.vocab_size = 211;
    config.d_model = c.d_model;
    config.num_heads = c.heads;
    config.d_kv = c.d_kv;
    config.d_ff = c.d_ff;
    config.num_layers = c.layers;
    std::map<std::string, Tensor> weights;
    uint64_t seed = 100;
    for (const WeightSpec& spec : umt5_weight_specs(config)) {
      Tensor t = Tensor::empty(spec.shape, DType::kF32);
      const bool norm = spec.name.find("layer_norm") != std::string::npos;
      fill_normal(t.view(), ++seed, norm ? 1.0 : 0.0, norm ? 0.1 : 1.0 / std::sqrt(static_cast<double>(spec.shape.back())));
      weights[spec.name] = std::move(t);
    }
    Tensor ids = Tensor::empty({2, c.length}, DType::kI32), mask = Tensor::empty({2, c.length}, DType::kI32);
    for (int64_t i = 0; i < 2 * c.length; ++i) {
      ids.data_as<int32_t>()[i] = static_cast<int32_t>((i * 37 + 11) % config.vocab_size);
      // Row 1 keeps its first two thirds (at least one token), then padding.
      mask.data_as<int32_t>()[i] = i < c.length || i - c.length < std::max<int64_t>(1, 2 * c.length / 3) ? 1 : 0;
    }
    const UMT5Encoder cpu(config, weights), cpu_rounded(config, rounded_like_cuda(weights));
    const UMT5Encoder cuda(config, weights, Device::cuda());
    const Tensor reference = run(cpu, ids, mask);
    const double e_round = masked_rel_l2(run(cpu_rounded, ids, mask), reference, mask);
    const double error = masked_rel_l2(run(cuda, ids, mask), reference, mask);
    std::printf("UMT5 d_model %lld, %lld heads of %lld, %lld tokens: CUDA rel-L2 vs CPU %.3e, bf16 storage alone %.3e\n",
                static_cast<long long>(c.d_model), static_cast<long long>(c.heads), static_cast<long long>(c.d_kv),
                static_cast<long long>(c.length), error, e_round);
    EXPECT_GT(e_round, 0.0);
    EXPECT_LE(error, 4.0 * e_round) << "d_model " << c.d_model;
  }
}

TEST(UMT5EncoderCuda, BadInputIsAnError) {
  SKIP_WITHOUT_GPU();
  const UMT5Encoder cuda = UMT5Encoder::load(kDir, Device::cuda());
  Tensor ids = Tensor::zeros({1, 4}, DType::kI32), mask = Tensor::zeros({1, 4}, DType::kI32);
  ids.data_as<int32_t>()[2] = static_cast<int32_t>(cuda.config().vocab_size);
  Tensor out = Tensor::empty({1, 4, cuda.config().d_model}, DType::kF32);
  try {
    cuda.forward(ExecContext{}, ids, mask, out);
    FAIL() << "an id past the vocabulary accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("input_ids"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessel
