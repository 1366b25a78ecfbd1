// `tessel mask`: draws the block mask of any pattern to a PNG (one head, or the mean over heads),
// with the latent frames' borders in red and the text/image border in blue, e.g.
//   tessel mask --pattern radial --grid 21x30x52 --png radial.png
// Static patterns are planned from the grid; dynamic ones (dynamic_topk, threshold) are estimated
// on synthetic video-DiT q/k (or on --qkv tensors).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <iostream>

#include "command.h"
#include "option_checks.h"
#include "work_budget.h"
#include "sparse_attn_flags.h"
#include "tessel/core/error.h"
#include "tessel/sparse/config.h"
#include "quality/mask_image.h"
#include "tessel/sparse/mask_planning.h"
#include "tessel/sparse/pattern_backends.h"
#include "quality/qkv_file.h"
#include "quality/synthetic_video.h"

namespace tessel::cli {
namespace {

struct MaskArgs {
  std::string pattern;
  std::string config_json;
  std::string grid = "21x30x52";
  int64_t text_tokens = 0;
  bool text_last = false;
  int64_t block_q = 128, block_kv = 64;
  std::optional<int64_t> radius, window, local_window, sink_blocks;
  std::optional<double> decay, topk, threshold;
  std::optional<int64_t> stride;
  std::string ordering;
  bool no_sink = false, keep_diagonal = false, keep_text = false;
  std::string inner;
  std::vector<std::string> children;
  std::string op = "union";
  int64_t heads = 12, head_dim = 128;
  std::string qkv;
  uint64_t seed = 0;
  int64_t head = -1;
  int64_t pixels_per_block = 0;
  std::string png;
  BudgetFlags budget;
};

// The memory the mask, its picture and (dynamic patterns) the synthetic q/k need, and the work of
// estimating a dynamic mask (pooled scores over every block pair: about 2 x tokens^2 x heads x
// head-dim / stride), refused over the budget.
[[nodiscard]] bool check_mask_budget(const MaskArgs& a, const TokenGrid& grid, bool dynamic) {
  const double tokens = double(grid.numel()) + double(a.text_tokens);
  const double q_blocks = std::ceil(tokens / double(a.block_q)), kv_blocks = std::ceil(tokens / double(a.block_kv));
  const double heads = dynamic ? double(a.heads) : 1.0;
  // render_mask's automatic scale: about one pixel per token up to 2048 tokens a side.
  const double ppb_q = a.pixels_per_block > 0 ? double(a.pixels_per_block)
                                              : std::max(1.0, double(a.block_q) / std::max({1.0, std::ceil(tokens / 2048.0),
                                                                                              double(std::min(a.block_q, a.block_kv) / 8)}));
  const double ppb_kv = std::max(1.0, std::round(ppb_q * double(a.block_kv) / double(a.block_q)));
  const double image = q_blocks * ppb_q * kv_blocks * ppb_kv * 3.0;
  const double mask = heads * q_blocks * kv_blocks * 4.0 + q_blocks * kv_blocks * 4.0;
  const double inputs = dynamic && a.qkv.empty() ? 3.0 * tokens * heads * double(a.head_dim) * 4.0 : 0.0;
  WorkEstimate e;
  e.host_bytes = image + mask + inputs;
  e.flop = dynamic ? 2.0 * tokens * tokens * heads * double(a.head_dim) / double(a.stride.value_or(8)) : q_blocks * kv_blocks;
  const std::string picture = detail::concat(" (a ", q_blocks * ppb_q, " x ", kv_blocks * ppb_kv, " picture)");
  return check_work_budget(e, a.budget, Device::cpu(), 0,
                           detail::concat("--grid ", a.grid, " --text-tokens ", a.text_tokens, " --block-q ", a.block_q, " --block-kv ",
                                          a.block_kv, dynamic ? detail::concat(" --heads ", a.heads, " --head-dim ", a.head_dim) : "",
                                          a.pixels_per_block > 0 ? detail::concat(" --pixels-per-block ", a.pixels_per_block) : "",
                                          picture),
                           "mask");
}

int run_mask(const MaskArgs& a) {
  SparseAttnConfig c = a.config_json.empty() ? SparseAttnConfig{} : parse_sparse_attn_config_arg(a.config_json);
  if (!a.pattern.empty()) c.pattern.type = parse_enum_flag(parse_pattern_type, a.pattern, "--pattern");
  const TokenGrid grid = parse_token_grid(a.grid, "--grid");
  c.geometry.spatial_layout = SpatialLayout{grid.frames, grid.height, grid.width, 1,
                                            a.ordering.empty() ? SpatialOrdering::kHilbert
                                                               : parse_enum_flag(parse_spatial_ordering, a.ordering, "--ordering")};
  if (a.text_tokens > 0) c.geometry.num_text_tokens = a.text_tokens;
  c.geometry.text_first = !a.text_last;
  c.geometry.block_q = a.block_q;
  c.geometry.block_kv = a.block_kv;
  if (a.radius) c.pattern.spatial_radius = *a.radius;
  if (a.window) c.pattern.window_size = *a.window;
  if (a.local_window) c.pattern.local_window_size = *a.local_window;
  if (a.decay) c.pattern.decay_factor = *a.decay;
  if (!a.inner.empty()) c.pattern.i2i_pattern = parse_enum_flag(parse_pattern_type, a.inner, "--inner");
  if (!a.children.empty()) {
    c.pattern.children.clear();
    for (const std::string& child : a.children)
      c.pattern.children.push_back(parse_enum_flag(parse_pattern_type, child, "--children"));
  }
  c.pattern.composite_op = parse_enum_flag(parse_composite_op, a.op, "--op");
  if (a.topk) c.selection.topk_ratio = *a.topk;
  if (a.threshold) c.selection.threshold = *a.threshold;
  if (a.stride) c.selection.stride = *a.stride;
  if (a.sink_blocks) c.selection.sink_blocks = *a.sink_blocks;
  if (a.keep_diagonal) c.selection.keep_diagonal = true;
  if (a.keep_text) c.selection.keep_text = true;
  if (a.no_sink) c.options["frame0_sink"] = "false";
  const ResolvedSparseAttnConfig resolved(std::move(c));
  const PatternSpec& spec = resolved.pattern();
  const TokenLayout layout = token_layout_from_spec(spec);
  const bool dynamic = spec.type == PatternType::kDynamicTopk || spec.type == PatternType::kThreshold;
  if (!check_mask_budget(a, grid, dynamic)) return 0;
  if (a.head >= 0 && a.head >= (dynamic ? a.heads : 1) && a.qkv.empty())
    fail_argument("--head", detail::concat("-1 (mean) or a head in [0, ", dynamic ? a.heads : 1, ") of this mask"), a.head);
  if (dynamic && a.qkv.empty() && a.head_dim % 2 != 0) fail_argument("--head-dim", "an even number >= 6 for synthetic data", a.head_dim);

  double ms = 0.0;  // planning or estimation time
  BlockMask mask;
  if (dynamic) {
    Tensor q, k;
    if (!a.qkv.empty()) {
      QkvTensors t = load_qkv_safetensors(a.qkv);
      q = std::move(t.q);
      k = std::move(t.k);
      if (q.size(1) != layout.seq_len()) fail_argument("--grid", detail::concat(q.size(1), " tokens (the q tensor's)"), layout.seq_len());
    } else {
      if (layout.text_tokens > 0) fail_argument("--text-tokens", "0 for dynamic patterns on synthetic data (or use --qkv)", layout.text_tokens);
      SyntheticVideoOptions o;
      o.grid = grid;
      o.heads = a.heads;
      o.head_dim = a.head_dim;
      o.seed = a.seed;
      SyntheticQkv s = make_synthetic_video_qkv(o);
      q = std::move(s.q);
      k = std::move(s.k);
    }
    EstimateResult r = spec.type == PatternType::kDynamicTopk ? estimate_topk_mask(ExecContext{}, q.view(), k.view(), topk_options_from_spec(spec))
                                                              : estimate_xattention_mask(ExecContext{}, q.view(), k.view(), xattention_options_from_spec(spec));
    mask = std::move(r.mask);
    ms = r.estimate_ms;
  } else {
    const auto start = std::chrono::steady_clock::now();
    mask = plan_static_pattern(static_pattern_from_spec(spec), static_request_from_spec(spec)).mask;
    ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  }
  mask = apply_always_keep(spec, mask);

  MaskImageOptions o;
  o.head = a.head;
  o.pixels_per_block = a.pixels_per_block;
  o.layout = &layout;
  const RgbImage image = render_mask(mask, o);
  write_png(a.png, image);
  std::cout << pattern_type_name(spec.type) << " on " << grid.frames << "x" << grid.height << "x" << grid.width << " (+"
            << layout.text_tokens << " text) = " << layout.seq_len() << " tokens, blocks " << a.block_q << "x" << a.block_kv << ": "
            << mask.shape().q_blocks() << "x" << mask.shape().kv_blocks() << " blocks, " << mask.shape().mask_heads
            << " mask head(s), density " << mask.density() << ", planned/estimated in " << ms << " ms\n"
            << "wrote " << a.png << " (" << image.width << "x" << image.height << ")\n";
  return 0;
}

CommandRegistration registration{"mask", "Render a pattern's block mask to a PNG", [](CLI::App& app) {
  auto a = std::make_shared<MaskArgs>();
  const CLI::Validator pattern_name = parsed_by("a pattern type", [](const std::string& text) { parse_pattern_type(text); });
  const CLI::Validator ratio = number_in(0.0, 1.0, Bounds::kOpenLow);
  const CLI::Validator size = integer_in(0, 1 << 30);
  app.add_option("--pattern,--sparse-attn-pattern", a->pattern,
                 "sliding_window, spatial_aware, radial, local, arrow, composite, dense, dynamic_topk, threshold")
      ->check(pattern_name);
  app.add_option("--sparse-attn-config", a->config_json, "Config JSON ('{...}' or @file.json); flags override it");
  app.add_option("--grid", a->grid, "Latent token grid FxHxW (default 21x30x52, Wan 480p 81 frames)")
      ->check(parsed_by("FxHxW or HxW with positive integers", [](const std::string& text) { parse_token_grid(text, "--grid"); }));
  app.add_option("--text-tokens", a->text_tokens, "Text tokens of joint attention (arrow)")->check(size);
  app.add_flag("--text-last", a->text_last, "Text tokens follow the image tokens");
  app.add_option("--block-q", a->block_q, "Query block size")->check(integer_in(1, kMaxBlockTokens));
  app.add_option("--block-kv", a->block_kv, "Key block size")->check(integer_in(1, kMaxBlockTokens));
  app.add_option("--radius", a->radius, "spatial_aware / sliding_window (3-D) radius in patches")->check(integer_in(0, 1 << 20));
  app.add_option("--window", a->window, "sliding_window 1-D window in tokens (no effect with a grid: 3-D box)")->check(size);
  app.add_option("--local-window", a->local_window, "local: window in frames")->check(integer_in(1, 1 << 20));
  app.add_option("--decay", a->decay, "radial: decay factor in (0, 16]")->check(number_in(0.0, 16.0, Bounds::kOpenLow));
  app.add_flag("--no-sink", a->no_sink, "radial: no frame-0 sink");
  app.add_option("--ordering", a->ordering, "spatial_aware ordering: raster, hilbert (default), z_curve")
      ->check(one_of({"raster", "hilbert", "z_curve"}));
  const auto pattern_except = [](PatternType excluded) {
    return parsed_by(detail::concat("a pattern type other than ", pattern_type_name(excluded)), [excluded](const std::string& text) {
      if (parse_pattern_type(text) == excluded) throw Error("not allowed here");
    });
  };
  app.add_option("--inner", a->inner, "arrow: the image-to-image pattern")->check(pattern_except(PatternType::kArrow));
  app.add_option("--children", a->children, "composite: child patterns")
      ->delimiter(',')
      ->check(pattern_except(PatternType::kComposite));
  app.add_option("--op", a->op, "composite: union or intersection")->check(one_of({"union", "intersection"}));
  app.add_option("--topk", a->topk, "dynamic_topk ratio in (0, 1]")->check(ratio);
  app.add_option("--threshold", a->threshold, "threshold (XAttention) tau in (0, 1]")->check(ratio);
  app.add_option("--stride", a->stride, "threshold: antidiagonal stride (8 or 16)")->check(one_of({"8", "16"}));
  app.add_option("--sink-blocks", a->sink_blocks, "Always keep the first N kv blocks")->check(size);
  app.add_flag("--keep-diagonal", a->keep_diagonal, "Always keep the diagonal blocks");
  app.add_flag("--keep-text", a->keep_text, "Always keep text rows and columns");
  app.add_option("--heads", a->heads, "Dynamic patterns on synthetic data: heads")->check(integer_in(1, kMaxHeads));
  app.add_option("--head-dim", a->head_dim, "Dynamic patterns on synthetic data: head dimension (even, >= 6)")
      ->check(integer_in(6, kMaxHeadDim));
  app.add_option("--qkv", a->qkv, "Dynamic patterns: estimate on q/k from this safetensors file");
  app.add_option("--seed", a->seed, "Synthetic data seed")->check(integer_in(0, INT64_MAX));
  app.add_option("--head", a->head, "Mask head to draw (-1 = mean over heads)")->check(integer_in(-1, kMaxHeads));
  app.add_option("--pixels-per-block", a->pixels_per_block, "Pixels per block side (0 = automatic)")->check(integer_in(0, 256));
  app.add_option("--png", a->png, "Output PNG path")->required()->check(writable_file_path());
  add_budget_flags(app, a->budget);
  return CommandRunner([a] { return run_mask(*a); });
}};

}  // namespace
}  // namespace tessel::cli
