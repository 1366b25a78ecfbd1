// Single-file transformer checkpoints in the original Wan names, FP8 as ComfyUI and LightX2V publish
// them (tessel/dit/wan_transformer_file.h), on the CPU:
//  - write_wan_fp8_transformer_file names every tensor as the original Wan code does, quantises the
//    block linears (LightX2V: per output channel, the bytes of the row quantiser over the bf16
//    values, which WanWeightPrecision::kFp8 runs on the device; ComfyUI: one scale per tensor);
//  - dequantised values equal the bytes decoded times their scale, bit for bit, and sit within
//    e4m3's rounding of the bf16 values;
//  - the CPU model loaded from the file (dequantised) equals the model built from the dequantised
//    values bit for bit, with or without a "model.diffusion_model." prefix, and differs from the
//    unquantised model by FP8's error only;
//  - hostile files (22): every refusal names the file and the key.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "dit_test_util.h"
#include "tessel/core/error.h"
#include "tessel/core/exec_context.h"
#include "tessel/core/float8.h"
#include "tessel/core/io/safetensors.h"
#include "tessel/core/random.h"
#include "tessel/diffusion/tiny_model.h"
#include "tessel/dit/wan_model.h"
#include "tessel/dit/wan_transformer_file.h"
#include "tessel/dit/wan_weights.h"

