// Multi-process tests (mpirun with 2 and 4 ranks, and the forked shared-memory build): the Wan VAE
// decode split by height over a group (WanVae::decode's `group`) against the one-rank decode of the
// same latents, which every rank computes itself. Groups of 2, 3 and 4 ranks are split from the
// world (the ranks left over form a group of their own, down to one rank: the whole-frame path);
// the random weights are the tiny presets' (Wan 2.1's layout, and Wan 2.2's residual, patched one);
// latents of odd heights and widths give bands that differ by a row and bands of one row, and
// three latent frames run the causal feature cache over three chunks (the first of one frame, then
// two of four).
//
// Tolerance: none. Each output pixel of a band is the same sum, in the same order, as in the
// whole-frame decode (the halo rows are the neighbours' rows, the attention runs on the gathered
// whole frame), so the CPU decodes are compared bit for bit; a wrong or missing halo row changes
// the rows next to every band edge by far more than a rounding.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "error_of.h"
#include "multi_process_test_main.h"
#include "tessel/core/error.h"
#include "tessel/core/random.h"
#include "tessel/diffusion/tiny_model.h"
#include "tessel/diffusion/video_frames.h"
#include "tessel/diffusion/wan_generator.h"
#include "tessel/diffusion/wan_vae.h"
#include "tessel/parallel/communicator.h"
#include "tessel/parallel/parallel_config.h"
#include "wan_vae_row_bands.h"

