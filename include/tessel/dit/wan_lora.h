// LoRA adapters and full weight diffs for the Wan transformer, merged into its weights at load.
//
// Reads the key formats people publish for Wan: diffusers / PEFT (`transformer.blocks.0.attn1.to_q.
// lora_A.weight`, alpha from the safetensors metadata `lora_adapter_metadata` or a PEFT
// `adapter_config.json` beside an `adapter_model.safetensors`, scale 1 when neither says),
// kohya / musubi (`lora_unet_blocks_0_self_attn_q.lora_down.weight`, `.lora_up.weight`, per-module
// `.alpha`), ComfyUI (`diffusion_model.` prefixes on the original Wan module names such as
// `self_attn.q` or `cross_attn.k_img`) and LightX2V's full diffs (`.diff` of a weight, norm weight or
// modulation table, `.diff_b` of a bias). Every key is mapped onto the diffusers tensor names the
// checkpoint loader uses (wan_weight_specs): a table of every Wan module in both namings
// (wan_lora_module_aliases), so a key the table does not know, or a module this model lacks (the
// image branch on a text-to-video model), is unmatched: an Error naming the keys, unless the caller
// ignores unmatched keys (a file that matches nothing is an Error either way).
//
// The merge follows diffusers' fuse_lora: W += scale * (alpha / rank) * B A for a low-rank pair,
// bias += scale * (alpha / rank) * lora_B.bias, and W += scale * diff, bias += scale * diff_b for the
// full diffs (alpha does not scale those), in fp32 on the host before the weights take their
// device dtype; several files add up.
//
// The low-rank pairs can also stay unmerged (factors(): what WanLoraBank keeps resident to apply
// y += scale * B (A x) per request); full diffs have no cheap unmerged form, so factors() refuses them.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/core/tensor.h"
#include "tessel/dit/wan_config.h"

namespace tessel {

// One adapter file and its weight.
struct LoraFile {
  std::string path;    // a .safetensors file
  double scale = 1.0;  // the adapter's weight (finite)
};

// "path[:scale]" as the CLI and the server take it (`--lora`): the last ':' followed by a number
// splits off the scale, so paths with ':' still work when a scale is given. Throws Error naming
// `what` for an empty path or a non-finite scale.
LoraFile parse_lora_file(std::string_view text, const std::string& what);

// (diffusers name, original Wan name) of every module of `config`'s transformer, e.g.
// ("blocks.0.attn1.to_q", "blocks.0.self_attn.q"), ("blocks.0.scale_shift_table",
// "blocks.0.modulation"): what the key mapping resolves against (also the table its test walks).
std::vector<std::pair<std::string, std::string>> wan_lora_module_aliases(const WanConfig& config);
// Every spelling of those modules (both namings) -> the diffusers module name: what the keys of
// LoRA files and of single-file checkpoints (wan_transformer_file.h) resolve against.
std::map<std::string, std::string> wan_module_spellings(const WanConfig& config);
// `key` without the prefixes files put before the module names ("base_model.model.",
// "model.diffusion_model.", "diffusion_model.", "transformer."), however many are stacked.
std::string strip_wan_key_prefixes(std::string key);

// "name=path[:scale]" as the server takes a per-request adapter (`--lora-adapter`): the name is what
// requests ask for (letters, digits, '_', '-', '.'; at most 64 characters), the rest parse_lora_file's.
// Throws Error naming `what` for a missing '=', a bad name, or a bad path[:scale].
std::pair<std::string, LoraFile> parse_lora_adapter(std::string_view text, const std::string& what);

// One low-rank pair of one linear layer, unmerged: its delta is scale * up (out, rank) @ down (rank, in).
struct WanLoraFactors {
  std::string module;  // the diffusers module, e.g. "blocks.0.attn1.to_q" (its weight is module + ".weight")
  Tensor down;         // A: (rank, in) fp32 CPU, `in` the weight's trailing dimensions flattened
  Tensor up;           // B: (out, rank) fp32 CPU
  Tensor up_bias;      // lora_B's bias (out) fp32 CPU, undefined when the file has none
  double scale = 1.0;  // the file's weight times alpha / rank (or alpha / sqrt(rank) for rsLoRA)
  std::string origin;  // "file: \"key\"" of its lora_A / lora_down tensor, for errors
};

class WanLora {
 public:
  // Reads `files` and resolves every key against `config`'s tensors, checking ranks, shapes and
  // values (finite) before anything is merged. Throws Error naming the file and the key.
  static WanLora load(const std::vector<LoraFile>& files, const WanConfig& config, bool ignore_unmatched = false);

  WanLora();
  ~WanLora();
  WanLora(WanLora&&) noexcept;
  WanLora& operator=(WanLora&&) noexcept;

  bool empty() const;
  // Whether any file changes this tensor (a diffusers tensor name, e.g. "blocks.0.attn1.to_q.weight").
  bool changes(const std::string& tensor) const;
  // `stored` (any float dtype, CPU) with every delta of `tensor` added, as a new fp32 CPU tensor.
  Tensor merged(const std::string& tensor, const TensorView& stored) const;
  // Every low-rank pair, by module name order then file order. Throws Error naming the file and
  // the key of the first full diff (`.diff`, `.diff_b`): those only merge (WanTransformer::load).
  std::vector<WanLoraFactors> factors() const;
  // One line per file for logs: its format, the modules it changes and the keys it left unmatched.
  const std::vector<std::string>& summary() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessel
