#include "quality/synthetic_video.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "tessel/core/error.h"
#include "tessel/core/parallel.h"
#include "tessel/core/random.h"

namespace tessel {
namespace {

struct AxisSpec {
  double weight;       // a_axis: share of the peak logit
  double lengthscale;  // ℓ in grid steps
};

struct HeadSpec {
  double beta;
  AxisSpec axes[3];  // frame, row, column
  double sink_bonus;  // logit bonus of frame-0 keys, as a fraction of beta
};

HeadSpec head_spec(SyntheticHeadType type, double sharpness) {
  switch (type) {
    case SyntheticHeadType::kSpatial: return {10.0 * sharpness, {{0.5, 0.3}, {0.25, 2.0}, {0.25, 2.0}}, 0.0};
    case SyntheticHeadType::kTemporal: return {10.0 * sharpness, {{0.45, 2.0}, {0.275, 1.0}, {0.275, 1.0}}, 0.0};
    case SyntheticHeadType::kSink: return {10.0 * sharpness, {{0.2, 0.3}, {0.2, 2.0}, {0.2, 2.0}}, 0.6};
    case SyntheticHeadType::kDiffuse: return {1.5 * sharpness, {{0.34, 1.0}, {0.33, 3.0}, {0.33, 3.0}}, 0.0};
  }
  return {};
}

}  // namespace

std::string_view synthetic_head_type_name(SyntheticHeadType type) {
  switch (type) {
    case SyntheticHeadType::kSpatial: return "spatial";
    case SyntheticHeadType::kTemporal: return "temporal";
    case SyntheticHeadType::kSink: return "sink";
    case SyntheticHeadType::kDiffuse: return "diffuse";
  }
  return "spatial";
}

SyntheticHeadType parse_synthetic_head_type(std::string_view name) {
  for (SyntheticHeadType t : {SyntheticHeadType::kSpatial, SyntheticHeadType::kTemporal, SyntheticHeadType::kSink, SyntheticHeadType::kDiffuse})
    if (synthetic_head_type_name(t) == name) return t;
  fail_argument("synthetic head type", "spatial, temporal, sink or diffuse", name);
}

SyntheticQkv make_synthetic_video_qkv(const SyntheticVideoOptions& o) {
  validate_token_layout(TokenLayout{o.grid, 0, true}, "synthetic.grid");
  if (o.batch < 1) fail_argument("synthetic.batch", ">= 1", o.batch);
  if (o.heads < 1) fail_argument("synthetic.heads", ">= 1", o.heads);
  if (o.head_dim < 6 || o.head_dim % 2 != 0) fail_argument("synthetic.head_dim", "an even number >= 6", o.head_dim);
  if (!(o.sharpness > 0.0)) fail_argument("synthetic.sharpness", "> 0", o.sharpness);
  if (!(o.noise >= 0.0)) fail_argument("synthetic.noise", ">= 0", o.noise);
  if (!(o.value_mean >= 0.0 && o.value_smooth >= 0.0 && o.value_mean + o.value_smooth <= 1.0))
    fail_argument("synthetic.value_mean + value_smooth", "shares >= 0 summing to at most 1",
                  detail::concat(o.value_mean, " + ", o.value_smooth));
  if (!o.head_types.empty() && static_cast<int64_t>(o.head_types.size()) != o.heads)
    fail_argument("synthetic.head_types", detail::concat(o.heads, " entries (one per head) or none"), o.head_types.size());

  SyntheticQkv out;
  static constexpr SyntheticHeadType kMix[] = {SyntheticHeadType::kSpatial, SyntheticHeadType::kTemporal,
                                               SyntheticHeadType::kSpatial, SyntheticHeadType::kTemporal,
                                               SyntheticHeadType::kSink,    SyntheticHeadType::kDiffuse};
  out.head_types = o.head_types;
  if (out.head_types.empty())
    for (int64_t h = 0; h < o.heads; ++h) out.head_types.push_back(kMix[h % 6]);

  const TokenGrid& g = o.grid;
  const int64_t seq = g.numel(), dim = o.head_dim, pairs = dim / 2, heads = o.heads, rows = o.batch * seq;
  const int64_t axis_pairs[3] = {pairs / 4, (pairs - pairs / 4) / 2, pairs - pairs / 4 - (pairs - pairs / 4) / 2};
  const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
  const Shape shape{o.batch, seq, heads, dim};
  Tensor q = Tensor::empty(shape, DType::kF32), k = Tensor::empty(shape, DType::kF32), v = Tensor::empty(shape, DType::kF32);
  fill_normal(v.view(), o.seed * 3 + 2);
  std::mt19937_64 rng(o.seed * 3 + 1);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> phase(0.0, 2.0 * M_PI);
  std::uniform_real_distribution<double> low_frequency(0.0, 0.5);
  // The position of token t on the grid: (frame, row, column).
  const auto position = [&g](int64_t t, double pos[3]) {
    pos[0] = static_cast<double>(t / g.tokens_per_frame());
    pos[1] = static_cast<double>((t / g.width) % g.height);
    pos[2] = static_cast<double>(t % g.width);
  };
  // Work over tokens that draws no random numbers runs in parallel over chunks of tokens; the
  // draws stay in one sequence in a fixed order, so a seed gives the same tensors at any thread count.
  const int64_t chunk = 256, chunks = (rows + chunk - 1) / chunk;
  const auto for_token_chunks = [&](const auto& body) {
    parallel_for(chunks, [&](int64_t c) {
      for (int64_t r = c * chunk; r < std::min(rows, (c + 1) * chunk); ++r) body(r, r % seq);
    });
  };

  // v = √(mean_share)·(per-head channel mean) + √(smooth_share)·(smooth field) + √(rest)·(white noise),
  // each part of unit variance per element. Every channel's mean and three plane waves (frequency
  // <= 0.5 rad per patch) are drawn first, then the tokens are filled in memory order.
  const double rest = std::max(0.0, 1.0 - o.value_mean - o.value_smooth);
  struct ChannelField {
    double mean, w[3][3], phi[3];
  };
  std::vector<ChannelField> fields(static_cast<size_t>(heads * dim));
  for (ChannelField& f : fields) {
    f.mean = normal(rng);
    for (int j = 0; j < 3; ++j) {
      for (double& x : f.w[j]) x = low_frequency(rng);
      f.phi[j] = phase(rng);
    }
  }
  float* vd = v.data_as<float>();
  for_token_chunks([&](int64_t row, int64_t t) {
    double pos[3];
    position(t, pos);
    float* out = vd + row * heads * dim;
    for (int64_t i = 0; i < heads * dim; ++i) {
      const ChannelField& f = fields[static_cast<size_t>(i)];
      double field = 0.0;
      for (int j = 0; j < 3; ++j)
        field += std::sqrt(2.0 / 3.0) * std::cos(f.w[j][0] * pos[0] + f.w[j][1] * pos[1] + f.w[j][2] * pos[2] + f.phi[j]);
      out[i] = static_cast<float>(std::sqrt(o.value_mean) * f.mean + std::sqrt(o.value_smooth) * field + std::sqrt(rest) * out[i]);
    }
  });

  // q and k, head by head: the head's random phases and sink direction, its rotary position
  // features (equal in q and k; no draws, so in parallel over tokens), then its content noise and
  // sink component (drawn in token order).
  float* qd = q.data_as<float>();
  float* kd = k.data_as<float>();
  std::vector<double> theta(pairs), amp(pairs), phi(pairs), sink_dir(dim);
  std::vector<int> axis_of(pairs);
  for (int64_t h = 0; h < heads; ++h) {
    const HeadSpec spec = head_spec(out.head_types[static_cast<size_t>(h)], o.sharpness);
    // Per pair: frequency, amplitude (so that Σ amp² cos(θΔ) · scale = β a K(Δ)), phase offset.
    int64_t pair = 0;
    for (int axis = 0; axis < 3; ++axis) {
      const int64_t n = axis_pairs[axis];
      const double ell = spec.axes[axis].lengthscale;
      const double theta_max = std::min(M_PI, 2.5 / ell);
      double weight_sum = 0.0;
      std::vector<double> w(n);
      for (int64_t j = 0; j < n; ++j) {
        const double t = theta_max * (static_cast<double>(j) + 0.5) / static_cast<double>(n);
        w[j] = std::exp(-0.5 * (t * ell) * (t * ell));
        weight_sum += w[j];
        theta[pair + j] = t;
      }
      for (int64_t j = 0; j < n; ++j) {
        amp[pair + j] = std::sqrt(spec.beta * spec.axes[axis].weight * w[j] / weight_sum / scale);
        phi[pair + j] = phase(rng);
        axis_of[pair + j] = axis;
      }
      pair += n;
    }
    // Content noise per element of std σ: its q·k term has std √D σ², i.e. σ² after the 1/√D
    // scale, so σ = √(noise · β) gives content logits of std noise · β.
    const double content = std::sqrt(o.noise * spec.beta);
    // The sink direction: a unit vector; queries carry s·u, frame-0 keys carry s·u, with
    // s² · scale = sink_bonus · β.
    double norm = 0.0;
    for (double& x : sink_dir) {
      x = normal(rng);
      norm += x * x;
    }
    for (double& x : sink_dir) x /= std::sqrt(norm);
    const double sink_amp = std::sqrt(spec.sink_bonus * spec.beta / scale);

    for_token_chunks([&](int64_t row, int64_t t) {
      double pos[3];
      position(t, pos);
      float* qt = qd + (row * heads + h) * dim;
      float* kt = kd + (row * heads + h) * dim;
      for (int64_t p = 0; p < pairs; ++p) {
        const double angle = theta[p] * pos[axis_of[p]] + phi[p];
        qt[2 * p] = kt[2 * p] = static_cast<float>(amp[p] * std::cos(angle));
        qt[2 * p + 1] = kt[2 * p + 1] = static_cast<float>(amp[p] * std::sin(angle));
      }
    });
    for (int64_t row = 0; row < rows; ++row) {
      float* qt = qd + (row * heads + h) * dim;
      float* kt = kd + (row * heads + h) * dim;
      const bool frame0 = row % seq < g.tokens_per_frame();
      for (int64_t d = 0; d < dim; ++d) {
        qt[d] += static_cast<float>(content * normal(rng) + sink_amp * sink_dir[d]);
        kt[d] += static_cast<float>(content * normal(rng) + (frame0 ? sink_amp * sink_dir[d] : 0.0));
      }
    }
  }
  if (o.dtype == DType::kF32) {
    out.q = std::move(q);
    out.k = std::move(k);
    out.v = std::move(v);
  } else {
    out.q = q.to(o.dtype);
    out.k = k.to(o.dtype);
    out.v = v.to(o.dtype);
  }
  return out;
}

}  // namespace tessel
