// The CLI's q/k/v file reader (tessel eval / tessel mask --qkv): a safetensors file with q, k and
// v in (B, S, H, D), checked for presence, rank and GQA head counts.
#include "quality/qkv_file.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "tessel/core/error.h"
#include "tessel/core/io/safetensors.h"
#include "tessel/core/random.h"

namespace tessel {
namespace {

std::string temp_path(const std::string& name) { return std::string(TESSEL_BINARY_DIR) + "/qkv_file_test_" + name; }

TEST(QkvFile, LoadsAndValidatesQkv) {
  Tensor q = Tensor::empty({1, 8, 4, 16}, DType::kBF16), k = Tensor::empty({1, 8, 2, 16}, DType::kBF16);
  fill_normal(q.view(), 1);
  fill_normal(k.view(), 2);
  const std::string path = temp_path("qkv.safetensors");
  write_safetensors(path, {{"q", q.view()}, {"k", k.view()}, {"v", k.view()}});
  const QkvTensors t = load_qkv_safetensors(path);
  EXPECT_EQ(t.q.shape(), q.shape());
  EXPECT_EQ(t.v.shape(), k.shape());
  const std::string missing = temp_path("qk.safetensors");
  write_safetensors(missing, {{"q", q.view()}, {"k", k.view()}});
  EXPECT_THROW(load_qkv_safetensors(missing), Error);
  Tensor flat = Tensor::empty({8, 4, 16}, DType::kF32);
  const std::string rank3 = temp_path("rank3.safetensors");
  write_safetensors(rank3, {{"q", flat.view()}, {"k", k.view()}, {"v", k.view()}});
  try {
    load_qkv_safetensors(rank3);
    ADD_FAILURE() << "rank 3 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank"), std::string::npos) << e.what();
  }
  Tensor k3 = Tensor::empty({1, 8, 3, 16}, DType::kBF16);
  const std::string heads = temp_path("heads.safetensors");
  write_safetensors(heads, {{"q", q.view()}, {"k", k3.view()}, {"v", k3.view()}});
  EXPECT_THROW(load_qkv_safetensors(heads), Error);
}

// Captured tensors holding NaN or infinities are refused with the count and the first position.
TEST(QkvFile, NonFiniteValuesAreRefused) {
  for (const float poison : {std::nanf(""), INFINITY, -INFINITY}) {
    Tensor q = Tensor::empty({1, 4, 1, 8}, DType::kBF16), k = Tensor::empty({1, 4, 1, 8}, DType::kBF16);
    fill_normal(q.view(), 1);
    fill_normal(k.view(), 2);
    Tensor poisoned = Tensor::empty({1, 4, 1, 8}, DType::kF32);
    fill_normal(poisoned.view(), 3);
    poisoned.data_as<float>()[13] = poison;
    const std::string path = temp_path("nonfinite.safetensors");
    write_safetensors(path, {{"q", q.view()}, {"k", k.view()}, {"v", poisoned.view()}});
    EXPECT_NO_THROW(SafetensorsFile::open(path));  // the header itself is fine
    try {
      load_qkv_safetensors(path);
      ADD_FAILURE() << "accepted " << poison;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("tensor 'v': expected finite values, got 1 non-finite of 32"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("at element (0, 1, 0, 5)"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace tessel
