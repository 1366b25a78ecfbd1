// `tessel generate` on Wan 2.2's two-expert layout: a directory around the two fixture transformers
// reaches diffusers' latents (--guidance-2 as guidance_scale_2); `init-model --preset tiny-a14b`
// writes a directory it runs, each expert with its own sparse config and cache; a bad layout
// (transformer_2 without boundary_ratio, a ratio outside (0, 1), an expand_timesteps that is no boolean) and the
// second expert's flags on a one-expert model are errors. `init-model --weights fp8` writes FP8
// files of both experts that --transformer-file / --transformer-2-file run (dequantised on the CPU).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>

#include "diffusion/diffusion_test_util.h"
#include "generate_cli_util.h"
#include "tessel/core/io/safetensors.h"

namespace tessel {
namespace {

namespace fs = std::filesystem;

const std::string kTwoExperts = R"("transformer_2": ["diffusers", "WanTransformer3DModel"], "boundary_ratio": 0.875)";

fs::path make_two_expert_dir(const std::string& name, const std::string& experts = kTwoExperts) {
  const fs::path dir = make_model_dir(name, "WanPipeline", experts);
  fs::create_directory_symlink(kFixtures + "/diffusion/wan22_two_experts/transformer_2", dir / "transformer_2");
  return dir;
}

Tensor latents_of(const fs::path& file) { return SafetensorsFile::open(file.string()).load("latents"); }

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.data(), b.data(), static_cast<size_t>(a.nbytes())) == 0;
}

TEST(GenerateTwoExpertsCli, ReachesTheLatentsOfDiffusers) {
  const fs::path dir = make_two_expert_dir("wan22_model");
  const fs::path out = dir / "latents.safetensors";
  const TesselRun run = generate("--model '" + dir.string() + "' --embeddings '" + kPipelineFixture + "' --noise '" +
                                 kPipelineFixture + "' --size 48x80 --frames 9 --steps 2 --guidance 5 --guidance-2 3 --threads 1 --out '" +
                                 out.string() + "'");
  ASSERT_EQ(run.status, 0) << run.out;
  EXPECT_NE(run.out.find("experts: 1 steps on transformer (high noise), 1 on transformer_2 (low noise), boundary timestep 875"),
            std::string::npos)
      << run.out;
  const Tensor latents = latents_of(out);
  const Tensor expected =
      SafetensorsFile::open(kFixtures + "/diffusion/wan22_two_experts/latents.safetensors").load("two_experts_unipc.latents");
  const int64_t count = latents.numel();
  ASSERT_EQ(count * 2, expected.numel());
  EXPECT_LE(rel_l2(latents.data_as<float>(), expected.data_as<float>() + count, count), 1e-5);  // after step 2
}

// Dynamic top-k attention keeping a quarter of the 2 x 2 blocks of the tiny latent (2 x 2 x 2
// patches) changes the output: a sparse config given to one expert only moves the result away from
// the dense one and from the other expert's.
TEST(GenerateTwoExpertsCli, TinyA14bRunsEachExpertWithItsOwnSparseConfigAndCache) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("tiny_a14b_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const TesselRun init = run_tessel_binary("init-model --preset tiny-a14b --out '" + dir.string() + "'", dir.string() + ".log");
  ASSERT_EQ(init.status, 0) << init.out;
  ASSERT_TRUE(fs::is_directory(dir / "transformer_2"));
  const std::string common = "--model '" + dir.string() + "' --prompt 'a cat' --size 32x32 --frames 5 --steps 4 --threads 1";
  const std::string sparse = R"('{"pattern": {"type": "dynamic_topk"}, "selection": {"topk_ratio": 0.25}, "geometry": {"block_q": 2, "block_kv": 2}}')";
  const std::string dense = R"('{"backend": "none"}')";
  const auto run_to = [&](const std::string& name, const std::string& flags) {
    const fs::path out = dir / (name + ".safetensors");
    const TesselRun run = generate(common + " " + flags + " --out '" + out.string() + "'");
    EXPECT_EQ(run.status, 0) << flags << "\n" << run.out;
    return run.status == 0 ? latents_of(out) : Tensor{};
  };
  const Tensor all_dense = run_to("dense", "");
  const Tensor low_sparse = run_to("low_sparse", "--sparse-attn-config-2 " + sparse);
  const Tensor high_sparse = run_to("high_sparse", "--sparse-attn-config " + sparse + " --sparse-attn-config-2 " + dense);
  const Tensor both_sparse = run_to("both_sparse", "--sparse-attn-config " + sparse);
  ASSERT_FALSE(::testing::Test::HasFailure());
  EXPECT_FALSE(same_bits(low_sparse, all_dense));
  EXPECT_FALSE(same_bits(high_sparse, all_dense));
  EXPECT_FALSE(same_bits(low_sparse, high_sparse));
  EXPECT_FALSE(same_bits(both_sparse, low_sparse));
  EXPECT_FALSE(same_bits(both_sparse, high_sparse));
  // The second expert's config is JSON over the first's: an empty object keeps it.
  EXPECT_TRUE(same_bits(run_to("both_again", "--sparse-attn-config " + sparse + " --sparse-attn-config-2 '{}'"), both_sparse));

  // One cache per expert; a threshold of 0 changes nothing.
  const TesselRun cached = generate(common + " --cache teacache --teacache-thresh 0 --out '" + (dir / "cached.safetensors").string() + "'");
  ASSERT_EQ(cached.status, 0) << cached.out;
  EXPECT_NE(cached.out.find("teacache (transformer): blocks skipped in 0 of 2 steps"), std::string::npos) << cached.out;
  EXPECT_NE(cached.out.find("teacache (transformer_2): blocks skipped in 0 of 2 steps"), std::string::npos) << cached.out;
  EXPECT_TRUE(same_bits(latents_of(dir / "cached.safetensors"), all_dense));

  const TesselRun bad_json = generate(common + " --sparse-attn-config-2 '{\"bogus\": 1}' --out '" + (dir / "x.safetensors").string() + "'");
  EXPECT_NE(bad_json.status, 0);
  EXPECT_NE(bad_json.out.find("--sparse-attn-config-2"), std::string::npos) << bad_json.out;
}