namespace tessel {
namespace {

using testing::error_of;

Communicator& world() { return testing::test_world(); }

// A group of `size` ranks split from the world (ranks 0 .. size - 1); the others form a group of the
// rest. Collective over the world.
std::unique_ptr<Communicator> group_of(int size) { return world().split(world().rank() < size ? 0 : 1, world().rank()); }

Tensor random_latents(const WanVaeConfig& config, int64_t frames, int64_t height, int64_t width, uint64_t seed) {
  Tensor latents = Tensor::empty({1, config.z_dim, frames, height, width}, DType::kF32);
  fill_normal(latents.view(), seed);
  return latents;
}

// The decode into a video poisoned with NaN, so that a value no rank wrote shows.
Tensor decode_into_poison(const WanVae& vae, const Tensor& latents, Communicator* group, const WanDecodeControl* control = nullptr) {
  Tensor video = Tensor::empty(vae.decoded_shape(latents.shape()), DType::kF32);
  std::fill_n(video.data_as<float>(), video.numel(), std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(vae.decode(ExecContext{}, latents, video, control, group));
  return video;
}

// The number of values that differ in their bits (NaN differs from everything).
int64_t differing_values(const Tensor& a, const Tensor& b) {
  int64_t differing = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    if (std::memcmp(a.data_as<const float>() + i, b.data_as<const float>() + i, sizeof(float)) != 0) ++differing;
  return differing;
}

struct Model {
  const char* name;
  WanVaeConfig config;
};

std::vector<Model> models() { return {{"wan2.1", tiny_wan_vae_config()}, {"wan2.2-residual", tiny_ti2v_wan_vae_config()}}; }

TEST(RowBands, AreBalancedInRankOrderAndScaleWithTheStage) {
  const vae::RowBands bands(7, 3, 2);
  EXPECT_EQ(bands.rows(0), 3);
  EXPECT_EQ(bands.rows(1), 2);
  EXPECT_EQ(bands.rows(2), 2);
  EXPECT_EQ(bands.begin(2), 5);
  EXPECT_EQ(bands.max_rows(), 3);
  EXPECT_EQ(bands.scale_of(16), 8);
  EXPECT_NE(error_of([&] { bands.scale_of(3); }).find("not a multiple"), std::string::npos);
  const vae::RowBands ones(4, 4, 3);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(ones.rows(r), 1);
  const std::string message = error_of([] { vae::RowBands(2, 3, 0); });
  EXPECT_NE(message.find("latent height"), std::string::npos) << message;
}

// Every group size the world allows, both layouts, heights that split unevenly and into bands of one
// row, one and three latent frames: bit-equal to one rank's decode.
TEST(WanVaeSplitDecode, EqualsTheOneRankDecodeBitForBit) {
  struct Size {
    int64_t frames, height, width;
  };
  const Size sizes[] = {{3, 5, 3}, {1, 7, 4}, {3, 4, 5}, {2, 9, 1}};
  uint64_t seed = 100;
  for (const Model& model : models()) {
    const WanVae vae(model.config, random_model_weights(wan_vae_weight_specs(model.config), 7), WanVaeParts::kDecoder);
    for (int size = 2; size <= world().size(); ++size) {
      const std::unique_ptr<Communicator> group = group_of(size);
      for (const Size& s : sizes) {
        const Tensor latents = random_latents(model.config, s.frames, s.height, s.width, seed++);
        const Tensor expected = vae.decode(ExecContext{}, latents);
        const Tensor split = decode_into_poison(vae, latents, group.get());
        ASSERT_EQ(split.shape(), expected.shape());
        const int64_t differing = differing_values(split, expected);
        if (world().rank() == 0)
          std::printf("%-16s group of %d, latents %lld x %lld x %lld: %lld of %lld values differ\n", model.name, group->size(),
                      static_cast<long long>(s.frames), static_cast<long long>(s.height), static_cast<long long>(s.width),
                      static_cast<long long>(differing), static_cast<long long>(expected.numel()));
        EXPECT_EQ(differing, 0) << model.name << ", group of " << group->size() << ", latents " << shape_str(latents.shape());
      }
    }
  }
}

// Fewer latent rows than ranks: every rank decodes whole frames, as without a group.
TEST(WanVaeSplitDecode, FewerRowsThanRanksDecodeWholeFramesOnEveryRank) {
  const WanVaeConfig config = tiny_wan_vae_config();
  const WanVae vae(config, random_model_weights(wan_vae_weight_specs(config), 8), WanVaeParts::kDecoder);
  const Tensor latents = random_latents(config, 2, 1, 3, 31);
  const Tensor expected = vae.decode(ExecContext{}, latents);
  EXPECT_EQ(differing_values(decode_into_poison(vae, latents, &world()), expected), 0);
}

// A cancel seen by one rank stops every rank at the same chunk: the others would otherwise wait for
// it in the next chunk's exchanges.
TEST(WanVaeSplitDecode, ACancelOnOneRankStopsEveryRankAtTheSameChunk) {
  const WanVaeConfig config = tiny_wan_vae_config();
  const WanVae vae(config, random_model_weights(wan_vae_weight_specs(config), 9), WanVaeParts::kDecoder);
  const Tensor latents = random_latents(config, 4, 6, 3, 41);
  std::atomic<bool> cancel{false};
  int64_t chunks = 0;
  WanDecodeControl control;
  control.cancel = &cancel;
  control.on_chunk = [&](int64_t done, int64_t) {
    chunks = done;
    if (done == 2 && world().rank() == world().size() - 1) cancel = true;  // the last rank alone
  };
  Tensor video = Tensor::empty(vae.decoded_shape(latents.shape()), DType::kF32);
  EXPECT_FALSE(vae.decode(ExecContext{}, latents, video, &control, &world()));
  EXPECT_EQ(chunks, 2);
  // The Tensor form returns an empty tensor.
  cancel = world().rank() == 0;
  EXPECT_FALSE(vae.decode(ExecContext{}, latents, &control, &world()).defined());
}

TEST(WanVaeSplitDecode, AGroupOfAnotherDeviceIsAnErrorNamingIt) {
  if (!cuda_compiled()) GTEST_SKIP() << "a CUDA communicator needs a CUDA build";
  const WanVaeConfig config = tiny_wan_vae_config();
  const WanVae vae(config, random_model_weights(wan_vae_weight_specs(config), 10), WanVaeParts::kDecoder);
  const Tensor latents = random_latents(config, 1, 4, 4, 51);
  const std::unique_ptr<Communicator> device_group = make_single_rank_communicator(Device::cuda(0));
  const std::string message = error_of([&] { vae.decode(ExecContext{}, latents, nullptr, device_group.get()); });
  EXPECT_NE(message.find("group"), std::string::npos) << message;
  EXPECT_NE(message.find("cpu"), std::string::npos) << message;
}

// The generator under sequence parallelism decodes over each sequence group: its frames are those of
// one rank's decode of the same latents.
TEST(WanGeneratorSplitDecode, FramesEqualOneRanksDecodeOfTheLatents) {
  // Each rank writes its own copy of the same random model (one seed): no file is shared.
  const std::string dir = detail::concat(::testing::TempDir(), "generator_split_decode_", getpid());
  write_random_wan_model(dir, "tiny", 23, 1);
  WanRequest request;
  request.prompt = "a red cube";
  request.frames = 9;
  request.height = 48;
  request.width = 32;
  request.steps = 2;
  request.guidance = 5.0;
  request.seed = 4;
  const WanVae vae = WanVae::load(dir + "/vae", WanVaeParts::kDecoder);
  struct Layout {
    int ring, cfg;
    bool split;
  };
  // Ring over the world; CFG-parallel over two ring groups (each branch's group decodes); the
  // split turned off (each rank decodes whole frames).
  std::vector<Layout> layouts = {{world().size(), 1, true}, {world().size(), 1, false}};
  if (world().size() % 2 == 0) layouts.push_back({world().size() / 2, 2, true});
  for (const Layout& layout : layouts) {
    ParallelConfig config;
    config.sp_ring_degree = layout.ring;
    config.cfg_parallel_size = layout.cfg;
    const ParallelGroups groups = initialize_parallel_groups(world(), config);
    WanLoadOptions options;
    options.parallel = &groups;
    options.split_decode = layout.split;
    const WanGenerationResult result = WanGenerator::load(ExecContext{}, dir, options).generate(ExecContext{}, request).generation;
    const VideoFrames expected = video_frames_from_tensor(vae.decode(ExecContext{}, result.latents));
    ASSERT_EQ(result.frames.count, expected.count);
    EXPECT_TRUE(result.frames.rgb == expected.rgb) << "ring " << layout.ring << ", cfg " << layout.cfg << (layout.split ? ", split" : "");
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tessel
