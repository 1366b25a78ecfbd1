// PatternSpec: a backend-agnostic description of which (query, key) blocks attention computes,
// as the DiT plugin proposal's SparsePatternSpec (plus XAttention's threshold/stride, TeleFuser's radial/local
// knobs and always-keep options). Each backend's MetadataBuilder translates it into its own form
// (usually a BlockMask). Validation throws tessel::Error naming the field, the allowed range and
// the value found.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/sparse/block_mask.h"

namespace tessel {

enum class PatternType : uint8_t {
  kDense,          // every block
  kBlockSparse,    // an explicit BlockMask (PatternSpec::block_mask)
  kSlidingWindow,  // keys within window_size tokens of the query (1-D), or a latent-grid window
  kSpatialAware,   // neighbourhood of spatial_radius patches on the latent grid (tokens reordered)
  kDynamicTopk,    // data-dependent: keep topk_ratio of the blocks of each row (SpargeAttn style)
  kThreshold,      // data-dependent: keep the blocks reaching `threshold` of the row mass (XAttention)
  kRadial,         // Radial Attention: window shrinking with frame distance (decay_factor)
  kLocal,          // TeleFuser local attention: a window of local_window_frames frames
  kArrow,          // MMDiT joint attention: text rows/columns dense, image-to-image by i2i_pattern
  kComposite,      // union / intersection of `children`
};
inline constexpr int kNumPatternTypes = 10;

std::string_view pattern_type_name(PatternType type);  // "dense", "block_sparse", "sliding_window", ...
PatternType parse_pattern_type(std::string_view name);  // throws Error listing the allowed names
// Every pattern type in declaration order (for listings and loops).
const std::vector<PatternType>& all_pattern_types();

// How latent patches are laid out in the token sequence.
enum class SpatialOrdering : uint8_t { kRaster, kHilbert, kZCurve };
std::string_view spatial_ordering_name(SpatialOrdering ordering);  // "raster", "hilbert", "z_curve"
SpatialOrdering parse_spatial_ordering(std::string_view name);     // throws Error

// Geometry of a DiT latent: `frames` x `height` x `width` latent pixels, patchified by
// `patch_size` in height and width (the token grid is frames x height/p x width/p).
// Tokens are (frame, row, column) in raster order unless `ordering` says otherwise.
struct SpatialLayout {
  int64_t frames = 1;
  int64_t height = 0;
  int64_t width = 0;
  int64_t patch_size = 2;
  SpatialOrdering ordering = SpatialOrdering::kRaster;

  int64_t grid_height() const { return height / patch_size; }
  int64_t grid_width() const { return width / patch_size; }
  int64_t tokens_per_frame() const { return grid_height() * grid_width(); }
  int64_t num_tokens() const { return frames * tokens_per_frame(); }
  // Throws Error (argument named `where`) unless all sizes are >= 1 and patch_size divides
  // height and width.
  void validate(const std::string& where = "spatial_layout") const;
  bool operator==(const SpatialLayout&) const = default;
};

enum class CompositeOp : uint8_t { kUnion, kIntersection };
std::string_view composite_op_name(CompositeOp op);    // "union", "intersection"
CompositeOp parse_composite_op(std::string_view name);  // throws Error

// Upper bounds shared by PatternSpec::validate and the config schema.
inline constexpr double kMaxDecayFactor = 16.0;
inline constexpr int64_t kMaxStride = 64;

struct PatternSpec {
  PatternType type = PatternType::kDense;

  // ---- block geometry (docs/architecture.md defaults: 128 query tokens, 64 key tokens per block)
  int64_t block_q = 128;
  int64_t block_kv = 64;

  // ---- block_sparse: the explicit mask (covers the proposal's block_mask and bsr_indptr/indices:
  // build it with BlockMask::from_dense / from_csr). Its block sizes must equal block_q/block_kv.
  std::shared_ptr<const BlockMask> block_mask;
  // sub_block_mask: (nnz, block_q, block_kv) uint8, one token-level mask per kept block
  // in `block_mask` order, nonzero = pair kept. The block_sparse backend executes it (packed into
  // the kernels' bits, sparse/sub_block_mask.h); backends that cannot honour it reject the spec
  // in plan().
  std::vector<uint8_t> sub_block_mask;

  // ---- sliding_window: key j is in the window of query i when |i + (S_kv - S_q) - j| <= window_size.
  std::optional<int64_t> window_size;

  // ---- spatial_aware / radial / local: the latent grid and neighbourhood radius (in patches).
  std::optional<SpatialLayout> spatial_layout;
  std::optional<int64_t> spatial_radius;
  double decay_factor = 1.0;                   // radial: scales the spatial window (TeleFuser)
  std::optional<int64_t> local_window_frames;  // local: frames each frame attends to (TeleFuser)

  // ---- dynamic_topk: fraction of the kv blocks of each row to keep, in (0, 1].
  std::optional<double> topk_ratio;

  // ---- threshold (XAttention): cumulative row mass to reach, in (0, 1]; antidiagonal stride.
  std::optional<double> threshold;
  std::optional<int64_t> stride;

  // ---- arrow (MMDiT joint attention): text and image token counts; the image-to-image pattern.
  std::optional<int64_t> num_image_tokens;
  std::optional<int64_t> num_text_tokens;
  bool text_first = true;  // text tokens precede the image tokens in the joint sequence
  std::shared_ptr<const PatternSpec> i2i_pattern;
  bool cross_dense = true;  // text<->image blocks computed densely

  // ---- composite: children combined by `composite_op`.
  std::vector<PatternSpec> children;
  CompositeOp composite_op = CompositeOp::kUnion;

  // ---- always-keep options, applied on top of any pattern's mask.
  bool keep_diagonal = false;  // the kv blocks overlapping each q block's own token range
  int64_t sink_blocks = 0;     // the first `sink_blocks` kv blocks for every row
  bool keep_text = false;      // rows and columns of text tokens (needs num_text_tokens)

  // ---- denoising-step context (set by DiTSparseAttentionAdapter before update_step)
  std::optional<int64_t> current_step;
  std::optional<int64_t> total_steps;

  // ---- backend-specific knobs (e.g. "cdf": "0.9"); from the config's "options" object.
  std::map<std::string, std::string> options;

  // Checks every field that is set, and that the fields the pattern type needs are present
  // (block_sparse: block_mask; sliding_window: window_size or spatial_layout; spatial_aware:
  // spatial_layout and spatial_radius; dynamic_topk: topk_ratio; threshold: threshold; radial and
  // local: spatial_layout; arrow: num_text_tokens, num_image_tokens, i2i_pattern; composite:
  // children). Children and i2i_pattern are validated recursively. Throws Error.
  void validate() const;

  // The options value for `key`, or `fallback` when absent.
  std::string option(const std::string& key, const std::string& fallback = "") const;
};

}  // namespace tessel