TEST(GenerateTwoExpertsCli, Fp8FilesOfInitModelReplaceBothExpertsWeights) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("tiny_a14b_fp8_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const TesselRun refused = run_tessel_binary("init-model --preset tiny --out '" + dir.string() + "' --fp8-format comfyui", dir.string() + ".log");
  EXPECT_NE(refused.status, 0);
  EXPECT_NE(refused.out.find("--fp8-format: expected given with --weights fp8"), std::string::npos) << refused.out;
  const TesselRun init = run_tessel_binary("init-model --preset tiny-a14b --out '" + dir.string() + "' --weights fp8 --fp8-format lightx2v",
                                           dir.string() + ".log");
  ASSERT_EQ(init.status, 0) << init.out;
  const fs::path file = dir / "transformer_fp8_lightx2v.safetensors", file_2 = dir / "transformer_2_fp8_lightx2v.safetensors";
  ASSERT_TRUE(fs::is_regular_file(file) && fs::is_regular_file(file_2)) << init.out;
  const std::string common = "--model '" + dir.string() + "' --prompt 'a cat' --size 32x32 --frames 5 --steps 2 --threads 1";
  const auto run_to = [&](const std::string& name, const std::string& flags) {
    const fs::path out = dir / (name + ".safetensors");
    const TesselRun run = generate(common + " " + flags + " --out '" + out.string() + "'");
    EXPECT_EQ(run.status, 0) << flags << "\n" << run.out;
    return run.status == 0 ? latents_of(out) : Tensor{};
  };
  const Tensor plain = run_to("plain", "");
  const Tensor fp8 = run_to("fp8", "--transformer-file '" + file.string() + "' --transformer-2-file '" + file_2.string() + "'");
  ASSERT_FALSE(::testing::Test::HasFailure());
  const double error = rel_l2(fp8.data_as<float>(), plain.data_as<float>(), plain.numel());
  EXPECT_GT(error, 0.0);  // the FP8 weights were read
  EXPECT_LT(error, 0.1);  // and are the model's, quantised
  // The file of the other expert is a model of the same config: it loads, with other weights.
  EXPECT_FALSE(same_bits(run_to("swapped", "--transformer-file '" + file_2.string() + "'"), plain));
}

TEST(GenerateTwoExpertsCli, BadLayoutsAndSecondExpertFlagsAreErrors) {
  const std::string common = " --embeddings '" + kPipelineFixture + "' --size 48x80 --frames 9 --out '" +
                             (fs::path(::testing::TempDir()) / "x.safetensors").string() + "'";
  const auto model = [](const fs::path& dir) { return "--model '" + dir.string() + "'"; };
  const fs::path one_expert = make_model_dir("wan21_model_flags");
  const std::pair<std::string, std::string> cases[] = {
      {model(make_two_expert_dir("wan22_no_ratio", R"("transformer_2": ["diffusers", "WanTransformer3DModel"])")),
       "transformer_2 without boundary_ratio"},
      {model(make_model_dir("wan22_no_expert", "WanPipeline", R"("transformer_2": [null, null], "boundary_ratio": 0.875)")),
       "boundary_ratio without transformer_2"},
      {model(make_two_expert_dir("wan22_bad_ratio", R"("transformer_2": ["diffusers", "WanTransformer3DModel"], "boundary_ratio": 1.5)")),
       "boundary_ratio"},
      {model(make_model_dir("wan22_ti2v", "WanPipeline", R"("transformer_2": null, "expand_timesteps": "yes")")), "expand_timesteps"},
      {model(one_expert) + " --guidance-2 3", "--guidance-2"},
      {model(one_expert) + " --sparse-attn-config-2 '{}'", "--sparse-attn-config-2"},
      {model(one_expert) + " --transformer-2-file '" + kPipelineFixture + "'", "--transformer-2-file"},
  };
  for (const auto& [args, fragment] : cases) {
    const TesselRun run = generate(args + common);
    EXPECT_NE(run.status, 0) << args;
    EXPECT_NE(run.out.find(fragment), std::string::npos) << args << "\n" << run.out;
  }
  const fs::path missing = make_two_expert_dir("wan22_missing");
  fs::remove(missing / "transformer_2");
  const TesselRun run = generate(model(missing) + common);
  EXPECT_NE(run.status, 0);
  EXPECT_NE(run.out.find("transformer_2/"), std::string::npos) << run.out;
}

}  // namespace
}  // namespace tessel
