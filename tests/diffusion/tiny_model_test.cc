// The tiny random model directory: every component loads through the same code as a real model,
// the same seed writes byte-identical files, and a prompt goes through tokenizer and text encoder;
// the two-expert layout adds a second transformer of other weights and the boundary; the
// image-to-video presets open as WanImageToVideoPipeline directories with their CLIP, and the big
// presets have the parameter counts of diffusers' and transformers' models.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tessel/core/error.h"
#include "tessel/diffusion/clip_image_processor.h"
#include "tessel/diffusion/clip_vision_encoder.h"
#include "tessel/diffusion/scheduler.h"
#include "tessel/diffusion/tiny_model.h"
#include "tessel/diffusion/wan_text_encoder.h"
#include "tessel/diffusion/wan_vae.h"
#include "tessel/diffusion/wan_generator.h"
#include "tessel/diffusion/wan_pipeline.h"
#include "tessel/dit/wan_model.h"
#include "tessel/dit/wan_weights.h"

namespace tessel {
namespace {

namespace fs = std::filesystem;

fs::path temp_dir(const std::string& name) {
  const fs::path dir = fs::path(::testing::TempDir()) / (name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  return dir;
}

std::string read_bytes(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

int64_t parameters(const std::vector<WeightSpec>& specs) {
  int64_t total = 0;
  for (const WeightSpec& spec : specs) total += shape_numel(spec.shape);
  return total;
}

const char* const kFiles[] = {"model_index.json",
                              "scheduler/scheduler_config.json",
                              "transformer/config.json",
                              "transformer/diffusion_pytorch_model.safetensors",
                              "text_encoder/config.json",
                              "text_encoder/model.safetensors",
                              "tokenizer/spiece.model",
                              "tokenizer/tokenizer_config.json",
                              "tokenizer/special_tokens_map.json",
                              "vae/config.json",
                              "vae/diffusion_pytorch_model.safetensors"};

TEST(TinyWanModel, LoadsThroughTheModelLoaders) {
  const fs::path dir = temp_dir("tiny_wan_loads");
  write_tiny_wan_model(dir.string(), 3);
  for (const char* file : kFiles) EXPECT_TRUE(fs::is_regular_file(dir / file)) << file;
  const WanTransformer transformer = WanTransformer::load((dir / "transformer").string());
  EXPECT_EQ(transformer.config().num_layers, tiny_wan_transformer_config().num_layers);
  const SchedulerConfig scheduler = load_scheduler_config((dir / "scheduler").string());
  EXPECT_EQ(scheduler.kind, SchedulerKind::unipc);

  const WanTextEncoder encoder = WanTextEncoder::load(dir.string());
  EXPECT_EQ(encoder.encoder().config().d_model, transformer.config().text_dim);
  EXPECT_EQ(encoder.tokenizer().vocab_size(), encoder.encoder().config().vocab_size);
  const Tensor embeddings = encoder.encode(ExecContext{}, {"a cat walks in the neon city", ""}, 16);
  ASSERT_EQ(embeddings.shape(), (Shape{2, 16, transformer.config().text_dim}));
  const float* e = embeddings.data_as<float>();
  const int64_t width = embeddings.size(2);
  // Row 1 is the empty prompt: its EOS is encoded, every later position is zero.
  double eos_norm = 0.0, padding_norm = 0.0;
  for (int64_t i = 0; i < width; ++i) eos_norm += std::abs(e[16 * width + i]);
  for (int64_t i = width; i < 16 * width; ++i) padding_norm += std::abs(e[16 * width + i]);
  EXPECT_GT(eos_norm, 0.0);
  EXPECT_EQ(padding_norm, 0.0);
  for (int64_t i = 0; i < embeddings.numel(); ++i) ASSERT_TRUE(std::isfinite(e[i])) << i;

  // The VAE decodes the transformer's latents: 2 latent frames of 4 x 6 to 5 frames of 32 x 48.
  const WanVae vae = WanVae::load((dir / "vae").string());
  EXPECT_EQ(vae.config().z_dim, transformer.config().out_channels);
  const Tensor video = vae.decode(ExecContext{}, Tensor::zeros({1, vae.config().z_dim, 2, 4, 6}, DType::kF32));
  ASSERT_EQ(video.shape(), (Shape{1, 3, 5, 32, 48}));
  for (int64_t i = 0; i < video.numel(); ++i) ASSERT_TRUE(std::abs(video.data_as<float>()[i]) <= 1.0f) << i;
}

TEST(TinyWanModel, TheSameSeedWritesTheSameBytes) {
  const fs::path a = temp_dir("tiny_wan_a"), b = temp_dir("tiny_wan_b"), c = temp_dir("tiny_wan_c");
  write_tiny_wan_model(a.string(), 7);
  write_tiny_wan_model(b.string(), 7);
  write_tiny_wan_model(c.string(), 8);
  for (const char* file : kFiles) EXPECT_EQ(read_bytes(a / file), read_bytes(b / file)) << file;
  EXPECT_NE(read_bytes(a / "transformer/diffusion_pytorch_model.safetensors"),
            read_bytes(c / "transformer/diffusion_pytorch_model.safetensors"));

  // The image-to-video layout's extra files too.
  const fs::path i2v_a = temp_dir("tiny_i2v_a"), i2v_b = temp_dir("tiny_i2v_b"), i2v_c = temp_dir("tiny_i2v_c");
  write_random_wan_model(i2v_a.string(), "tiny-flf2v", 7);
  write_random_wan_model(i2v_b.string(), "tiny-flf2v", 7);
  write_random_wan_model(i2v_c.string(), "tiny-flf2v", 8);
  std::vector<std::string> files(std::begin(kFiles), std::end(kFiles));
  files.insert(files.end(), {"image_encoder/config.json", "image_encoder/model.safetensors",
                             "image_processor/preprocessor_config.json"});
  for (const std::string& file : files) EXPECT_EQ(read_bytes(i2v_a / file), read_bytes(i2v_b / file)) << file;
  EXPECT_NE(read_bytes(i2v_a / "image_encoder/model.safetensors"), read_bytes(i2v_c / "image_encoder/model.safetensors"));
}

TEST(TinyWanModel, TheTwoExpertLayoutAddsASecondTransformer) {
  const fs::path one = temp_dir("tiny_wan_one"), two = temp_dir("tiny_wan_two");
  write_tiny_wan_model(one.string(), 5);
  write_tiny_wan_model(two.string(), 5, TinyWanLayout::kTwoExperts);
  EXPECT_FALSE(fs::exists(one / "transformer_2"));
  const WanTransformer expert_2 = WanTransformer::load((two / "transformer_2").string());
  EXPECT_EQ(expert_2.config().num_layers, tiny_wan_transformer_config().num_layers);
  EXPECT_EQ(read_bytes(two / "transformer/diffusion_pytorch_model.safetensors"),
            read_bytes(one / "transformer/diffusion_pytorch_model.safetensors"));
  EXPECT_NE(read_bytes(two / "transformer_2/diffusion_pytorch_model.safetensors"),
            read_bytes(two / "transformer/diffusion_pytorch_model.safetensors"));
  const std::string index = read_bytes(two / "model_index.json");
  EXPECT_NE(index.find("\"boundary_ratio\": 0.875"), std::string::npos) << index;
  EXPECT_EQ(read_bytes(one / "model_index.json").find("boundary_ratio"), std::string::npos);
}

// Wan 2.2 TI2V-5B's layout: expand_timesteps, flow shift 5, a residual patched VAE of 48 latent
// channels that fits the 48-channel transformer (WanPipeline accepts the pair).
TEST(TinyWanModel, TheTi2vLayoutHasTheResidualVaeAndPerTokenTimesteps) {
  const fs::path dir = temp_dir("tiny_wan_ti2v");
  write_random_wan_model(dir.string(), "tiny-ti2v", 5);
  const std::string index = read_bytes(dir / "model_index.json");
  EXPECT_NE(index.find("\"expand_timesteps\": true"), std::string::npos) << index;
  EXPECT_DOUBLE_EQ(load_scheduler_config((dir / "scheduler").string()).shift, 5.0);
  const WanTransformer transformer = WanTransformer::load((dir / "transformer").string());
  EXPECT_EQ(transformer.config().in_channels, 48);
  const WanVae vae = WanVae::load((dir / "vae").string());
  EXPECT_TRUE(vae.config().is_residual);
  EXPECT_EQ(vae.config().spatial_compression(), 16);
  EXPECT_EQ(vae.config().latents_std, wan22_vae_config().latents_std);
  auto scheduler = make_scheduler(SchedulerConfig{});
  EXPECT_NO_THROW(WanPipeline(transformer, *scheduler, &vae));
}

// The wan-ti2v-5b preset's sizes, checked without writing its 24 GB: the parameter counts of
// diffusers' WanTransformer3DModel and AutoencoderKLWan at Wan2.2-TI2V-5B-Diffusers' configs.
TEST(TinyWanModel, TheTi2v5bConfigsHaveDiffusersParameterCounts) {
  EXPECT_EQ(parameters(wan_weight_specs(wan_ti2v_5b_transformer_config())), 4999787712);
  EXPECT_EQ(parameters(wan_vae_weight_specs(wan22_vae_config())), 704688668);
  EXPECT_EQ(wan_ti2v_5b_transformer_config().inner_dim(), 3072);
}

// tiny-i2v and tiny-flf2v: Wan 2.1 I2V's layout (36 input channels, the image branch fed by the
// tiny CLIP, whose image_processor crops to its image size; FLF2V's position table of 2 x 5 CLIP
// tokens); tiny-i2v-a14b: Wan 2.2 I2V-A14B's (two experts, boundary 0.9, flow shift 5, no CLIP).
TEST(TinyWanModel, TheImageToVideoPresetsOpenAsImageToVideoModels) {
  const ClipVisionConfig clip = tiny_clip_vision_config();
  for (const char* preset : {"tiny-i2v", "tiny-flf2v"}) {
    const fs::path dir = temp_dir(std::string("tiny_wan_") + preset);
    write_random_wan_model(dir.string(), preset, 5);
    const WanModelDir model = WanModelDir::open(dir.string());
    EXPECT_EQ(model.task, WanTask::kImageToVideo) << preset;
    EXPECT_FALSE(model.two_experts) << preset;
    EXPECT_TRUE(model.has_image_encoder && model.has_vae && model.has_text_encoder) << preset;
    EXPECT_EQ(model.transformer.in_channels, 36) << preset;
    EXPECT_EQ(model.transformer.image_dim, clip.hidden_size) << preset;
    EXPECT_EQ(model.transformer.added_kv_proj_dim, model.transformer.inner_dim()) << preset;
    EXPECT_EQ(model.transformer.pos_embed_seq_len, std::string(preset) == "tiny-flf2v" ? 2 * clip.tokens() : 0) << preset;
    EXPECT_DOUBLE_EQ(model.scheduler.shift, 3.0) << preset;
    EXPECT_NO_THROW(WanTransformer::load(model.component("transformer"))) << preset;
    const ClipVisionEncoder encoder = ClipVisionEncoder::load(model.component("image_encoder"));
    EXPECT_EQ(encoder.config().hidden_size, clip.hidden_size);
    EXPECT_EQ(encoder.config().image_size, clip.image_size);
    EXPECT_EQ(encoder.config().hidden_act, ClipActivation::gelu);
    const ClipImageProcessing processing =
        parse_clip_image_processing(read_bytes(dir / "image_processor/preprocessor_config.json"));
    EXPECT_EQ(processing.shortest_edge, clip.image_size);
    EXPECT_EQ(processing.crop_height, clip.image_size);
    EXPECT_EQ(processing.crop_width, clip.image_size);
    const std::string index = read_bytes(dir / "model_index.json");
    EXPECT_NE(index.find("\"CLIPImageProcessor\""), std::string::npos) << index;
    EXPECT_NE(index.find("\"CLIPVisionModel\""), std::string::npos) << index;
  }
  const fs::path dir = temp_dir("tiny_wan_i2v_a14b");
  write_random_wan_model(dir.string(), "tiny-i2v-a14b", 5);
  const WanModelDir model = WanModelDir::open(dir.string());
  EXPECT_EQ(model.task, WanTask::kImageToVideo);
  EXPECT_TRUE(model.two_experts);
  EXPECT_DOUBLE_EQ(model.boundary_ratio, 0.9);
  EXPECT_DOUBLE_EQ(model.scheduler.shift, 5.0);
  EXPECT_FALSE(model.has_image_encoder);
  EXPECT_FALSE(model.transformer.has_image_branch());
  ASSERT_TRUE(model.transformer_2.has_value());
  EXPECT_EQ(model.transformer_2->in_channels, 36);
  EXPECT_NE(read_bytes(dir / "transformer_2/diffusion_pytorch_model.safetensors"),
            read_bytes(dir / "transformer/diffusion_pytorch_model.safetensors"));
  EXPECT_FALSE(fs::exists(dir / "image_processor"));
  EXPECT_NE(read_bytes(dir / "model_index.json").find("\"image_encoder\": [\n    null,\n    null\n  ]"), std::string::npos);

  // An image branch needs the kI2v layout (its CLIP), and kI2v needs one.
  EXPECT_THROW(write_tiny_wan_model(temp_dir("tiny_wan_bad_a").string(), 0, TinyWanLayout::kOneExpert,
                                    tiny_i2v_wan_transformer_config()),
               Error);
  EXPECT_THROW(write_tiny_wan_model(temp_dir("tiny_wan_bad_b").string(), 0, TinyWanLayout::kI2v,
                                    tiny_i2v_a14b_wan_transformer_config()),
               Error);
}

// Parameter counts of diffusers 0.42.1's WanTransformer3DModel and transformers 5.24.0's
// CLIPVisionModel at the presets' configs, computed with torch 2.15 on the meta device:
//   with torch.device("meta"): sum(p.numel() for p in WanTransformer3DModel(
//       num_attention_heads=40, attention_head_dim=128, in_channels=36, out_channels=16, text_dim=4096,
//       freq_dim=256, ffn_dim=13824, num_layers=40, image_dim=1280, added_kv_proj_dim=5120).parameters())
//   and CLIPVisionModel(CLIPVisionConfig(hidden_size=1280, intermediate_size=5120, num_hidden_layers=32,
//       num_attention_heads=16, image_size=224, patch_size=14, hidden_act="gelu")) (its
//   embeddings.position_ids is a buffer, no parameter); the tiny ones at the tiny configs
//   (pos_embed_seq_len=10 for FLF2V).
TEST(TinyWanModel, TheImageToVideoConfigsHaveDiffusersParameterCounts) {
  EXPECT_EQ(parameters(wan_weight_specs(wan_i2v_14b_transformer_config())), 16394878784);
  EXPECT_EQ(parameters(clip_vision_weight_specs(wan_clip_vision_config())), 630766080);
  EXPECT_EQ(wan_clip_vision_config().tokens(), 257);
  EXPECT_EQ(parameters(wan_weight_specs(tiny_i2v_wan_transformer_config())), 49440);
  EXPECT_EQ(parameters(wan_weight_specs(tiny_i2v_wan_transformer_config(true))), 49760);
  EXPECT_EQ(parameters(clip_vision_weight_specs(tiny_clip_vision_config())), 34144);
}

TEST(TinyWanModel, AnUnwritableDirectoryIsAnError) {
  const fs::path file = temp_dir("tiny_wan_file");
  std::ofstream(file) << "not a directory";
  try {
    write_tiny_wan_model((file / "model").string());
    FAIL() << "wrote under a regular file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("directory"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessel
