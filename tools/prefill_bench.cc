// Synthetic data model of `tessel prefill-bench`.
//
// "clustered" (default): each kv head has 8 random unit "topic" directions. Every key block is about
// one topic (key = 0.5·noise + 8·topic); every prefill chunk asks about one topic (query = 0.5·noise
// + 8·topic), so a chunk's attention concentrates on the history blocks of its topic, as attention
// to relevant passages does in a real model. "random": keys and queries are pure noise, so
// attention is nearly uniform: the worst case for threshold-based selection.
// Needle: the 16 keys from 40% of the context on are 32·u (u a random unit vector per kv head) and
// their values a ±1 marker (a needle spans several tokens, like a sentence; XAttention's strided
// scoring sums 8-token antidiagonals, so a lone token is diluted by design); the last chunk's queries and the decode queries add 8·u. The needle is found when the
// last query row (prefill) and the first decode step read the marker back (cosine ≥ 0.9 per head).
#include "prefill_bench.h"

#include <chrono>
#include <cmath>
#include <memory>
#include <random>

#include "sparse_attn_flags.h"
#include "tessel/core/error.h"
#include "tessel/core/parallel.h"
#include "tessel/core/tensor.h"
#include "tessel/kv/offloaded_attention.h"
#include "tessel/kv/policies.h"
#include "tessel/kv/policy_backend.h"
#include "tessel/sparse/registry.h"

namespace tessel::cli {
namespace {

using Clock = std::chrono::steady_clock;
using kv::OffloadedAttention;

constexpr int64_t kTopics = 8;
constexpr int64_t kNeedleTokens = 16;
constexpr float kNoise = 0.5f, kTopic = 8.0f, kNeedleKey = 32.0f, kNeedleQuery = 8.0f;

// Counter-based uniform noise with variance 1 (fast and reproducible across threads).
float noise(uint64_t seed, uint64_t index) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + index;
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return (static_cast<float>(x >> 40) / static_cast<float>(1ull << 24) - 0.5f) * 3.4641016f;  // √12
}

uint64_t mix(uint64_t a) { return static_cast<uint64_t>(noise(a, 7) * 1e6f + 4e6f); }

struct DataModel {
  const PrefillBenchConfig& c;
  int64_t context;
  bool clustered;
  int64_t needle_position;
  std::vector<float> topics;  // (kv_heads, topics, dim)
  std::vector<float> u;       // (kv_heads, dim)
  std::vector<float> marker;  // (kv_heads, dim)

  DataModel(const PrefillBenchConfig& config, int64_t ctx) : c(config), context(ctx) {
    if (config.data != "clustered" && config.data != "random")
      fail_argument("--data", "clustered or random", config.data);
    clustered = config.data == "clustered";
    needle_position = context * 2 / 5;
    auto unit_vectors = [&](int64_t count, uint64_t seed) {
      std::vector<float> out(static_cast<size_t>(count * c.head_dim));
      for (int64_t i = 0; i < count; ++i) {
        double norm = 0;
        for (int64_t d = 0; d < c.head_dim; ++d) {
          const float x = noise(seed, static_cast<uint64_t>(i * c.head_dim + d));
          out[static_cast<size_t>(i * c.head_dim + d)] = x;
          norm += x * x;
        }
        for (int64_t d = 0; d < c.head_dim; ++d) out[static_cast<size_t>(i * c.head_dim + d)] /= std::sqrt(norm);
      }
      return out;
    };
    topics = unit_vectors(c.kv_heads * kTopics, c.seed + 11);
    u = unit_vectors(c.kv_heads, c.seed + 12);
    marker.resize(u.size());
    for (size_t i = 0; i < marker.size(); ++i) marker[i] = noise(c.seed + 13, i) > 0 ? 1.0f : -1.0f;
  }

  const float* topic(int64_t kv_head, int64_t t) const {
    return &topics[static_cast<size_t>((kv_head * kTopics + t) * c.head_dim)];
  }
  int64_t block_topic(int64_t block) const { return static_cast<int64_t>(mix(c.seed * 1000 + block) % kTopics); }
  int64_t chunk_topic(int64_t chunk) const { return static_cast<int64_t>(mix(c.seed * 7777 + chunk) % kTopics); }

  // Rows [first, first+n) of q (n, heads, dim), k and v (n, kv_heads, dim) as fp32.
  void keys_values(int64_t first, int64_t n, float* k, float* v) const {
    const int64_t width = c.kv_heads * c.head_dim;
    parallel_for(n, [&](int64_t r) {
      const int64_t t = first + r;
      for (int64_t g = 0; g < c.kv_heads; ++g) {
        const float* tp = topic(g, block_topic(t / c.block));
        for (int64_t d = 0; d < c.head_dim; ++d) {
          const uint64_t i = static_cast<uint64_t>(t * width + g * c.head_dim + d);
          float key = kNoise * noise(c.seed + 1, i) + (clustered ? kTopic * tp[d] : 0.0f);
          float value = noise(c.seed + 2, i);
          if (t >= needle_position && t < needle_position + kNeedleTokens) {
            key = kNeedleKey * u[static_cast<size_t>(g * c.head_dim + d)];
            value = marker[static_cast<size_t>(g * c.head_dim + d)];
          }
          k[r * width + g * c.head_dim + d] = key;
          v[r * width + g * c.head_dim + d] = value;
        }
      }
    });
  }
  void queries(int64_t first, int64_t n, int64_t topic_id, bool ask_needle, float* q) const {
    const int64_t width = c.heads * c.head_dim, group = c.heads / c.kv_heads;
    parallel_for(n, [&](int64_t r) {
      for (int64_t h = 0; h < c.heads; ++h) {
        const int64_t g = h / group;
        const float* tp = topic(g, topic_id);
        for (int64_t d = 0; d < c.head_dim; ++d) {
          const uint64_t i = static_cast<uint64_t>((first + r) * width + h * c.head_dim + d);
          q[r * width + h * c.head_dim + d] = kNoise * noise(c.seed + 3, i) + (clustered ? kTopic * tp[d] : 0.0f) +
                                              (ask_needle ? kNeedleQuery * u[static_cast<size_t>(g * c.head_dim + d)] : 0.0f);
        }
      }
    });
  }

  // Smallest per-head cosine between a (1, 1, heads, dim) output row and the needle's marker.
  double needle_cosine(const std::vector<float>& row) const {
    double worst = 1.0;
    for (int64_t h = 0; h < c.heads; ++h) {
      const int64_t g = h / (c.heads / c.kv_heads);
      double dot = 0, a = 0, b = 0;
      for (int64_t d = 0; d < c.head_dim; ++d) {
        const double x = row[static_cast<size_t>(h * c.head_dim + d)], m = marker[static_cast<size_t>(g * c.head_dim + d)];
        dot += x * m;
        a += x * x;
        b += m * m;
      }
      worst = std::min(worst, (a > 0 && std::isfinite(a)) ? dot / std::sqrt(a * b) : -1.0);
    }
    return worst;
  }
};

// Converts fp32 host rows into a tensor of the bench dtype on the device.
Tensor upload(const std::vector<float>& host, const Shape& shape, DType dtype, Device device) {
  const TensorView src(const_cast<float*>(host.data()), DType::kF32, Device::cpu(), shape);
  Tensor converted = Tensor::empty(shape, dtype);
  copy_convert(src, converted.view());
  return device.is_cpu() ? converted : converted.to(device);
}

std::vector<float> download_row(const Tensor& t, int64_t row) {
  const int64_t width = t.size(2) * t.size(3);
  const Tensor host = t.device().is_cpu() ? t : t.to(Device::cpu());
  const TensorView src(static_cast<char*>(host.data()) + row * width * static_cast<int64_t>(dtype_size(t.dtype())),
                       t.dtype(), Device::cpu(), {1, 1, t.size(2), t.size(3)});
  std::vector<float> out(static_cast<size_t>(width));
  copy_convert(src, TensorView(out.data(), DType::kF32, Device::cpu(), {1, 1, t.size(2), t.size(3)}));
  return out;
}

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

}  // namespace

