#include "tessel/diffusion/tiny_model.h"

#include <sentencepiece_trainer.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <vector>

#include "tessel/core/error.h"
#include "tessel/core/io/safetensors.h"
#include "tessel/core/random.h"
#include "tessel/diffusion/clip_image_processor.h"
#include "tessel/diffusion/umt5_tokenizer.h"
#include "tessel/dit/wan_weights.h"
#include "random_checkpoint.h"

namespace tessel {
namespace {

namespace fs = std::filesystem;

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file << text;
  file.close();
  if (!file) fail_argument("directory", "a writable directory", detail::concat("an error writing ", path.string()));
}

void write_json(const fs::path& path, const nlohmann::json& json) { write_text(path, json.dump(2) + "\n"); }

// Deterministic prompt-like sentences for training the tokenizer.
class SyntheticCorpus : public sentencepiece::SentenceIterator {
 public:
  explicit SyntheticCorpus(uint64_t seed) : rng_{seed} { advance(); }
  bool done() const override { return produced_ > kSentences; }
  void Next() override { advance(); }
  const std::string& value() const override { return sentence_; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  static constexpr int kSentences = 400;
  static constexpr std::array<const char*, 48> kWords = {
      "a",      "the",   "cat",       "dog",    "walks",  "runs",   "on",      "in",     "grass",     "street",
      "city",   "night", "neon",      "lights", "rain",   "camera", "slowly",  "pans",   "close",     "up",
      "of",     "woman", "man",       "river",  "ocean",  "waves",  "sunset",  "golden", "hour",      "forest",
      "snow",   "mountain", "realistic", "style", "cinematic", "shot", "bright", "dark", "colors", "moving",
      "Café",   "naïve", "東京",      "夜",     "猫",     "4k",     "detailed", "video"};
  void advance() {
    sentence_.clear();
    const uint64_t words = 3 + rng_.below(10);
    for (uint64_t i = 0; i < words; ++i) {
      if (i > 0) sentence_ += ' ';
      sentence_ += kWords[rng_.below(kWords.size())];
    }
    ++produced_;
  }
  SplitMix64 rng_;
  std::string sentence_;
  int produced_ = 0;
};

std::string train_tokenizer(uint64_t seed) {
  const std::unordered_map<std::string, std::string> options = {
      {"model_type", "unigram"}, {"vocab_size", "160"}, {"hard_vocab_limit", "false"},
      {"character_coverage", "1.0"}, {"pad_id", "0"}, {"eos_id", "1"}, {"unk_id", "2"}, {"bos_id", "-1"},
      {"num_threads", "1"}, {"minloglevel", "2"}};
  SyntheticCorpus corpus(seed);
  std::string model;
  const sentencepiece::util::Status status = sentencepiece::SentencePieceTrainer::Train(options, &corpus, &model);
  if (!status.ok()) throw Error("tiny model tokenizer: sentencepiece training failed: " + status.ToString());
  return model;
}

// Random weights at sensible scales: norm weights near 1, matrices with unit-variance rows over
// their fan-in, biases and the rest small (random_model_weights, and the text encoder and the VAE
// of the big presets; their transformers have wan_random_init).
RandomTensorInit heuristic_init(const WeightSpec& spec) {
  const bool is_norm = spec.name.find("norm") != std::string::npos;
  if (spec.shape.size() == 1) return {true, is_norm ? 1.0 : 0.0, is_norm ? 0.1 : 0.02};
  int64_t fan_in = 1;
  for (size_t d = 1; d < spec.shape.size(); ++d) fan_in *= spec.shape[d];
  return {true, 0.0, 1.0 / std::sqrt(static_cast<double>(fan_in))};
}

// The tiny model's weights, in memory, fp32.
void write_random_weights(const fs::path& path, const std::vector<WeightSpec>& specs, uint64_t seed) {
  const std::map<std::string, Tensor> tensors = random_model_weights(specs, seed);
  std::vector<std::pair<std::string, TensorView>> named;
  for (const WeightSpec& spec : specs) named.emplace_back(spec.name, tensors.at(spec.name).view());
  write_safetensors(path.string(), named, {{"format", "pt"}});
}

std::vector<RandomTensorSpec> heuristic_specs(const std::vector<WeightSpec>& specs) {
  std::vector<RandomTensorSpec> out;
  for (const WeightSpec& spec : specs) out.push_back({spec, heuristic_init(spec)});
  return out;
}

// diffusers writes an absent optional size as null.
nlohmann::json nullable(int64_t size) { return size > 0 ? nlohmann::json(size) : nlohmann::json(nullptr); }

nlohmann::json transformer_config_json(const WanConfig& c) {
  return {{"_class_name", "WanTransformer3DModel"}, {"_diffusers_version", "0.42.1"},
          {"patch_size", c.patch_size}, {"num_attention_heads", c.num_attention_heads},
          {"attention_head_dim", c.attention_head_dim}, {"in_channels", c.in_channels},
          {"out_channels", c.out_channels}, {"text_dim", c.text_dim}, {"freq_dim", c.freq_dim},
          {"ffn_dim", c.ffn_dim}, {"num_layers", c.num_layers}, {"cross_attn_norm", c.cross_attn_norm},
          {"qk_norm", "rms_norm_across_heads"}, {"eps", c.eps}, {"rope_max_seq_len", c.rope_max_seq_len},
          {"image_dim", nullable(c.image_dim)}, {"added_kv_proj_dim", nullable(c.added_kv_proj_dim)},
          {"pos_embed_seq_len", nullable(c.pos_embed_seq_len)}};
}

// config.json as transformers 5 writes it for a CLIPVisionModel. projection_dim is no part of the
// vision tower (CLIPModel's projection); Wan's checkpoint says 1024.
nlohmann::json clip_vision_config_json(const ClipVisionConfig& c, const char* dtype) {
  return {{"architectures", {"CLIPVisionModel"}}, {"attention_dropout", 0.0}, {"dtype", dtype},
          {"hidden_act", c.hidden_act == ClipActivation::gelu ? "gelu" : "quick_gelu"}, {"hidden_size", c.hidden_size},
          {"image_size", c.image_size}, {"initializer_factor", 1.0}, {"initializer_range", 0.02},
          {"intermediate_size", c.intermediate_size}, {"layer_norm_eps", c.layer_norm_eps},
          {"model_type", "clip_vision_model"}, {"num_attention_heads", c.num_attention_heads},
          {"num_channels", c.num_channels}, {"num_hidden_layers", c.num_hidden_layers}, {"patch_size", c.patch_size},
          {"projection_dim", 1024}, {"transformers_version", "5.24.0"}};
}

// CLIPImageProcessor's preprocessor_config.json for an encoder of `image_size`: the shortest edge
// resized (bicubic) and center-cropped to it, CLIP's mean and std.
nlohmann::json clip_image_processor_json(int64_t image_size) {
  const ClipImageProcessing p;
  return {{"crop_size", {{"height", image_size}, {"width", image_size}}}, {"do_center_crop", true}, {"do_convert_rgb", true},
          {"do_normalize", true}, {"do_rescale", true}, {"do_resize", true}, {"image_mean", p.image_mean},
          {"image_processor_type", "CLIPImageProcessor"}, {"image_std", p.image_std}, {"resample", 3},
          {"rescale_factor", p.rescale_factor}, {"size", {{"shortest_edge", image_size}}}};
}

nlohmann::json text_encoder_config_json(const UMT5Config& c, const char* dtype) {
  return {{"architectures", {"UMT5EncoderModel"}}, {"model_type", "umt5"}, {"vocab_size", c.vocab_size},
          {"d_model", c.d_model}, {"d_kv", c.d_kv}, {"d_ff", c.d_ff}, {"num_layers", c.num_layers},
          {"num_decoder_layers", c.num_layers}, {"num_heads", c.num_heads},
          {"relative_attention_num_buckets", c.relative_attention_num_buckets},
          {"relative_attention_max_distance", c.relative_attention_max_distance},
          {"layer_norm_epsilon", c.layer_norm_epsilon}, {"feed_forward_proj", "gated-gelu"},
          {"dense_act_fn", "gelu_new"}, {"is_gated_act", true}, {"dropout_rate", 0.0}, {"pad_token_id", 0},
          {"eos_token_id", 1}, {"decoder_start_token_id", 0}, {"tie_word_embeddings", false},
          {"is_encoder_decoder", true}, {"dtype", dtype}};
}

}  // namespace

WanConfig tiny_wan_transformer_config() {
  WanConfig c;
  c.num_attention_heads = 2;
  c.attention_head_dim = 16;
  c.text_dim = 32;
  c.freq_dim = 16;
  c.ffn_dim = 64;
  c.num_layers = 2;
  return c;
}

UMT5Config tiny_umt5_config(int64_t vocab_size) {
  UMT5Config c;
  c.vocab_size = vocab_size;
  c.d_model = tiny_wan_transformer_config().text_dim;
  c.d_kv = 8;
  c.d_ff = 48;
  c.num_layers = 2;
  c.num_heads = 4;
  return c;
}

WanConfig tiny_cuda_wan_transformer_config() {
  WanConfig c = tiny_wan_transformer_config();
  c.attention_head_dim = 64;
  return c;
}

std::map<std::string, Tensor> random_model_weights(const std::vector<WeightSpec>& specs, uint64_t seed) {
  std::map<std::string, Tensor> tensors;
  for (size_t i = 0; i < specs.size(); ++i) {
    const WeightSpec& spec = specs[i];
    Tensor t = Tensor::empty(spec.shape, DType::kF32);
    const RandomTensorInit init = heuristic_init(spec);
    fill_normal(t.view(), seed * 0x100000001b3ull + i, init.first, init.second);
    tensors[spec.name] = std::move(t);
  }
  return tensors;
}

WanVaeConfig tiny_wan_vae_config() {
  WanVaeConfig c;
  c.base_dim = 4;
  c.decoder_base_dim = 4;
  c.num_res_blocks = 1;
  c.z_dim = tiny_wan_transformer_config().out_channels;
  return c;
}

WanConfig tiny_ti2v_wan_transformer_config() {
  WanConfig c = tiny_wan_transformer_config();
  c.in_channels = c.out_channels = 48;
  return c;
}

WanVaeConfig tiny_ti2v_wan_vae_config() {
  WanVaeConfig c = wan22_vae_config();
  c.base_dim = 2;
  c.decoder_base_dim = 4;
  c.num_res_blocks = 1;
  return c;
}

WanConfig wan_ti2v_5b_transformer_config() {
  WanConfig c;
  c.num_attention_heads = 24;
  c.attention_head_dim = 128;
  c.in_channels = c.out_channels = 48;
  c.ffn_dim = 14336;
  c.num_layers = 30;
  return c;
}

ClipVisionConfig tiny_clip_vision_config() {
  ClipVisionConfig c = wan_clip_vision_config();  // its patch 14, gelu and eps
  c.hidden_size = tiny_wan_transformer_config().inner_dim();
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.image_size = 28;
  return c;
}

WanConfig tiny_i2v_wan_transformer_config(bool flf2v) {
  WanConfig c = tiny_i2v_a14b_wan_transformer_config();
  c.image_dim = tiny_clip_vision_config().hidden_size;
  c.added_kv_proj_dim = c.inner_dim();
  if (flf2v) c.pos_embed_seq_len = 2 * tiny_clip_vision_config().tokens();
  return c;
}

WanConfig tiny_i2v_a14b_wan_transformer_config() {
  WanConfig c = tiny_wan_transformer_config();
  c.in_channels = 2 * c.out_channels + 4;
  return c;
}

WanConfig wan_i2v_14b_transformer_config() {
  WanConfig c = wan_preset("wan-14b");
  c.in_channels = 2 * c.out_channels + 4;
  c.image_dim = wan_clip_vision_config().hidden_size;
  c.added_kv_proj_dim = c.inner_dim();
  return c;
}

ClipVisionConfig wan_clip_vision_config() {
  ClipVisionConfig c;
  c.hidden_size = 1280;
  c.intermediate_size = 5120;
  c.num_hidden_layers = 32;
  c.num_attention_heads = 16;
  c.image_size = 224;
  c.patch_size = 14;
  c.hidden_act = ClipActivation::gelu;
  c.layer_norm_eps = 1e-5;
  return c;
}

namespace {

// What model_index.json and the scheduler say beyond the components' configs.
struct SkeletonLayout {
  bool two_experts = false;  // transformer_2/ and boundary_ratio
  bool ti2v = false;         // expand_timesteps, flow shift 5
  bool i2v = false;          // WanImageToVideoPipeline
  const ClipVisionConfig* image_encoder = nullptr;  // image_encoder/ and image_processor/ (i2v with an image branch)
  const char* image_encoder_dtype = "float32";
};

// Everything but the weights: model_index.json (with Wan 2.2 A14B's transformer_2 and boundary
// ratio when two_experts, TI2V-5B's expand_timesteps and flow shift 5 when ti2v, the image
// components when i2v), the scheduler, the configs and the tokenizer (`spiece`, a serialized
// sentencepiece model; its ids may be a subset of the encoder's vocabulary).
void write_model_skeleton(const fs::path& root, const WanConfig& transformer, const UMT5Config& text_encoder, const WanVaeConfig& vae,
                          const char* text_encoder_dtype, const std::string& spiece, const SkeletonLayout& layout = {}) {
  const bool two_experts = layout.two_experts, ti2v = layout.ti2v;
  std::error_code error;
  std::vector<const char*> components = {"scheduler", "transformer", "text_encoder", "tokenizer", "vae"};
  if (two_experts) components.push_back("transformer_2");
  if (layout.image_encoder != nullptr) components.insert(components.end(), {"image_encoder", "image_processor"});
  for (const char* component : components) {
    fs::create_directories(root / component, error);
    if (error) fail_argument("directory", "a directory that can be created", quoted_excerpt(root.string()) + ": " + error.message());
  }
  nlohmann::json index = {{"_class_name", "WanPipeline"}, {"_diffusers_version", "0.42.1"},
                          {"scheduler", {"diffusers", "UniPCMultistepScheduler"}},
                          {"text_encoder", {"transformers", "UMT5EncoderModel"}},
                          {"tokenizer", {"transformers", "T5TokenizerFast"}},
                          {"transformer", {"diffusers", "WanTransformer3DModel"}}, {"transformer_2", {nullptr, nullptr}},
                          {"vae", {"diffusers", "AutoencoderKLWan"}}};
  if (two_experts) {
    index["transformer_2"] = {"diffusers", "WanTransformer3DModel"};
    index["boundary_ratio"] = layout.i2v ? 0.9 : 0.875;  // Wan 2.2 I2V-A14B's or T2V-A14B's
    index["expand_timesteps"] = false;
  }
  if (ti2v) {
    index["boundary_ratio"] = nullptr;
    index["expand_timesteps"] = true;  // Wan2.2-TI2V-5B-Diffusers' per-token timesteps
  }
  if (layout.i2v) {
    index["_class_name"] = "WanImageToVideoPipeline";
    if (!two_experts) index["boundary_ratio"] = nullptr;
    index["expand_timesteps"] = false;
    const bool clip = layout.image_encoder != nullptr;  // Wan 2.2 I2V-A14B has none
    index["image_encoder"] = clip ? nlohmann::json{"transformers", "CLIPVisionModel"} : nlohmann::json{nullptr, nullptr};
    index["image_processor"] = clip ? nlohmann::json{"transformers", "CLIPImageProcessor"} : nlohmann::json{nullptr, nullptr};
  }
  write_json(root / "model_index.json", index);
  // Wan 2.2 TI2V-5B's and I2V-A14B's sample_shift is 5, Wan 2.1's (480P) and T2V-A14B's diffusers config 3.
  const bool shift_5 = ti2v || (layout.i2v && two_experts);
  write_json(root / "scheduler" / "scheduler_config.json",
             {{"_class_name", "UniPCMultistepScheduler"}, {"_diffusers_version", "0.42.1"}, {"flow_shift", shift_5 ? 5.0 : 3.0},
              {"num_train_timesteps", 1000}, {"prediction_type", "flow_prediction"}, {"solver_order", 2},
              {"solver_type", "bh2"}, {"use_flow_sigmas", true}, {"predict_x0", true}, {"lower_order_final", true},
              {"final_sigmas_type", "zero"}, {"disable_corrector", nlohmann::json::array()}});
  write_json(root / "transformer" / "config.json", transformer_config_json(transformer));
  if (two_experts) write_json(root / "transformer_2" / "config.json", transformer_config_json(transformer));

  write_text(root / "tokenizer" / "spiece.model", spiece);
  const nlohmann::json special = {{"eos_token", "</s>"}, {"pad_token", "<pad>"}, {"unk_token", "<unk>"}};
  nlohmann::json tokenizer_config = special;
  tokenizer_config["tokenizer_class"] = "T5Tokenizer";
  tokenizer_config["extra_ids"] = 0;
  tokenizer_config["model_max_length"] = kWanMaxSequenceLength;
  write_json(root / "tokenizer" / "tokenizer_config.json", tokenizer_config);
  write_json(root / "tokenizer" / "special_tokens_map.json", special);
  write_json(root / "text_encoder" / "config.json", text_encoder_config_json(text_encoder, text_encoder_dtype));
  write_text(root / "vae" / "config.json", wan_vae_config_json(vae));
  if (layout.image_encoder != nullptr) {
    write_json(root / "image_encoder" / "config.json", clip_vision_config_json(*layout.image_encoder, layout.image_encoder_dtype));
    write_json(root / "image_processor" / "preprocessor_config.json", clip_image_processor_json(layout.image_encoder->image_size));
  }
}

}  // namespace

void write_tiny_wan_model(const std::string& directory, uint64_t seed, TinyWanLayout layout, const WanConfig& transformer) {
  const fs::path root(directory);
  SkeletonLayout skeleton;
  skeleton.two_experts = layout == TinyWanLayout::kTwoExperts || layout == TinyWanLayout::kI2vTwoExperts;
  skeleton.ti2v = layout == TinyWanLayout::kTi2v;
  skeleton.i2v = layout == TinyWanLayout::kI2v || layout == TinyWanLayout::kI2vTwoExperts;
  const ClipVisionConfig clip = tiny_clip_vision_config();
  if (transformer.has_image_branch() != (layout == TinyWanLayout::kI2v))
    fail_argument("transformer", "an image branch exactly in the kI2v layout (Wan 2.1 I2V's CLIP features)",
                  detail::concat("image_dim ", transformer.image_dim));
  if (layout == TinyWanLayout::kI2v) {
    if (transformer.image_dim != clip.hidden_size)
      fail_argument("transformer: image_dim", detail::concat("the tiny CLIP's hidden size ", clip.hidden_size), transformer.image_dim);
    skeleton.image_encoder = &clip;
  }
  const std::string spiece = train_tokenizer(seed);
  const UMT5Config text_encoder = tiny_umt5_config(UMT5Tokenizer::from_serialized_model(spiece, "tiny tokenizer").vocab_size());
  const WanVaeConfig vae = skeleton.ti2v ? tiny_ti2v_wan_vae_config() : tiny_wan_vae_config();
  write_model_skeleton(root, transformer, text_encoder, vae, "float32", spiece, skeleton);
  write_random_weights(root / "transformer" / kDiffusersWeightsFile, wan_weight_specs(transformer), seed);
  if (skeleton.two_experts) write_random_weights(root / "transformer_2" / kDiffusersWeightsFile, wan_weight_specs(transformer), seed + 3);
  write_random_weights(root / "text_encoder" / "model.safetensors", umt5_weight_specs(text_encoder), seed + 1);
  write_random_weights(root / "vae" / kDiffusersWeightsFile, wan_vae_weight_specs(vae), seed + 2);
  if (skeleton.image_encoder != nullptr)
    write_random_weights(root / "image_encoder" / "model.safetensors", clip_vision_weight_specs(clip), seed + 4);
}

namespace {

struct TinyPreset {
  const char* name;
  TinyWanLayout layout;
  WanConfig (*transformer)();
};

const TinyPreset kTinyPresets[] = {
    {"tiny", TinyWanLayout::kOneExpert, tiny_wan_transformer_config},
    {"tiny-a14b", TinyWanLayout::kTwoExperts, tiny_wan_transformer_config},
    {"tiny-cuda", TinyWanLayout::kOneExpert, tiny_cuda_wan_transformer_config},
    {"tiny-ti2v", TinyWanLayout::kTi2v, tiny_ti2v_wan_transformer_config},
    {"tiny-i2v", TinyWanLayout::kI2v, [] { return tiny_i2v_wan_transformer_config(); }},
    {"tiny-flf2v", TinyWanLayout::kI2v, [] { return tiny_i2v_wan_transformer_config(true); }},
    {"tiny-i2v-a14b", TinyWanLayout::kI2vTwoExperts, tiny_i2v_a14b_wan_transformer_config},
};

const char* const kBigPresets[] = {"wan-1.3b", "wan-14b", "wan-ti2v-5b", "wan-i2v-14b"};

}  // namespace

std::vector<std::string> random_wan_model_presets() {
  std::vector<std::string> names;
  for (const TinyPreset& preset : kTinyPresets) names.emplace_back(preset.name);
  names.insert(names.end(), std::begin(kBigPresets), std::end(kBigPresets));
  return names;
}

uint64_t write_random_wan_model(const std::string& directory, std::string_view preset, uint64_t seed, int threads) {
  for (const TinyPreset& tiny : kTinyPresets) {
    if (preset != tiny.name) continue;
    write_tiny_wan_model(directory, seed, tiny.layout, tiny.transformer());
    return 0;
  }
  if (std::find(std::begin(kBigPresets), std::end(kBigPresets), preset) == std::end(kBigPresets)) {
    std::string names;
    for (const std::string& name : random_wan_model_presets()) names += (names.empty() ? "" : ", ") + name;
    fail_argument("preset", "one of " + names, quoted_excerpt(std::string(preset)));
  }
  const fs::path root(directory);
  const bool ti2v = preset == "wan-ti2v-5b", i2v = preset == "wan-i2v-14b";
  const WanConfig transformer = ti2v ? wan_ti2v_5b_transformer_config() : i2v ? wan_i2v_14b_transformer_config() : wan_preset(preset);
  const UMT5Config text_encoder;  // UMT5-XXL, the encoder of every Wan 2.1 and 2.2 model
  const WanVaeConfig vae = ti2v ? wan22_vae_config() : WanVaeConfig{};  // Wan 2.2's or Wan 2.1's VAE
  const ClipVisionConfig clip = wan_clip_vision_config();
  SkeletonLayout layout;
  layout.ti2v = ti2v;
  layout.i2v = i2v;
  if (i2v) layout.image_encoder = &clip;
  layout.image_encoder_dtype = "bfloat16";
  // The tiny tokenizer: the real one cannot be downloaded here, and its ids fit UMT5-XXL's vocabulary.
  write_model_skeleton(root, transformer, text_encoder, vae, "bfloat16", train_tokenizer(seed), layout);

  std::vector<RandomTensorSpec> transformer_tensors;
  for (const WeightSpec& spec : wan_weight_specs(transformer)) {
    const WanRandomInit init = wan_random_init(transformer, spec);
    transformer_tensors.push_back({spec, {init.normal, init.first, init.second}});
  }
  uint64_t bytes = write_random_checkpoint({root / "transformer", kDiffusersWeightsFile, kDiffusersWeightsIndex}, transformer_tensors,
                                           DType::kBF16, seed, threads);
  bytes += write_random_checkpoint({root / "text_encoder", "model.safetensors", "model.safetensors.index.json"},
                                   heuristic_specs(umt5_weight_specs(text_encoder)), DType::kBF16, seed + 1, threads);
  bytes += write_random_checkpoint({root / "vae", kDiffusersWeightsFile, kDiffusersWeightsIndex},
                                   heuristic_specs(wan_vae_weight_specs(vae)), DType::kF32, seed + 2, threads);
  if (i2v)
    bytes += write_random_checkpoint({root / "image_encoder", "model.safetensors", "model.safetensors.index.json"},
                                     heuristic_specs(clip_vision_weight_specs(clip)), DType::kBF16, seed + 4, threads);
  return bytes;
}

}  // namespace tessel