namespace tessel {
namespace {

namespace fs = std::filesystem;

// A tiny model directory (its transformer) and FP8 files of it.
struct TinyFp8Model {
  fs::path transformer;
  WanConfig config;
  TinyFp8Model(const fs::path& root, uint64_t seed, TinyWanLayout layout = TinyWanLayout::kOneExpert,
               const WanConfig& transformer_config = tiny_wan_transformer_config())
      : transformer(root / "transformer"), config(transformer_config) {
    write_tiny_wan_model(root.string(), seed, layout, transformer_config);
  }
  std::string write(WanFp8FileFormat format, const std::string& name) const {
    const std::string path = (transformer.parent_path() / name).string();
    write_wan_fp8_transformer_file(Checkpoint::open(transformer.string()), config, path, format);
    return path;
  }
};

Tensor forward_cpu(const WanTransformer& model, uint64_t seed) {
  const WanConfig& c = model.config();
  Tensor latents = Tensor::empty({1, c.in_channels, 2, 4, 6}, DType::kF32), timestep = Tensor::empty({1}, DType::kF32);
  Tensor text = Tensor::empty({1, 5, c.text_dim}, DType::kF32), out = Tensor::zeros({1, c.out_channels, 2, 4, 6}, DType::kF32);
  fill_normal(latents.view(), seed);
  fill_normal(text.view(), seed + 1);
  timestep.data_as<float>()[0] = 700.0f;
  ExecContext ctx;
  if (c.has_image_branch()) {
    Tensor image = Tensor::empty({1, c.pos_embed_seq_len > 0 ? c.pos_embed_seq_len : 5, c.image_dim}, DType::kF32);
    fill_normal(image.view(), seed + 2);
    model.forward(ctx, {}, latents, timestep, text, image, out);
  } else {
    model.forward(ctx, {}, latents, timestep, text, out);
  }
  return out;
}

bool bit_equal(const Tensor& a, const Tensor& b) { return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0; }

TEST(WanTransformerFile, Fp8FilesUseTheOriginalWanNames) {
  ScratchDir scratch;
  const TinyFp8Model model(scratch.path() / "flf2v", 3, TinyWanLayout::kI2v, tiny_i2v_wan_transformer_config(true));
  const int64_t dim = model.config.inner_dim();
  int64_t fp8_count = 0;
  for (const WeightSpec& spec : wan_weight_specs(model.config)) fp8_count += wan_fp8_weight(spec.name);
  for (const WanFp8FileFormat format : {WanFp8FileFormat::kLightX2V, WanFp8FileFormat::kComfyUi}) {
    const bool comfy = format == WanFp8FileFormat::kComfyUi;
    const SafetensorsFile file = SafetensorsFile::open(model.write(format, comfy ? "comfy.safetensors" : "lightx2v.safetensors"));
    SCOPED_TRACE(file.path());
    EXPECT_EQ(static_cast<int64_t>(file.entries().size()),
              static_cast<int64_t>(wan_weight_specs(model.config).size()) + fp8_count + (comfy ? 1 : 0));
    for (const char* key : {"blocks.0.self_attn.q.weight", "blocks.1.cross_attn.o.weight", "blocks.0.ffn.0.weight", "blocks.1.ffn.2.weight"}) {
      ASSERT_NE(file.find(key), nullptr) << key;
      EXPECT_TRUE(file.find(key)->float8_e4m3) << key;
    }
    for (const char* key : {"blocks.0.self_attn.q.bias", "blocks.0.self_attn.norm_q.weight", "blocks.0.cross_attn.k_img.weight",
                            "blocks.0.cross_attn.norm_k_img.weight", "blocks.0.norm3.weight", "blocks.0.modulation", "head.modulation",
                            "head.head.weight", "patch_embedding.weight", "time_embedding.0.weight", "time_projection.1.weight",
                            "text_embedding.2.bias", "img_emb.proj.0.weight", "img_emb.proj.1.weight", "img_emb.proj.4.bias",
                            "img_emb.emb_pos"}) {
      ASSERT_NE(file.find(key), nullptr) << key;
      EXPECT_FALSE(file.find(key)->float8_e4m3) << key;
    }
    const SafetensorsEntry* scale = file.find(comfy ? "blocks.0.self_attn.q.scale_weight" : "blocks.0.self_attn.q.weight_scale");
    ASSERT_NE(scale, nullptr);
    EXPECT_EQ(scale->shape, comfy ? Shape{} : Shape({dim, 1}));
    EXPECT_EQ(file.find("scaled_fp8") != nullptr, comfy);
  }
}

// LightX2V's bytes are the row quantiser's over the bf16 values (what kFp8 quantises at load);
// dequantised values are the decoded bytes times their scale, within e4m3's rounding of them.
TEST(WanTransformerFile, DequantisedValuesAreTheDecodedBytesTimesTheirScales) {
  ScratchDir scratch;
  const TinyFp8Model model(scratch.path() / "tiny", 5);
  const Checkpoint source = Checkpoint::open(model.transformer.string());
  for (const WanFp8FileFormat format : {WanFp8FileFormat::kLightX2V, WanFp8FileFormat::kComfyUi}) {
    const bool comfy = format == WanFp8FileFormat::kComfyUi;
    const std::string path = model.write(format, comfy ? "comfy.safetensors" : "lightx2v.safetensors");
    const SafetensorsFile raw = SafetensorsFile::open(path);
    const WanTransformerFile file = WanTransformerFile::open(path, model.config);
    EXPECT_NE(file.describe().find(comfy ? "scale_weight" : "weight_scale"), std::string::npos) << file.describe();
    for (const char* tensor : {"blocks.0.attn1.to_q.weight", "blocks.1.ffn.net.2.weight"}) {
      SCOPED_TRACE(std::string(tensor) + (comfy ? " comfyui" : " lightx2v"));
      ASSERT_TRUE(file.float8(tensor));
      const std::string key = std::string(tensor) == "blocks.0.attn1.to_q.weight" ? "blocks.0.self_attn.q" : "blocks.1.ffn.2";
      const Tensor bytes = raw.load(key + ".weight"), scales = raw.load(key + (comfy ? ".scale_weight" : ".weight_scale"));
      const int64_t rows = bytes.size(0), cols = bytes.numel() / rows;
      // The bf16 values the file was quantised from.
      const TensorView stored = source.view(tensor);
      Tensor bf16 = Tensor::empty(stored.shape(), DType::kBF16), values = Tensor::empty(stored.shape(), DType::kF32);
      copy_convert(stored, bf16.view());
      copy_convert(bf16.view(), values.view());
      if (!comfy) {
        Tensor q = Tensor::empty(stored.shape(), DType::kU8), s = Tensor::empty({rows}, DType::kF32);
        quantize_rows_e4m3(values.data_as<float>(), rows, cols, q.data_as<uint8_t>(), s.data_as<float>());
        EXPECT_TRUE(bit_equal(q, bytes));
        EXPECT_EQ(std::memcmp(s.data(), scales.data(), s.nbytes()), 0);
      }
      const Tensor dequantised = file.dequantised(tensor);
      int64_t mismatches = 0, outside = 0;
      for (int64_t r = 0; r < rows; ++r) {
        const float scale = scales.data_as<float>()[comfy ? 0 : r];
        for (int64_t c = 0; c < cols; ++c) {
          const int64_t i = r * cols + c;
          const float expected = e4m3_to_float(bytes.data_as<uint8_t>()[i]) * scale;
          mismatches += std::memcmp(&expected, dequantised.data_as<float>() + i, sizeof(float)) != 0;
          // Half an e4m3 step: 2^-4 relative, or half the subnormal step 2^-9 (times the scale).
          const float x = values.data_as<float>()[i];
          // (plus a few fp32 roundings of the scaling: the 1.001).
          outside += std::fabs(dequantised.data_as<float>()[i] - x) > (std::ldexp(std::fabs(x), -4) + std::ldexp(scale, -10)) * 1.001f;
        }
      }
      EXPECT_EQ(mismatches, 0);
      EXPECT_EQ(outside, 0);
    }
    EXPECT_FALSE(file.float8("blocks.0.attn1.to_q.bias"));
  }
}

// The CPU model of the file (dequantised at load) is the model of the dequantised values, and an
// FP8 step away from the unquantised one.
TEST(WanTransformerFile, CpuModelOfTheFileIsTheModelOfItsDequantisedValues) {
  ScratchDir scratch;
  const TinyFp8Model model(scratch.path() / "tiny", 7);
  const WanTransformer original = WanTransformer::load(model.transformer.string());
  const Tensor reference = forward_cpu(original, 11);
  for (const WanFp8FileFormat format : {WanFp8FileFormat::kLightX2V, WanFp8FileFormat::kComfyUi}) {
    const bool comfy = format == WanFp8FileFormat::kComfyUi;
    SCOPED_TRACE(comfy ? "comfyui" : "lightx2v");
    const std::string path = model.write(format, comfy ? "comfy.safetensors" : "lightx2v.safetensors");
    const WanTransformerFile file = WanTransformerFile::open(path, model.config);
    std::map<std::string, Tensor> dequantised;
    for (const WeightSpec& spec : wan_weight_specs(model.config)) dequantised.emplace(spec.name, file.dequantised(spec.name));
    const Tensor direct = forward_cpu(WanTransformer(model.config, dequantised), 11);
    const Tensor loaded = forward_cpu(WanTransformer::load(model.transformer.string(), {}, Device::cpu(), nullptr,
                                                           WanWeightResidency::kDevice, WanWeightPrecision::kBf16, path),
                                      11);
    EXPECT_TRUE(bit_equal(loaded, direct));
    const double error = rel_l2(loaded, reference);
    std::printf("[%s] CPU forward of the FP8 file vs the unquantised model: rel-L2 %.3e\n", comfy ? "comfyui" : "lightx2v", error);
    EXPECT_GT(error, 1e-5);  // the weights really were quantised
    EXPECT_LT(error, 0.1);   // by e4m3's rounding only (docs/dit.md: ~0.04 per quantised GEMM)

    // The same file with ComfyUI's "model.diffusion_model." prefix on every key.
    const SafetensorsFile raw = SafetensorsFile::open(path);
    std::vector<Tensor> held;
    std::vector<std::pair<std::string, TensorView>> tensors;
    std::set<std::string> float8;
    for (const SafetensorsEntry& entry : raw.entries()) {
      held.push_back(raw.load(entry.name));
      tensors.emplace_back("model.diffusion_model." + entry.name, held.back().view());
      if (entry.float8_e4m3) float8.insert("model.diffusion_model." + entry.name);
    }
    const std::string prefixed = (scratch.path() / "prefixed.safetensors").string();
    write_safetensors(prefixed, tensors, {}, float8);
    EXPECT_TRUE(bit_equal(forward_cpu(WanTransformer::load(model.transformer.string(), {}, Device::cpu(), nullptr,
                                                           WanWeightResidency::kDevice, WanWeightPrecision::kBf16, prefixed),
                                      11),
                          direct));
  }
}

// The tensors of a file, to break one at a time.
struct FileTensors {
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::set<std::string> float8;
  explicit FileTensors(const std::string& path) {
    const SafetensorsFile file = SafetensorsFile::open(path);
    for (const SafetensorsEntry& entry : file.entries()) {
      tensors.emplace_back(entry.name, file.load(entry.name));
      if (entry.float8_e4m3) float8.insert(entry.name);
    }
  }
  Tensor& at(const std::string& key) {
    for (auto& [name, tensor] : tensors)
      if (name == key) return tensor;
    throw Error("test: no key " + key);
  }
  void erase(const std::string& key) {
    std::erase_if(tensors, [&](const auto& entry) { return entry.first == key; });
    float8.erase(key);
  }
  void put(const std::string& key, Tensor tensor, bool is_float8 = false) {
    erase(key);
    tensors.emplace_back(key, std::move(tensor));
    if (is_float8) float8.insert(key);
  }
  void write(const std::string& path) const {
    std::vector<std::pair<std::string, TensorView>> views;
    for (const auto& [name, tensor] : tensors) views.emplace_back(name, tensor.view());
    write_safetensors(path, views, {}, float8);
  }
};

Tensor filled(const Shape& shape, DType dtype, double value) {
  Tensor t = Tensor::empty(shape, dtype);
  fill(t.view(), value);
  return t;
}

TEST(WanTransformerFile, HostileFilesAreRefusedNamingTheFileAndTheKey) {
  ScratchDir scratch;
  const TinyFp8Model model(scratch.path() / "tiny", 9);
  const std::string lightx2v = model.write(WanFp8FileFormat::kLightX2V, "lightx2v.safetensors");
  const std::string comfy = model.write(WanFp8FileFormat::kComfyUi, "comfy.safetensors");
  const int64_t dim = model.config.inner_dim();
  const std::string q = "blocks.0.self_attn.q";
  struct Case {
    std::string name;
    const std::string* base;
    std::function<void(FileTensors&)> change;
    std::string key, fragment;  // the message names the key and says this
  };
  const std::vector<Case> cases = {
      {"unknown key", &lightx2v, [](FileTensors& f) { f.put("blocks.0.self_attn.qq.weight", filled({2}, DType::kF32, 1)); },
       "blocks.0.self_attn.qq.weight", "no tensor of this Wan transformer"},
      {"missing tensor", &lightx2v, [](FileTensors& f) { f.erase("blocks.1.ffn.0.bias"); }, "blocks.1.ffn.0.bias", "missing 1 tensor"},
      {"wrong shape", &lightx2v, [&](FileTensors& f) { f.put(q + ".bias", filled({dim + 1}, DType::kF32, 0)); }, q + ".bias",
       "the model's blocks.0.attn1.to_q.bias is (32)"},
      {"e4m3 norm weight", &lightx2v, [&](FileTensors& f) { f.put("blocks.0.self_attn.norm_q.weight", filled({dim}, DType::kU8, 0x38), true); },
       "blocks.0.self_attn.norm_q.weight", "e4m3 is read for the weight matrices of linear layers only"},
      {"e4m3 bias", &lightx2v, [&](FileTensors& f) { f.put(q + ".bias", filled({dim}, DType::kU8, 0x38), true); }, q + ".bias",
       "e4m3 is read for the weight matrices"},
      {"int32 bias", &lightx2v, [&](FileTensors& f) { f.put(q + ".bias", filled({dim}, DType::kI32, 0)); }, q + ".bias", "int32"},
      {"missing scale", &lightx2v, [&](FileTensors& f) { f.erase(q + ".weight_scale"); }, q + ".weight", "a scale beside the e4m3 weight"},
      {"two scales", &lightx2v, [&](FileTensors& f) { f.put(q + ".scale_weight", filled({}, DType::kF32, 0.01)); }, q + ".weight",
       "one scale"},
      {"per-channel scale of another width", &lightx2v, [&](FileTensors& f) { f.put(q + ".weight_scale", filled({dim, 2}, DType::kF32, 0.01)); },
       q + ".weight_scale", "(32, 1) or (32)"},
      {"per-channel scale of another length", &lightx2v, [&](FileTensors& f) { f.put(q + ".weight_scale", filled({dim + 1}, DType::kF32, 0.01)); },
       q + ".weight_scale", "one per output channel"},
      {"ComfyUI scale per channel", &comfy, [&](FileTensors& f) { f.put(q + ".scale_weight", filled({dim}, DType::kF32, 0.01)); },
       q + ".scale_weight", "one value (a per-tensor scale)"},
      {"NaN scale", &lightx2v, [&](FileTensors& f) { f.at(q + ".weight_scale").data_as<float>()[3] = NAN; }, q + ".weight_scale",
       "value 3: expected a finite scale > 0, got nan"},
      {"infinite scale", &comfy, [&](FileTensors& f) { f.at(q + ".scale_weight").data_as<float>()[0] = INFINITY; }, q + ".scale_weight",
       "a finite scale > 0, got inf"},
      {"zero scale", &lightx2v, [&](FileTensors& f) { f.at(q + ".weight_scale").data_as<float>()[0] = 0.0f; }, q + ".weight_scale",
       "a finite scale > 0, got 0"},
      {"negative scale", &comfy, [&](FileTensors& f) { f.at(q + ".scale_weight").data_as<float>()[0] = -0.5f; }, q + ".scale_weight",
       "a finite scale > 0, got -0.5"},
      {"integer scale", &lightx2v, [&](FileTensors& f) { f.put(q + ".weight_scale", filled({dim, 1}, DType::kI32, 1)); }, q + ".weight_scale",
       "fp32, fp16 or bf16 (a scale)"},
      {"scale of a bf16 weight", &lightx2v, [](FileTensors& f) { f.put("head.head.weight_scale", filled({1}, DType::kF32, 0.01)); },
       "head.head.weight_scale", "the scale of an e4m3 weight"},
      {"scale of no weight", &lightx2v, [](FileTensors& f) { f.put("blocks.0.self_attn.zz.weight_scale", filled({1}, DType::kF32, 0.01)); },
       "blocks.0.self_attn.zz.weight_scale", "the scale of a weight this model has"},
      {"bad input scale", &comfy, [&](FileTensors& f) { f.put(q + ".scale_input", filled({}, DType::kF32, -1)); }, q + ".scale_input",
       "a finite scale > 0"},
      {"input scale per channel", &comfy, [&](FileTensors& f) { f.put(q + ".scale_input", filled({dim}, DType::kF32, 0.02)); },
       q + ".scale_input", "shape: expected one value"},
      {"float32 marker", &comfy, [](FileTensors& f) { f.put("scaled_fp8", filled({0}, DType::kF32, 0)); }, "scaled_fp8", "marker"},
      {"the same tensor twice", &lightx2v,
       [&](FileTensors& f) { f.put("model.diffusion_model." + q + ".bias", filled({dim}, DType::kF32, 0)); },
       "model.diffusion_model." + q + ".bias", "one key per tensor"},
  };
  const std::string broken = (scratch.path() / "broken.safetensors").string();
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    FileTensors tensors(*c.base);
    c.change(tensors);
    tensors.write(broken);
    try {
      (void)WanTransformerFile::open(broken, model.config);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(broken), std::string::npos) << message;
      EXPECT_NE(message.find(c.key), std::string::npos) << message;
      EXPECT_NE(message.find(c.fragment), std::string::npos) << message;
    }
  }
  // ComfyUI's input scale is read and not used: a valid one loads.
  FileTensors with_input_scale(comfy);
  with_input_scale.put(q + ".scale_input", filled({}, DType::kF32, 0.02));
  with_input_scale.write(broken);
  EXPECT_NO_THROW((void)WanTransformerFile::open(broken, model.config));