nlohmann::json run_prefill_bench(const PrefillBenchConfig& c, int64_t context) {
  if (context < 1) fail_argument("--context", "> 0", context);
  if (c.heads % c.kv_heads != 0) fail_argument("--heads", detail::concat("a multiple of --kv-heads ", c.kv_heads), c.heads);
  if (c.chunk % c.block != 0) fail_argument("--chunk", detail::concat("a multiple of --block ", c.block), c.chunk);
  if (c.decode_steps < 1) fail_argument("--decode-steps", ">= 1", c.decode_steps);
  const DataModel data(c, context);

  kv::OffloadConfig oc;
  oc.num_layers = c.layers;
  oc.block_size = c.block;
  oc.num_kv_heads = c.kv_heads;
  oc.head_dim = c.head_dim;
  oc.num_slots = c.slots;
  oc.max_chunk_tokens = c.chunk;
  oc.dtype = c.dtype;
  oc.num_host_blocks = (context + c.decode_steps + c.block - 1) / c.block + 1;
  ExecContext ctx;
  ctx.device = c.device;
  auto engine = kv::make_offload_engine(ctx, oc, kv::CpuCopyOptions{c.cpu_copy_bandwidth, 0.0});
  kv::KvBlockManager manager(oc.num_host_blocks, c.block);

  kv::PolicyOptions po;
  po.xattention.threshold = c.threshold;
  po.xattention.stride = c.stride;
  if (c.scoring == "auto") {
    po.xattention_scoring = kv::XAttentionScoring::kAuto;
  } else if (c.scoring == "device") {
    po.xattention_scoring = kv::XAttentionScoring::kDevice;
  } else if (c.scoring == "host") {
    po.xattention_scoring = kv::XAttentionScoring::kHost;
  } else {
    fail_argument("--scoring", "auto, device or host", c.scoring);
  }
  po.quest.top_k = c.top_k;
  po.quest.enable_prefill = c.policy == "quest";
  po.top_k = c.top_k;
  // Policies resolve by name through the backend registry: the built-ins plus whatever else is
  // registered there.
  const std::unique_ptr<BackendRegistry> owned_registry = make_cli_registry();
  BackendRegistry& registry = *owned_registry;
  auto prefill_policy = kv::make_sparse_policy(registry, c.policy, po);
  std::unique_ptr<kv::SparsePolicy> decode_owned;
  kv::SparsePolicy* decode_policy = prefill_policy.get();
  if (!c.decode_policy.empty() && c.decode_policy != c.policy) {
    decode_owned = kv::make_sparse_policy(registry, c.decode_policy, po);
    decode_policy = decode_owned.get();
  } else if (!prefill_policy->supports_decode()) {
    decode_owned = kv::make_sparse_policy(registry, "full", po);
    decode_policy = decode_owned.get();
  }
  OffloadedAttention attention(*engine, manager, *prefill_policy, *decode_policy);
  attention.start_sequence();

  // All inputs are generated and uploaded before timing; every layer reuses the same values.
  const int64_t chunks = (context + c.chunk - 1) / c.chunk;
  std::vector<Tensor> q, k, v;
  for (int64_t i = 0; i < chunks; ++i) {
    const int64_t first = i * c.chunk, n = std::min(c.chunk, context - first);
    std::vector<float> qh(static_cast<size_t>(n * c.heads * c.head_dim));
    std::vector<float> kh(static_cast<size_t>(n * c.kv_heads * c.head_dim)), vh(kh.size());
    data.queries(first, n, data.chunk_topic(i), i == chunks - 1, qh.data());
    data.keys_values(first, n, kh.data(), vh.data());
    q.push_back(upload(qh, {1, n, c.heads, c.head_dim}, c.dtype, c.device));
    k.push_back(upload(kh, {1, n, c.kv_heads, c.head_dim}, c.dtype, c.device));
    v.push_back(upload(vh, {1, n, c.kv_heads, c.head_dim}, c.dtype, c.device));
  }
  Tensor out = Tensor::empty({1, c.chunk, c.heads, c.head_dim}, c.dtype, c.device);
  const double peak_h2d = engine->measure_peak_h2d_bandwidth();
  engine->synchronize();
  engine->reset_stats();

  const auto prefill_start = Clock::now();
  for (int64_t i = 0; i < chunks; ++i) {
    const int64_t n = q[static_cast<size_t>(i)].size(1);
    const TensorView out_rows(out.data(), c.dtype, c.device, {1, n, c.heads, c.head_dim});
    attention.begin_chunk(n, i, chunks);
    for (int64_t l = 0; l < c.layers; ++l)
      attention.prefill_layer(ctx, l, q[static_cast<size_t>(i)].view(), k[static_cast<size_t>(i)].view(),
                              v[static_cast<size_t>(i)].view(), out_rows);
    attention.end_chunk();
  }
  engine->synchronize();
  const double prefill_seconds = seconds_since(prefill_start);
  const kv::OffloadStats prefill_stats = engine->stats();
  const kv::SelectionStats selection = prefill_policy->selection_stats();
  const double prefill_cosine = data.needle_cosine(download_row(out, q.back().size(1) - 1));

  // Decode: the first step asks for the needle.
  std::vector<float> qd(static_cast<size_t>(c.heads * c.head_dim));
  std::vector<float> kd(static_cast<size_t>(c.kv_heads * c.head_dim)), vd(kd.size());
  data.queries(context, 1, data.chunk_topic(chunks), true, qd.data());
  data.keys_values(context, 1, kd.data(), vd.data());
  const Tensor q_dec = upload(qd, {1, 1, c.heads, c.head_dim}, c.dtype, c.device);
  const Tensor k_dec = upload(kd, {1, 1, c.kv_heads, c.head_dim}, c.dtype, c.device);
  const Tensor v_dec = upload(vd, {1, 1, c.kv_heads, c.head_dim}, c.dtype, c.device);
  Tensor out_dec = Tensor::empty({1, 1, c.heads, c.head_dim}, c.dtype, c.device);
  double decode_cosine = 0;
  decode_policy->reset_selection_stats();
  engine->reset_stats();
  const auto decode_start = Clock::now();
  for (int64_t s = 0; s < c.decode_steps; ++s) {
    attention.begin_decode_step();
    for (int64_t l = 0; l < c.layers; ++l)
      attention.decode_layer(ctx, l, q_dec.view(), k_dec.view(), v_dec.view(), out_dec.view());
    attention.end_decode_step();
    if (s == 0) {
      engine->synchronize();
      decode_cosine = data.needle_cosine(download_row(out_dec, 0));
    }
  }
  engine->synchronize();
  const double decode_seconds = seconds_since(decode_start);
  const kv::SelectionStats decode_selection = decode_policy->selection_stats();
  const kv::OffloadStats decode_stats = engine->stats();

  // Every byte prefill moved host→device: slot loads and scoring keys (engine), plus the policy's own
  // small scoring copies; and device→host: offloads plus what scoring read back.
  const int64_t prefill_h2d = prefill_stats.bytes_h2d + selection.score_bytes_h2d;
  const double h2d_gbps = static_cast<double>(prefill_h2d) / prefill_seconds / 1e9;
  nlohmann::json r;
  r["context"] = context;
  r["device"] = engine->device().str();
  r["dtype"] = std::string(dtype_name(c.dtype));
  r["policy"] = prefill_policy->name();
  r["decode_policy"] = decode_policy->name();
  r["data"] = c.data;
  r["shape"] = {{"layers", c.layers}, {"heads", c.heads}, {"kv_heads", c.kv_heads}, {"head_dim", c.head_dim},
                {"chunk", c.chunk}, {"block", c.block}, {"slots", c.slots}};
  r["prefill_seconds"] = prefill_seconds;
  r["prefill_tokens_per_s"] = static_cast<double>(context) / prefill_seconds;
  r["decode_tokens_per_s"] = static_cast<double>(c.decode_steps) / decode_seconds;
  r["density"] = selection.available_blocks > 0
                     ? static_cast<double>(selection.selected_blocks) / static_cast<double>(selection.available_blocks)
                     : 1.0;
  r["decode_density"] = decode_selection.available_blocks > 0
                            ? static_cast<double>(decode_selection.selected_blocks) /
                                  static_cast<double>(decode_selection.available_blocks)
                            : 1.0;
  // Host time in select_blocks; device scoring waits there for its masses, and so for the GPU work
  // queued before them (the previous chunk's attention), which this time therefore includes.
  r["select_seconds"] = selection.select_seconds;
  r["score_kernel_seconds"] = selection.score_kernel_seconds;  // device time of the scoring kernels
  r["scoring"] = selection.device_scored > 0 ? (selection.host_scored > 0 ? "device+host" : "device")
                                             : (selection.host_scored > 0 ? "host" : "none");
  r["selects_scored_on_device"] = selection.device_scored;
  r["selects_scored_on_host"] = selection.host_scored;
  r["bytes_h2d"] = prefill_h2d;  // all of the below
  r["bytes_h2d_slot_loads"] = prefill_stats.bytes_h2d - prefill_stats.bytes_h2d_keys;
  r["bytes_h2d_score_keys"] = prefill_stats.bytes_h2d_keys;
  r["bytes_h2d_score_other"] = selection.score_bytes_h2d;
  r["bytes_d2h"] = prefill_stats.bytes_d2h + selection.score_bytes_d2h;  // all of the below
  r["bytes_d2h_offloads"] = prefill_stats.bytes_d2h;
  r["bytes_d2h_score"] = selection.score_bytes_d2h;
  r["h2d_gb_per_s_effective"] = h2d_gbps;  // bytes copied host→device / prefill wall time
  r["peak_h2d_gb_per_s"] = peak_h2d;
  r["h2d_fraction_of_peak"] = peak_h2d > 0 ? h2d_gbps / peak_h2d : 0.0;
  // Decode is where loads dominate: its achieved bandwidth is the fair comparison with the peak.
  const double decode_h2d_gbps = static_cast<double>(decode_stats.bytes_h2d) / decode_seconds / 1e9;
  r["decode_bytes_h2d"] = decode_stats.bytes_h2d;
  r["decode_h2d_gb_per_s_effective"] = decode_h2d_gbps;
  r["decode_h2d_fraction_of_peak"] = peak_h2d > 0 ? decode_h2d_gbps / peak_h2d : 0.0;
  r["copy_wait_seconds"] = prefill_stats.wait_seconds;
  r["max_loads_in_flight"] = prefill_stats.max_loads_in_flight;
  r["needle_prefill_cosine"] = prefill_cosine;
  r["needle_decode_cosine"] = decode_cosine;
  r["needle_found"] = prefill_cosine >= 0.9 && decode_cosine >= 0.9;
  return r;
}

}  // namespace tessel::cli
