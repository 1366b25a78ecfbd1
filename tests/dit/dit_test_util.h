// Helpers of the dit tests: the committed Wan fixture (written by scripts/make_wan_fixture.py) and
// scratch directories for checkpoints a test breaks on purpose.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tessel/core/random.h"
#include "tessel/core/tensor.h"
#include "tessel/dit/wan_weights.h"
#include "test_source_dir.h"

namespace tessel {

inline std::filesystem::path wan_fixture_dir() { return test_support::source_dir() / "tests/fixtures/wan"; }
// The CUDA forward's fixture (scripts/make_wan_fixture.py --gpu: head dim 64, bf16-stored weights).
inline std::filesystem::path wan_gpu_fixture_dir() { return test_support::source_dir() / "tests/fixtures/wan_gpu"; }

// A fresh directory under the test temp dir, unique per test and process, removed at the end.
class ScratchDir {
 public:
  ScratchDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::path(::testing::TempDir()) /
            ("tessel_dit_" + std::string(info->test_suite_name()) + "_" + info->name() + "_" + std::to_string(getpid()));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  // A writable copy of the directory `source` inside this one.
  std::filesystem::path copy_of(const std::filesystem::path& source) const {
    const std::filesystem::path copy = path_ / source.filename();
    std::filesystem::copy(source, copy, std::filesystem::copy_options::recursive);
    for (const auto& entry : std::filesystem::directory_iterator(copy))
      std::filesystem::permissions(entry.path(), std::filesystem::perms::owner_read | std::filesystem::perms::owner_write,
                                   std::filesystem::perm_options::add);
    return copy;
  }

 private:
  std::filesystem::path path_;
};

// ||actual - expected|| / ||expected|| over fp32 CPU tensors of one shape.
inline double rel_l2(const Tensor& actual, const Tensor& expected) {
  double diff = 0.0, norm = 0.0;
  for (int64_t i = 0; i < expected.numel(); ++i) {
    const double e = expected.data_as<float>()[i];
    const double d = static_cast<double>(actual.data_as<float>()[i]) - e;
    diff += d * d;
    norm += e * e;
  }
  return std::sqrt(diff / norm);
}

// Every tensor of `config`'s transformer drawn as WanTransformer::random draws it, but the norm
// weights drawn around 1 (not exactly 1) so that a missed norm weight shows.
inline std::map<std::string, Tensor> random_wan_weights(const WanConfig& config, uint64_t seed) {
  std::map<std::string, Tensor> weights;
  for (const WeightSpec& spec : wan_weight_specs(config)) {
    Tensor tensor = Tensor::empty(spec.shape, DType::kF32);
    const WanRandomInit init = wan_random_init(config, spec);
    if (init.normal)
      fill_normal(tensor.view(), ++seed, init.first, init.second);
    else if (init.first == init.second)
      fill_uniform(tensor.view(), ++seed, 0.5 * init.first, 1.5 * init.first);
    else
      fill_uniform(tensor.view(), ++seed, init.first, init.second);
    weights.emplace(spec.name, std::move(tensor));
  }
  return weights;
}

inline nlohmann::json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return nlohmann::json::parse(text.str());
}

}  // namespace tessel
