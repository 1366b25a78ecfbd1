// The hyper-parameters of a Wan 2.x video transformer, with the field names and defaults of the
// config.json that diffusers writes next to a WanTransformer3DModel checkpoint:
//   {"_class_name": "WanTransformer3DModel", "patch_size": [1, 2, 2], "num_attention_heads": 12,
//    "attention_head_dim": 128, "in_channels": 16, "out_channels": 16, "text_dim": 4096,
//    "freq_dim": 256, "ffn_dim": 8960, "num_layers": 30, "cross_attn_norm": true,
//    "qk_norm": "rms_norm_across_heads", "eps": 1e-06, "rope_max_seq_len": 1024}
// Keys starting with "_" (class name, library version) are ignored. qk_norm may be
// "rms_norm_across_heads" or null: diffusers 0.42 applies the RMSNorm across heads to q and k
// whatever it says (the checkpoint holds norm_q / norm_k weights either way), and so does tessel. The image-conditioning fields
// (image_dim, added_kv_proj_dim, pos_embed_seq_len: Wan 2.1 I2V and FLF2V) are null or absent for
// text-to-video and for Wan 2.2 I2V-A14B (whose image arrives only through in_channels = 36).
// Any other unknown key, a wrong type or an out-of-range value is an Error naming the key.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tessel {

struct WanConfig {
  std::array<int64_t, 3> patch_size{1, 2, 2};  // (frames, height, width) of one patch
  int64_t num_attention_heads = 40;
  int64_t attention_head_dim = 128;
  int64_t in_channels = 16;
  int64_t out_channels = 16;
  int64_t text_dim = 4096;   // width of the text encoder's hidden states
  int64_t freq_dim = 256;    // width of the sinusoidal timestep embedding
  int64_t ffn_dim = 13824;
  int64_t num_layers = 40;
  bool cross_attn_norm = true;  // affine LayerNorm before the cross-attention
  double eps = 1e-6;
  int64_t rope_max_seq_len = 1024;  // positions the rotary tables cover along each axis
  // Wan 2.1 I2V's image branch (0: none, diffusers' null). image_dim is the width of the CLIP
  // features the image embedder takes; added_kv_proj_dim the width the cross-attention's image
  // keys and values are projected from (the embedder's output: the inner width); pos_embed_seq_len
  // the image tokens of FLF2V's learned position table (the first and the last frame's side by side).
  int64_t image_dim = 0;
  int64_t added_kv_proj_dim = 0;
  int64_t pos_embed_seq_len = 0;

  bool has_image_branch() const { return image_dim > 0; }

  int64_t inner_dim() const { return num_attention_heads * attention_head_dim; }
  int64_t patch_volume() const { return patch_size[0] * patch_size[1] * patch_size[2]; }
  // Throws Error naming the field when a value is out of range (non-positive sizes, a head
  // dimension that the 3-D rotary split cannot divide, ...).
  void validate() const;
};

// Parses the text of a config.json. `source` names it in error messages.
WanConfig parse_wan_config(std::string_view json_text, const std::string& source = "config.json");
// Reads `<checkpoint_dir>/config.json`.
WanConfig load_wan_config(const std::string& checkpoint_dir);

// The published sizes: "wan-1.3b" (Wan2.1-T2V-1.3B) and "wan-14b" (Wan2.1-T2V-14B). Throws
// Error listing the names for an unknown one.
WanConfig wan_preset(std::string_view name);
std::vector<std::string> wan_preset_names();

}  // namespace tessel