  // NaN e4m3 bytes (0x7f and 0xff) are refused when the tensor is read, as the model loads.
  for (const uint8_t nan : {uint8_t{0x7f}, uint8_t{0xff}}) {
    FileTensors tensors(lightx2v);
    tensors.at("blocks.1.ffn.2.weight").data_as<uint8_t>()[5] = nan;
    tensors.write(broken);
    try {
      (void)WanTransformer::load(model.transformer.string(), {}, Device::cpu(), nullptr, WanWeightResidency::kDevice,
                                 WanWeightPrecision::kBf16, broken);
      ADD_FAILURE() << "NaN byte accepted";
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(broken), std::string::npos) << message;
      EXPECT_NE(message.find("blocks.1.ffn.2.weight"), std::string::npos) << message;
      EXPECT_NE(message.find("1 NaN e4m3 byte(s) (0x7f / 0xff; first at element 5)"), std::string::npos) << message;
    }
  }
  // An FP8 file is no diffusers directory: a checkpoint directory holding e4m3 says what it is.
  const fs::path directory = scratch.path() / "fp8_directory";
  fs::create_directories(directory);
  fs::copy_file(model.transformer / "config.json", directory / "config.json");
  FileTensors diffusers_named(lightx2v);
  diffusers_named.tensors.clear();
  diffusers_named.float8.clear();
  const Checkpoint source = Checkpoint::open(model.transformer.string());
  for (const std::string& name : source.tensor_names()) {
    Tensor copy = Tensor::empty(source.find(name)->shape, source.find(name)->dtype);
    copy_convert(source.view(name), copy.view());
    diffusers_named.put(name, std::move(copy));
  }
  diffusers_named.put("blocks.0.attn1.to_q.weight", filled({dim, dim}, DType::kU8, 0x38), true);
  diffusers_named.write((directory / kDiffusersWeightsFile).string());
  try {
    (void)WanTransformer::load(directory.string());
    ADD_FAILURE() << "e4m3 accepted in a diffusers directory";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("blocks.0.attn1.to_q.weight' is stored as float8 e4m3"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessel
