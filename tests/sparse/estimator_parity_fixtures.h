// The parity fixtures under tests/fixtures/sparse_parity/ (q, k, and the official estimators' masks
// with their settings), and the estimator options that reproduce each official setting. Shared by
// the CPU and CUDA parity tests.
#pragma once

#include "test_source_dir.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <iostream>

#include "tessel/core/io/safetensors.h"
#include "tessel/sparse/block_mask.h"
#include "tessel/sparse/estimators/topk_estimator.h"
#include "tessel/sparse/estimators/xattention_estimator.h"

namespace tessel::parity {

// One official setting: "spargeattn" (top-k or cdf) or "xattention" (threshold and stride).
struct Setting {
  std::string name, method;
  int64_t block_q = 0, block_kv = 0;
  double topk = 0.0, cdf = 0.0, similarity_threshold = 0.0;
  bool smooth_k = true;
  double threshold = 0.0;
  int64_t stride = 0;
};

struct Fixture {
  std::string name;
  Tensor q, k;                               // (B, S, H, D) fp16
  std::map<std::string, Tensor> masks;       // (B, H, Qb, KVb) uint8, by setting name
  std::vector<Setting> settings;
};

inline std::vector<Fixture> load_fixtures() {
  const std::filesystem::path folder = test_support::source_dir() / "tests" / "fixtures" / "sparse_parity";
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(folder))
    if (entry.path().extension() == ".safetensors") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  std::vector<Fixture> fixtures;
  for (const auto& path : files) {
    const SafetensorsFile file = SafetensorsFile::open(path.string());
    Fixture f{path.stem().string(), file.load("q"), file.load("k"), {}, {}};
    const nlohmann::json settings = nlohmann::json::parse(file.metadata().at("settings"));
    for (const auto& [name, j] : settings.items()) {
      Setting s;
      s.name = name;
      s.method = j.at("method").get<std::string>();
      s.block_q = j.at("block_q").get<int64_t>();
      s.block_kv = j.at("block_kv").get<int64_t>();
      if (s.method == "spargeattn") {
        if (!j.at("topk").is_null()) s.topk = j.at("topk").get<double>();
        if (!j.at("cdf").is_null()) s.cdf = j.at("cdf").get<double>();
        s.similarity_threshold = j.at("simthreshd1").get<double>();
        s.smooth_k = j.at("smooth_k").get<bool>();
      } else {
        s.threshold = j.at("threshold").get<double>();
        s.stride = j.at("stride").get<int64_t>();
      }
      f.masks.emplace(name, file.load(name));
      f.settings.push_back(s);
    }
    fixtures.push_back(std::move(f));
  }
  return fixtures;
}

// SpargeAttn's get_block_map_meansim_fuse_quant without causal mask or attention sink.
inline TopkEstimatorOptions topk_options(const Setting& s) {
  TopkEstimatorOptions o;
  o.block_q = s.block_q;
  o.block_kv = s.block_kv;
  o.similarity_threshold = s.similarity_threshold;
  o.smooth_k = s.smooth_k;
  o.rule = TopkRule::kSpargeAttn;
  if (s.cdf > 0.0) o.cdf_threshold = s.cdf;
  else o.topk_ratio = s.topk;
  return o;
}

// XAttention's non-causal estimate: no forced diagonal, block 0 kept, zero-padded keys.
inline XAttentionOptions xattention_options(const Setting& s) {
  XAttentionOptions o;
  o.block_q = s.block_q;
  o.block_kv = s.block_kv;
  o.threshold = s.threshold;
  o.stride = s.stride;
  o.keep_diagonal = false;
  o.keep_first = true;
  o.padding = XAttentionPadding::kChunk;
  return o;
}

// Fraction of the cells of `official` (B, H, Qb, KVb) that `mask` (mask_batch B, mask_heads H) matches.
inline double agreement(const BlockMask& mask, const Tensor& official) {
  const std::vector<uint8_t> ours = mask.to_dense();
  const uint8_t* theirs = official.data_as<uint8_t>();
  const int64_t cells = official.numel();
  if (static_cast<int64_t>(ours.size()) != cells) return 0.0;
  int64_t same = 0;
  for (int64_t i = 0; i < cells; ++i) same += (ours[static_cast<size_t>(i)] != 0) == (theirs[i] != 0);
  return static_cast<double>(same) / static_cast<double>(cells);
}

// For every fixture and setting: the mask that `mask_of(fixture, setting)` estimates must agree with
// the official one on at least 99% of the blocks; prints each agreement, labelled with `where`.
template <typename MaskOf>
void expect_parity_on_every_fixture(MaskOf mask_of, const char* where) {
  const std::vector<Fixture> fixtures = load_fixtures();
  ASSERT_FALSE(fixtures.empty());
  for (const Fixture& f : fixtures)
    for (const Setting& s : f.settings) {
      const double a = agreement(mask_of(f, s), f.masks.at(s.name));
      std::cout << f.name << " " << s.name << " " << where << ": " << a << "\n";
      EXPECT_GE(a, 0.99) << f.name << " " << s.name << " " << where;
    }
}

}  // namespace tessel::parity
