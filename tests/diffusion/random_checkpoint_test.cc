// The streamed random checkpoints of `init-model --preset wan-1.3b|wan-14b`, at small shapes: a
// checkpoint over the shard limit is split with an index that diffusers' loader layout reads back
// (tessel's Checkpoint and the UMT5 loader); the values follow each tensor's distribution; the same
// seed gives the same bytes whatever the thread count; bad input is an Error naming it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "random_checkpoint.h"
#include "tessel/core/error.h"
#include "tessel/diffusion/tiny_model.h"
#include "tessel/dit/checkpoint.h"

namespace tessel {
namespace {

namespace fs = std::filesystem;

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::path(::testing::TempDir()) / (name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// An odd mix: a uniform matrix, a normal vector around 1, and a tensor larger than one parallel task.
std::vector<RandomTensorSpec> specs() {
  return {{{"blocks.0.linear.weight", {37, 53}}, {false, -0.25, 0.25}},
          {{"blocks.0.norm.weight", {301}}, {true, 1.0, 0.1}},
          {{"embedding.weight", {3, 100003}}, {true, 0.0, 0.02}}};
}

void expect_moments(const Tensor& t, double mean, double stddev, const std::string& name) {
  double sum = 0.0, squares = 0.0;
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) {
    const double v = t.data_as<float>()[i];
    sum += v;
    squares += v * v;
  }
  const double m = sum / static_cast<double>(n), sd = std::sqrt(squares / static_cast<double>(n) - m * m);
  // Five standard errors of the mean and of the deviation (at least 3% for bf16's rounding).
  EXPECT_NEAR(m, mean, 5.0 * stddev / std::sqrt(static_cast<double>(n))) << name;
  EXPECT_NEAR(sd, stddev, std::max(0.03, 5.0 / std::sqrt(2.0 * static_cast<double>(n))) * stddev) << name;
}

TEST(RandomCheckpoint, ShardsWithAnIndexThatLoadsBack) {
  const fs::path dir = fresh_dir("random_checkpoint_shards");
  // 1,961 + 301 + 300,009 bf16 elements; a 100,000-byte limit puts the big tensor alone in a second shard.
  const uint64_t bytes =
      write_random_checkpoint({dir, kDiffusersWeightsFile, kDiffusersWeightsIndex, 100000}, specs(), DType::kBF16, 5, 3);
  EXPECT_EQ(bytes, (37 * 53 + 301 + 3 * 100003) * 2u);
  EXPECT_TRUE(fs::exists(dir / kDiffusersWeightsIndex));
  EXPECT_TRUE(fs::exists(dir / "diffusion_pytorch_model-00001-of-00002.safetensors"));
  EXPECT_TRUE(fs::exists(dir / "diffusion_pytorch_model-00002-of-00002.safetensors"));
  EXPECT_FALSE(fs::exists(dir / kDiffusersWeightsFile));

  const Checkpoint checkpoint = Checkpoint::open(dir.string());
  std::vector<WeightSpec> expected;
  for (const RandomTensorSpec& s : specs()) expected.push_back(s.spec);
  check_checkpoint(checkpoint, expected);
  EXPECT_EQ(checkpoint.view("embedding.weight").dtype(), DType::kBF16);
  const std::map<std::string, Tensor> weights = load_weights(checkpoint, expected, DType::kF32);
  const Tensor& linear = weights.at("blocks.0.linear.weight");
  for (int64_t i = 0; i < linear.numel(); ++i) {
    ASSERT_GE(linear.data_as<float>()[i], -0.25f);
    ASSERT_LE(linear.data_as<float>()[i], 0.25f);
  }
  expect_moments(linear, 0.0, 0.5 / std::sqrt(12.0), "uniform");
  expect_moments(weights.at("blocks.0.norm.weight"), 1.0, 0.1, "normal around 1");
  expect_moments(weights.at("embedding.weight"), 0.0, 0.02, "normal");
}

TEST(RandomCheckpoint, SameSeedSameBytesOnAnyThreadCount) {
  const fs::path one = fresh_dir("random_checkpoint_t1"), many = fresh_dir("random_checkpoint_t4"),
                 other = fresh_dir("random_checkpoint_seed");
  write_random_checkpoint({one, "model.safetensors", "model.safetensors.index.json"}, specs(), DType::kF32, 9, 1);
  write_random_checkpoint({many, "model.safetensors", "model.safetensors.index.json"}, specs(), DType::kF32, 9, 4);
  write_random_checkpoint({other, "model.safetensors", "model.safetensors.index.json"}, specs(), DType::kF32, 10, 4);
  const std::string a = read_bytes(one / "model.safetensors"), b = read_bytes(many / "model.safetensors");
  ASSERT_GT(a.size(), (37 * 53 + 301 + 3 * 100003) * 4u);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, read_bytes(other / "model.safetensors"));
  // 8 length bytes, the header padded to a multiple of 8, then the data.
  EXPECT_EQ((a.size() - (37 * 53 + 301 + 3 * 100003) * 4u) % 8, 0u);
}

TEST(RandomCheckpoint, BadInputIsAnError) {
  const fs::path dir = fresh_dir("random_checkpoint_errors");
  try {
    write_random_checkpoint({dir, "x.safetensors", "x.index.json"}, specs(), DType::kF16, 0, 1);
    FAIL() << "fp16 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected bf16 or fp32, got fp16"), std::string::npos) << e.what();
  }
  try {
    write_random_checkpoint({dir / "missing" / "deeper", "x.safetensors", "x.index.json"}, specs(), DType::kF32, 0, 1);
    FAIL() << "a missing directory accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing/deeper/x.safetensors"), std::string::npos) << e.what();
  }
  try {
    write_random_wan_model((dir / "model").string(), "wan-7b");
    FAIL() << "an unknown preset accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("one of tiny, tiny-a14b, tiny-cuda, tiny-ti2v, tiny-i2v, tiny-flf2v, tiny-i2v-a14b, wan-1.3b, wan-14b, "
                                                 "wan-ti2v-5b, wan-i2v-14b"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessel
