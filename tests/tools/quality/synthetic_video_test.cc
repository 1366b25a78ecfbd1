#include "quality/synthetic_video.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "sparse/pattern_test_util.h"
#include "quality/mask_image.h"
#include "quality/output_error.h"

namespace tessel {
namespace {

// Softmax row of query token i in head h over all keys (fp64).
std::vector<double> attention_row(const SyntheticQkv& d, int64_t h, int64_t i) {
  const int64_t seq = d.q.size(1), heads = d.q.size(2), dim = d.q.size(3);
  const float* q = d.q.data_as<float>();
  const float* k = d.k.data_as<float>();
  std::vector<double> p(seq);
  double mx = -INFINITY, total = 0.0;
  for (int64_t j = 0; j < seq; ++j) {
    double s = 0.0;
    for (int64_t c = 0; c < dim; ++c) s += double(q[(i * heads + h) * dim + c]) * k[(j * heads + h) * dim + c];
    p[j] = s / std::sqrt(double(dim));
    mx = std::max(mx, p[j]);
  }
  for (double& x : p) total += (x = std::exp(x - mx));
  for (double& x : p) x /= total;
  return p;
}

TEST(SyntheticVideo, HeadTypesAttendAsDescribed) {
  SyntheticVideoOptions o;
  o.grid = {5, 8, 8};
  o.heads = 4;
  o.head_dim = 64;
  o.head_types = {SyntheticHeadType::kSpatial, SyntheticHeadType::kTemporal, SyntheticHeadType::kSink, SyntheticHeadType::kDiffuse};
  const SyntheticQkv d = make_synthetic_video_qkv(o);
  EXPECT_EQ(d.q.shape(), (Shape{1, 320, 4, 64}));
  const int64_t query = 2 * 64 + 4 * 8 + 4;  // frame 2, row 4, column 4
  double same_frame_local = 0, same_position = 0, temporal_own_frame = 0, frame0 = 0, max_diffuse = 0;
  const std::vector<double> spatial = attention_row(d, 0, query), temporal = attention_row(d, 1, query),
                            sink = attention_row(d, 2, query), diffuse = attention_row(d, 3, query);
  for (int64_t j = 0; j < 320; ++j) {
    const int64_t f = j / 64, y = (j / 8) % 8, x = j % 8;
    if (f == 2 && std::abs(y - 4) <= 2 && std::abs(x - 4) <= 2) same_frame_local += spatial[j];
    if (std::abs(y - 4) <= 1 && std::abs(x - 4) <= 1 && std::abs(f - 2) <= 2) same_position += temporal[j];
    if (f == 2) temporal_own_frame += temporal[j];
    if (f == 0) frame0 += sink[j];
    max_diffuse = std::max(max_diffuse, diffuse[j]);
  }
  EXPECT_GT(same_frame_local, 0.6) << "spatial head";
  EXPECT_GT(same_position, 0.35) << "temporal head: nearby frames, same position";
  EXPECT_LT(temporal_own_frame, 0.6) << "temporal head: not confined to its frame";
  EXPECT_GT(frame0, 0.5) << "sink head";
  EXPECT_LT(max_diffuse, 0.05) << "diffuse head";
}

TEST(SyntheticVideo, DeterministicAndSharpnessSharpens) {
  SyntheticVideoOptions o;
  o.grid = {2, 4, 4};
  o.heads = 2;
  o.head_dim = 32;
  const SyntheticQkv a = make_synthetic_video_qkv(o), b = make_synthetic_video_qkv(o);
  EXPECT_EQ(std::memcmp(a.q.data(), b.q.data(), a.q.nbytes()), 0);
  EXPECT_EQ(compare_outputs(a.v.view(), b.v.view()).rel_l2, 0.0);
  o.sharpness = 3.0;
  const SyntheticQkv sharp = make_synthetic_video_qkv(o);
  const std::vector<double> soft_row = attention_row(a, 0, 5), sharp_row = attention_row(sharp, 0, 5);
  EXPECT_GT(*std::max_element(sharp_row.begin(), sharp_row.end()), *std::max_element(soft_row.begin(), soft_row.end()));
  o.head_types = {SyntheticHeadType::kSink};
  testing::expect_error([&] { make_synthetic_video_qkv(o); }, "head_types");
  o.head_types.clear();
  o.head_dim = 7;
  testing::expect_error([&] { make_synthetic_video_qkv(o); }, "head_dim");
}

TEST(OutputError, RelL2AndCosine) {
  Tensor a = Tensor::empty({4}, DType::kF32), b = Tensor::empty({4}, DType::kF32);
  const float av[] = {1, 0, 0, 0}, bv[] = {1, 1, 0, 0};
  std::memcpy(a.data(), av, sizeof av);
  std::memcpy(b.data(), bv, sizeof bv);
  const OutputError e = compare_outputs(a.view(), b.view());
  EXPECT_NEAR(e.rel_l2, 1.0 / std::sqrt(2.0), 1e-12);
  EXPECT_NEAR(e.cosine, 1.0 / std::sqrt(2.0), 1e-12);
}

TEST(MaskImage, RendersKeptBlocksAndFrameLines) {
  // 2 frames of 4 tokens, token blocks: frame-diagonal mask.
  const BlockMaskShape shape{1, 2, 8, 8, 1, 1};
  std::vector<std::vector<int32_t>> rows;
  for (int h = 0; h < 2; ++h)
    for (int r = 0; r < 8; ++r) rows.push_back(h == 0 || r == 0 ? std::vector<int32_t>{r} : std::vector<int32_t>{0, r});
  const BlockMask mask = BlockMask::from_rows(shape, rows);
  const TokenLayout layout{{2, 2, 2}, 0, true};
  MaskImageOptions o;
  o.pixels_per_block = 2;
  o.layout = &layout;
  const RgbImage mean = render_mask(mask, o);
  EXPECT_EQ(mean.width, 16);
  EXPECT_EQ(mean.height, 16);
  auto px = [&](const RgbImage& img, int64_t x, int64_t y) { return img.pixels[(y * img.width + x) * 3]; };
  EXPECT_EQ(px(mean, 2, 2), 0);      // diagonal, kept by both heads
  EXPECT_EQ(px(mean, 1, 14), 128);   // column 0 of row 7: kept by one head of two
  EXPECT_EQ(px(mean, 14, 1), 255);   // skipped
  EXPECT_EQ(mean.pixels[(8 * 16 + 1) * 3 + 0], 220);  // the frame line at token 4 (y = 8) is red
  o.head = 0;
  EXPECT_EQ(px(render_mask(mask, o), 1, 14), 255);
  o.head = 2;
  testing::expect_error([&] { render_mask(mask, o); }, "head");
  const std::string path = std::string(TESSEL_BINARY_DIR) + "/mask_image_test.png";
  write_png(path, mean);
  std::FILE* f = std::fopen(path.c_str(), "rb");
  ASSERT_NE(f, nullptr);
  unsigned char sig[8];
  ASSERT_EQ(std::fread(sig, 1, 8, f), 8u);
  std::fclose(f);
  EXPECT_EQ(std::memcmp(sig, "\x89PNG\r\n\x1a\n", 8), 0);
}

}  // namespace
}  // namespace tessel
