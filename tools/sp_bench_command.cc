// `tessel sp-bench`: sequence-parallel attention (Ulysses, Ring, USP) on the ranks mpirun started,
// against one rank: step time, the communication the ranks could not hide, bytes moved, and with
// --check the output against one rank's and against fp32 attention on the CPU.
//
//   mpirun -n 4 tessel sp-bench --seq 32760 --heads 12 --mask block_sparse --density 0.2
//   mpirun -n 2 tessel sp-bench --device cuda --dtype bf16 --mask radial --grid 21x30x52 --check
//
// Every rank builds the same global q, k, v (seeded) and the same global block mask; each layout
// of the world (every Ulysses x Ring split whose Ulysses degree divides the heads, or the one that
// --ulysses / --ring name) takes its shards, runs ParallelAttention and times it between barriers.
// One rank's time is world rank 0 running the same attention on the whole sequence alone. With
// --cfg-parallel the world is two CFG groups, each with the inputs of its guidance branch, and
// --check also gathers the two branches' outputs.
// Without mpirun on GPUs, start every process with TESSEL_RANK / TESSEL_WORLD_SIZE (parallel_flags.h).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "command.h"
#include "option_checks.h"
#include "parallel_flags.h"
#include "work_budget.h"
#include "tessel/core/error.h"
#include "tessel/core/random.h"
#include "tessel/kernels/attention.h"
#include "tessel/parallel/cfg_parallel.h"
#include "tessel/parallel/parallel_attention.h"
#include "tessel/parallel/sequence_sharding.h"
#include "tessel/sparse/estimators/topk_estimator.h"
#include "tessel/sparse/planners/static_patterns.h"
#include "tessel/sparse/planners/token_layout.h"

namespace tessel::cli {
namespace {

struct SpBenchOptions {
  int64_t batch = 1, seq = 8191, heads = 12, kv_heads = 0, head_dim = 128;
  std::string mask = "dense";  // dense | block_sparse | radial | dynamic_topk
  double density = 0.2;        // block_sparse: random blocks kept; dynamic_topk: the top-k ratio
  std::string grid;            // radial: FxHxW patches (sets --seq)
  int64_t block_q = 128, block_kv = 64;
  std::string device = "cpu";
  std::string dtype = "fp32";
  int64_t steps = 5, warmup = 1, threads = 0, seed = 0;
  bool check = false, json = false;
  bool all_rank_phases = false;  // every rank prints its own phase breakdown (stderr)
  BudgetFlags budget;
};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values.empty() ? 0.0 : values[values.size() / 2];
}

double rel_l2(const Tensor& a, const Tensor& b) {
  double diff = 0.0, norm = 0.0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = element_as_double(a, i), y = element_as_double(b, i);
    diff += (x - y) * (x - y);
    norm += y * y;
  }
  return norm > 0.0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

std::string fixed(double value, int decimals) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", decimals, value);
  return text;
}

// The patch grid of --grid "FxHxW" (the one grid parser: nothing after the last number).
TokenGrid parse_grid(const std::string& text) {
  if (std::count(text.begin(), text.end(), 'x') != 2) fail_argument("--grid", "FxHxW patches, each >= 1", quoted_excerpt(text));
  return parse_token_grid(text, "--grid");
}

// The global mask every rank builds alike (empty for dense). q and k: fp32 host copies.
std::optional<BlockMask> global_mask(const SpBenchOptions& o, const ExecContext& host, const Tensor& q, const Tensor& k) {
  if (o.mask == "dense") return std::nullopt;
  if (o.mask == "block_sparse")
    return BlockMask::random({1, o.heads, o.seq, o.seq, o.block_q, o.block_kv}, o.density, static_cast<uint64_t>(o.seed) + 9);
  if (o.mask == "radial") {
    StaticPlanRequest request;
    request.layout.grid = parse_grid(o.grid);
    request.block_q = o.block_q;
    request.block_kv = o.block_kv;
    return plan_static_pattern(StaticPattern{RadialPattern{}}, request).mask;
  }
  TopkEstimatorOptions topk;  // every block ranked: exactly the ratio of each row
  topk.topk_ratio = o.density;
  topk.similarity_threshold = -2.0;
  topk.rule = TopkRule::kReachTarget;
  topk.block_q = o.block_q;
  topk.block_kv = o.block_kv;
  return estimate_topk_mask(host, q, k, topk).mask;
}

// One rank's attention over the whole sequence (the kernels called directly).
void whole_attention(const ExecContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const BlockMaskView* mask,
                     const Tensor& out) {
  if (mask)
    block_sparse_attention_forward(ctx, q, k, v, *mask, out, TensorView{});
  else
    attention_forward(ctx, q, k, v, out, TensorView{});
}

std::vector<ParallelConfig> layouts_of(const SpBenchOptions& o, const ParallelFlags& flags, int world) {
  if (flags.ulysses * flags.ring > 1) {
    const ParallelConfig config = flags.config();
    if (config.world_size() != world)
      fail_argument("--ulysses x --ring (x 2 with --cfg-parallel)",
                    detail::concat("the ", world, " ranks of this run (launch them with mpirun or TESSEL_WORLD_SIZE)"),
                    detail::concat(config.world_size(), " (", flags.describe(), ")"));
    return {config};
  }
  const int cfg = flags.cfg_parallel ? 2 : 1;
  if (world % cfg != 0) fail_argument("--cfg-parallel", "an even number of ranks", world);
  std::vector<ParallelConfig> all;
  const int sequence = world / cfg;
  for (int ulysses = 1; ulysses <= sequence; ++ulysses) {
    if (sequence % ulysses != 0 || o.heads % ulysses != 0 || o.kv_heads % ulysses != 0) continue;
    ParallelConfig config;
    config.sp_ulysses_degree = ulysses;
    config.sp_ring_degree = sequence / ulysses;
    config.cfg_parallel_size = cfg;
    config.ring_sm_margin = flags.ring_sm_margin;
    if (ulysses > 1 && config.sp_ring_degree == 1) {
      config.ulysses_head_groups = flags.ulysses_head_groups;
      config.ulysses_sm_margin = flags.ulysses_sm_margin;
    }
    all.push_back(config);
  }
  flags.check_ring_sm_margin_used(std::any_of(all.begin(), all.end(), [](const ParallelConfig& c) { return c.sp_ring_degree > 1; }));
  flags.check_ulysses_head_groups_used(
      std::any_of(all.begin(), all.end(), [](const ParallelConfig& c) { return c.sp_ulysses_degree > 1 && c.sp_ring_degree == 1; }));
  return all;
}

// Memory and time of one rank (every rank builds the whole q, k, v and mask; world rank 0 also runs
// them alone and keeps the outputs): the fp32 inputs on the host, their --dtype copies and the
// attention's workspace on the device, the shards and the exchange buffers of a layout, the gathered outputs of --check, the mask's block indices (radial counted whole);
// the attention over all kept blocks, one rank's share per layout, and --check's fp32 reference on
// the host at the CPU's rate.
WorkEstimate sp_bench_estimate(const SpBenchOptions& o, const ParallelFlags& flags, const std::vector<ParallelConfig>& layouts,
                               double workspace_bytes, Device device) {
  const double element = o.dtype == "fp32" ? 4.0 : 2.0, branches = flags.cfg_parallel ? 2.0 : 1.0;
  const double q = static_cast<double>(o.batch * o.seq * o.heads * o.head_dim), kv = static_cast<double>(o.batch * o.seq * o.kv_heads * o.head_dim);
  const double density = o.mask == "block_sparse" || o.mask == "dynamic_topk" ? o.density : 1.0;
  const double blocks = static_cast<double>((o.seq + o.block_q - 1) / o.block_q) * static_cast<double>((o.seq + o.block_kv - 1) / o.block_kv);
  const double mask = o.mask == "dense" ? 0.0 : 4.0 * blocks * density * (o.mask == "radial" ? 1.0 : static_cast<double>(o.heads));
  // The layout of the fewest shards has the largest: q, k, v and out, and about as much again in
  // the exchange buffers (with Ulysses head groups these also stage k and v).
  int fewest = 0;
  for (const ParallelConfig& config : layouts)
    fewest = fewest == 0 ? config.sp_ulysses_degree * config.sp_ring_degree : std::min(fewest, config.sp_ulysses_degree * config.sp_ring_degree);
  const double staged_kv = flags.ulysses_head_groups > 1 ? 2.0 * kv : 0.0;
  const double exchange = element * (2.0 * (2.0 * q + 2.0 * kv) + 2.0 * staged_kv) / static_cast<double>(std::max(fewest, 1));
  const double inputs_host = 4.0 * (q + 2.0 * kv) + mask;
  const double inputs_device = element * (q + 2.0 * kv) + element * q + (device.is_cuda() ? mask : 0.0);
  const double gathered = o.check ? element * q * (2.0 + branches) : 0.0;
  const double root_outputs = branches * (element * q + (o.check ? 4.0 * q : 0.0)) + (o.check ? element * q * (1.0 + branches) : 0.0);
  WorkEstimate e;
  if (device.is_cuda()) {
    e.device_bytes = inputs_device + exchange + gathered + workspace_bytes;
    e.host_bytes = inputs_host + root_outputs;
  } else {
    e.host_bytes = inputs_host + inputs_device + exchange + gathered + workspace_bytes + root_outputs;
  }
  const double attention = 4.0 * static_cast<double>(o.batch) * static_cast<double>(o.seq) * static_cast<double>(o.seq) *
                           static_cast<double>(o.heads * o.head_dim) * density;
  const double passes = static_cast<double>(o.warmup + o.steps) + branches - 1.0;
  double per_rank = 0.0;
  for (const ParallelConfig& config : layouts)
    per_rank += static_cast<double>(o.warmup + o.steps + 1) * attention / static_cast<double>(config.sp_ulysses_degree * config.sp_ring_degree);
  e.flop = passes * attention + per_rank;
  if (o.check)  // the fp32 reference runs on the host: its seconds, counted at the device's rate
    e.flop += branches * attention * estimated_seconds(1.0, Device::cpu(), static_cast<int>(o.threads)) /
              estimated_seconds(1.0, device, static_cast<int>(o.threads));
  return e;
}

// One CFG branch's global q, k, v (fp32 on the host, and on the device in --dtype) and its mask;
// every rank builds them alike.
struct BranchInputs {
  Tensor q32, k32, v32, q, k, v;
  std::optional<BlockMask> mask;
  std::optional<BlockMask::DeviceCopy> device_mask;
  std::optional<BlockMaskView> mask_view;

  BranchInputs(const SpBenchOptions& o, int branch, DType dtype, Device device, const ExecContext& host) {
    const Shape q_shape{o.batch, o.seq, o.heads, o.head_dim}, kv_shape{o.batch, o.seq, o.kv_heads, o.head_dim};
    q32 = Tensor::empty(q_shape, DType::kF32);
    k32 = Tensor::empty(kv_shape, DType::kF32);
    v32 = Tensor::empty(kv_shape, DType::kF32);
    const uint64_t seed = static_cast<uint64_t>(o.seed) + 10 * static_cast<uint64_t>(branch);
    fill_normal(q32, seed + 1);
    fill_normal(k32, seed + 2);
    fill_uniform(v32, seed + 3);
    if (dtype != DType::kF32) {  // the fp32 reference sees the rounded inputs too
      q32 = q32.to(dtype).to(DType::kF32);
      k32 = k32.to(dtype).to(DType::kF32);
      v32 = v32.to(dtype).to(DType::kF32);
    }
    const auto on_device = [&](const Tensor& t) { return (dtype == DType::kF32 ? t.clone() : t.to(dtype)).to(device); };
    q = on_device(q32);
    k = on_device(k32);
    v = on_device(v32);
    mask = global_mask(o, host, q32, k32);
    if (mask) {
      if (device.is_cuda()) device_mask = mask->to_device(device);
      mask_view = device_mask ? device_mask->view() : mask->view();
    }
  }
  const BlockMaskView* view() const { return mask_view ? &*mask_view : nullptr; }
};

// One rank's output for a branch, in --dtype on the host, and the fp32 CPU attention of it.
struct OneRankResult {
  Tensor out, reference;
  double error_vs_fp32 = 0.0;
};

int run_sp_bench(SpBenchOptions o, const ParallelFlags& flags) {
  if (o.kv_heads == 0) o.kv_heads = o.heads;
  if (o.heads % o.kv_heads != 0) fail_argument("--kv-heads", detail::concat("a divisor of --heads ", o.heads), o.kv_heads);
  if (o.mask == "radial") {
    if (o.grid.empty()) fail_argument("--grid", "FxHxW patches with --mask radial", "none");
    o.seq = parse_grid(o.grid).numel();
  }
  const DType dtype = parse_dtype(o.dtype);
  ParallelRun run{ParallelRun::kWholeWorld};
  // GPUs: each process on its local GPU (mpirun's or TESSEL_LOCAL_RANK), unless --device names one.
  Device device = budget_device(o.budget, o.device, "--device");
  if (device.is_cuda() && o.device == "cuda") device = Device::cuda(run.local_rank());
  if (device.is_cpu() && dtype != DType::kF32) fail_argument("--dtype", "fp32 on the CPU", o.dtype);
  ExecContext ctx;
  ctx.device = device;
  ctx.num_threads = static_cast<int>(o.threads);
  ExecContext host;
  host.num_threads = ctx.num_threads;
  const std::vector<ParallelConfig> layouts = layouts_of(o, flags, run.world_size());
  const size_t workspace_bytes = attention_workspace_bytes(ctx, device, {o.batch, o.seq, o.seq, o.heads, o.kv_heads, o.head_dim},
                                                           o.mask == "dense" ? 0 : o.block_kv);
  const std::string shape_flags = detail::concat("--batch ", o.batch, " --seq ", o.seq, " --heads ", o.heads, " --kv-heads ", o.kv_heads,
                                                 " --head-dim ", o.head_dim, " --steps ", o.steps, " --warmup ", o.warmup);
  const WorkEstimate estimate = sp_bench_estimate(o, flags, layouts, static_cast<double>(workspace_bytes), device);
  if (!check_work_budget(estimate, o.budget, device,
                         static_cast<int>(o.threads), shape_flags,
                         run.world_size() > 1 ? detail::concat("sp-bench, per rank of ", run.world_size()) : std::string("sp-bench")))
    return 0;
  std::unique_ptr<Communicator> world = run.device_world(ctx, device);
  const Shape q_shape{o.batch, o.seq, o.heads, o.head_dim};
  Workspace workspace;
  workspace.reserve(workspace_bytes);
  ctx = ctx.with_workspace(&workspace);

  // One rank: world rank 0 alone, timed on branch 0 (the other ranks wait at the barriers).
  const int branches = flags.cfg_parallel ? 2 : 1;
  std::vector<OneRankResult> one_rank(static_cast<size_t>(branches));
  std::vector<double> one_rank_s;
  for (int branch = 0; branch < branches; ++branch) {
    if (!run.is_root()) continue;
    const BranchInputs in(o, branch, dtype, device, host);
    Tensor out = Tensor::empty(q_shape, dtype, device);
    for (int64_t step = 0; step < (branch == 0 ? o.warmup + o.steps : 1); ++step) {
      const auto start = std::chrono::steady_clock::now();
      whole_attention(ctx, in.q, in.k, in.v, in.view(), out);
      world->barrier(ctx);  // on CUDA: the stream's work is done
      if (branch == 0 && step >= o.warmup)
        one_rank_s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    OneRankResult& result = one_rank[static_cast<size_t>(branch)];
    result.out = out.to(Device::cpu());
    if (o.check) {
      result.reference = Tensor::empty(q_shape, DType::kF32);
      const std::optional<BlockMaskView> host_mask = in.mask ? std::optional<BlockMaskView>(in.mask->view()) : std::nullopt;
      whole_attention(host, in.q32, in.k32, in.v32, host_mask ? &*host_mask : nullptr, result.reference);
      result.error_vs_fp32 = rel_l2(result.out, result.reference);
    }
  }
  if (!run.is_root())
    for (int64_t step = 0; step < o.warmup + o.steps + branches - 1; ++step) world->barrier(ctx);
  const double one_rank_time = median(one_rank_s);

  nlohmann::json rows = nlohmann::json::array();
  bool all_pass = true;
  double density = 1.0;
  for (const ParallelConfig& config : layouts) {
    const ParallelGroups groups = initialize_parallel_groups(*world, config);
    const BranchInputs in(o, groups.coordinates.cfg, dtype, device, host);
    if (in.mask) density = in.mask->density();
    ParallelAttentionShape shape{o.batch, o.seq, o.heads, o.kv_heads, o.head_dim, dtype, device, in.mask ? o.block_q : 0,
                                 in.mask ? o.block_kv : 0};
    ParallelAttention attention(groups, shape);
    const SequenceSharding& sharding = attention.sharding();
    const int64_t part = groups.coordinates.sequence;
    Tensor q_shard = Tensor::empty({o.batch, sharding.shard_length, o.heads, o.head_dim}, dtype, device);
    Tensor k_shard = Tensor::empty({o.batch, sharding.shard_length, o.kv_heads, o.head_dim}, dtype, device);
    Tensor v_shard = Tensor::empty(k_shard.shape(), dtype, device), out_shard = Tensor::empty(q_shard.shape(), dtype, device);
    take_shard(ctx, sharding, part, in.q, q_shard);
    take_shard(ctx, sharding, part, in.k, k_shard);
    take_shard(ctx, sharding, part, in.v, v_shard);
    const std::shared_ptr<const ParallelMaskPlan> plan = in.mask ? attention.plan_mask(*in.mask) : nullptr;
    std::vector<double> step_s;
    double comm_s = 0.0, comm_bytes = 0.0;
    // Phase by phase (host enqueue time and device time) in one extra step after the timed ones,
    // so that the events do not weigh on the timed steps.
    PhaseTimeline timeline(device);
    for (int64_t step = 0; step < o.warmup + o.steps + 1; ++step) {
      const bool profiled = step == o.warmup + o.steps;
      attention.set_timeline(profiled ? &timeline : nullptr);
      world->barrier(ctx);
      run.meter().reset();
      const auto start = std::chrono::steady_clock::now();
      if (profiled) timeline.begin(ctx);
      attention.forward(ctx, q_shard, k_shard, v_shard, out_shard, plan.get());
      const CommunicationMeter during = run.meter();
      world->barrier(ctx);
      if (step < o.warmup || profiled) continue;
      step_s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      comm_s += during.seconds;
      comm_bytes += during.bytes;
    }
    attention.set_timeline(nullptr);
    nlohmann::json phases = nlohmann::json::array();
    double exposed_comm_ms = 0.0;
    for (const PhaseTimeline::Phase& phase : timeline.phases()) {
      phases.push_back({{"phase", phase.name}, {"host_ms", phase.host_ms}, {"device_ms", phase.device_ms}});
      if (phase.name == "ulysses all_to_all" || phase.name == "ring exchange wait") exposed_comm_ms += phase.device_ms;
    }
    if (o.all_rank_phases) {
      std::string line = detail::concat("sp-bench rank ", run.world_rank(), " (ulysses ", config.sp_ulysses_degree, " ring ",
                                        config.sp_ring_degree, " cfg ", config.cfg_parallel_size, ") phases:");
      for (const auto& phase : phases)
        line += detail::concat(" ", phase["phase"].get<std::string>(), " ", fixed(phase["device_ms"].get<double>(), 3), " ms;");
      std::fprintf(stderr, "%s\n", line.c_str());
    }
    const double step = median(step_s), steps = static_cast<double>(o.steps);
    nlohmann::json row = {{"ulysses", config.sp_ulysses_degree},
                          {"ulysses_head_groups", config.ulysses_head_groups},
                          {"ulysses_sm_margin", config.ulysses_sm_margin},
                          {"ring", config.sp_ring_degree},
                          {"cfg", config.cfg_parallel_size},
                          {"strategy", std::string(parallel_strategy_name(attention.strategy()))},
                          {"step_ms", 1e3 * step},
                          {"one_rank_ms", 1e3 * one_rank_time},
                          {"speedup", step > 0 ? one_rank_time / step : 0.0},
                          // CPU: host time blocked in calls; CUDA: the all-to-alls' (with head groups:
                          // the waits for them) and the exposed ring exchanges' device time in the
                          // profiled step.
                          {"comm_ms", device.is_cpu() ? 1e3 * comm_s / steps : exposed_comm_ms},
                          {"comm_share", step > 0 ? (device.is_cpu() ? comm_s / steps : 1e-3 * exposed_comm_ms) / step : 0.0},
                          {"sent_mb", comm_bytes / steps / 1e6},
                          {"phases", phases}};
    if (o.check) {
      // The whole output of each branch: the sequence shards gathered, then the CFG branches.
      Tensor gathered = Tensor::empty(q_shape, dtype, device);
      Tensor staging = Tensor::empty({static_cast<int64_t>(gather_staging_bytes(sharding, out_shard))}, DType::kU8, device);
      gather_shards(ctx, *groups.sequence, sharding, out_shard, staging, gathered);
      Shape both_shape = q_shape;
      both_shape.insert(both_shape.begin(), groups.cfg->size());
      Tensor both = Tensor::empty(both_shape, dtype, device);
      gather_cfg_branches(ctx, *groups.cfg, gathered, both);
      world->barrier(ctx);
      if (run.is_root()) {
        const Tensor parallel_host = both.to(Device::cpu());
        double vs_one_rank = 0.0, vs_fp32 = 0.0, one_rank_error = 0.0;
        bool pass = true;
        for (int branch = 0; branch < groups.cfg->size(); ++branch) {
          const OneRankResult& expected = one_rank[static_cast<size_t>(branch)];
          const Tensor branch_out = Tensor::empty(q_shape, dtype);
          std::memcpy(branch_out.data(), static_cast<const char*>(parallel_host.data()) + branch * branch_out.nbytes(), branch_out.nbytes());
          const double error = rel_l2(branch_out, expected.reference);
          vs_one_rank = std::max(vs_one_rank, rel_l2(branch_out, expected.out));
          vs_fp32 = std::max(vs_fp32, error);
          one_rank_error = std::max(one_rank_error, expected.error_vs_fp32);
          // Within 2x one rank's own error against fp32 (fp32 runs: within fp32 rounding).
          pass = pass && error <= std::max(2.0 * expected.error_vs_fp32, 1e-5);
        }
        all_pass = all_pass && pass;
        row["rel_l2_vs_one_rank"] = vs_one_rank;
        row["rel_l2_vs_fp32"] = vs_fp32;
        row["one_rank_rel_l2_vs_fp32"] = one_rank_error;
        row["pass"] = pass;
      }
    }
    rows.push_back(row);
  }
  if (!run.is_root()) return 0;
  const nlohmann::json report = {{"ranks", run.world_size()}, {"device", device.str()}, {"engine", world->engine()},
                                 {"dtype", o.dtype},          {"batch", o.batch},        {"seq", o.seq},
                                 {"heads", o.heads},          {"kv_heads", o.kv_heads},  {"head_dim", o.head_dim},
                                 {"mask", o.mask},            {"density", density},
                                 {"layouts", rows},
                                 // This rank's (world rank 0's) peak against its estimate.
                                 {"estimated_host_memory_bytes", estimate.host_bytes},
                                 {"peak_host_memory_bytes", peak_host_memory_bytes()}};
  if (o.json) {
    std::cout << report.dump() << "\n";
  } else {
    std::printf("sp-bench: %d ranks (%s, %s), %s, B=%lld S=%lld H=%lld/%lld D=%lld, mask %s (density %.3f); one rank %.3f ms\n",
                run.world_size(), device.str().c_str(), world->engine().c_str(), o.dtype.c_str(), static_cast<long long>(o.batch),
                static_cast<long long>(o.seq), static_cast<long long>(o.heads), static_cast<long long>(o.kv_heads),
                static_cast<long long>(o.head_dim), o.mask.c_str(), density, 1e3 * one_rank_time);
    std::printf("rank 0: peak host memory %s (estimated %s)\n", format_bytes(peak_host_memory_bytes()).c_str(),
                format_bytes(estimate.host_bytes).c_str());
    std::printf("%-8s %-5s %-4s %-8s %10s %8s %10s %7s %10s%s\n", "ulysses", "ring", "cfg", "strategy", "step ms", "speedup", "comm ms", "comm %",
                "sent MB", o.check ? "  rel-L2 vs 1 rank  vs fp32 (1 rank)  pass" : "");
    for (const auto& row : rows) {
      const std::string comm = row["comm_ms"].is_null() ? "n/a" : fixed(row["comm_ms"].get<double>(), 3);
      const std::string share = row["comm_share"].is_null() ? "n/a" : fixed(100.0 * row["comm_share"].get<double>(), 1);
      std::printf("%-8d %-5d %-4d %-8s %10.3f %8.2f %10s %7s %10.2f", row["ulysses"].get<int>(), row["ring"].get<int>(), row["cfg"].get<int>(),
                  row["strategy"].get<std::string>().c_str(), row["step_ms"].get<double>(), row["speedup"].get<double>(), comm.c_str(),
                  share.c_str(), row["sent_mb"].get<double>());
      if (o.check)
        std::printf("  %.2e  %.2e (%.2e)  %s", row["rel_l2_vs_one_rank"].get<double>(), row["rel_l2_vs_fp32"].get<double>(),
                    row["one_rank_rel_l2_vs_fp32"].get<double>(), row["pass"].get<bool>() ? "ok" : "FAIL");
      std::printf("\n");
      std::string breakdown;
      for (const auto& phase : row["phases"])
        breakdown += detail::concat(breakdown.empty() ? "" : " | ", phase["phase"].get<std::string>(), " ",
                                    fixed(phase["device_ms"].get<double>(), 3), " ms (host ", fixed(phase["host_ms"].get<double>(), 3), ")");
      if (!breakdown.empty()) std::printf("    phases: %s\n", breakdown.c_str());
    }
  }
  return all_pass ? 0 : 1;
}

CommandRegistration registration{
    "sp-bench", "Time sequence-parallel attention (Ulysses / Ring / USP) on the ranks mpirun started, against one rank",
    [](CLI::App& app) {
      auto options = std::make_shared<SpBenchOptions>();
      auto flags = std::make_shared<ParallelFlags>();
      app.add_option("--batch", options->batch, "batch")->capture_default_str()->check(integer_in(1, 1024));
      app.add_option("--seq", options->seq, "global tokens")->capture_default_str()->check(integer_in(1, 1 << 24));
      app.add_option("--heads", options->heads, "query heads")->capture_default_str()->check(integer_in(1, 1024));
      app.add_option("--kv-heads", options->kv_heads, "key/value heads (default: --heads)")->check(integer_in(1, 1024));
      app.add_option("--head-dim", options->head_dim, "head dimension")->capture_default_str()->check(integer_in(1, 1024));
      app.add_option("--mask", options->mask, "dense, block_sparse (random blocks), radial (needs --grid) or dynamic_topk")
          ->capture_default_str()
          ->check(one_of({"dense", "block_sparse", "radial", "dynamic_topk"}));
      CLI::Option* density = app.add_option("--density", options->density, "block_sparse: kept fraction; dynamic_topk: top-k ratio")
          ->capture_default_str()
          ->check(number_in(0.0, 1.0, Bounds::kOpenLow));
      CLI::Option* grid = app.add_option("--grid", options->grid, "radial: the latent patch grid FxHxW (sets --seq)");
      app.add_option("--block-q", options->block_q, "query block of the masks")->capture_default_str()->check(integer_in(1, 4096));
      app.add_option("--block-kv", options->block_kv, "key block of the masks")->capture_default_str()->check(integer_in(1, 4096));
      app.add_option("--device", options->device, "cpu (MPI), cuda (NCCL; rank r of a node on its local GPU r) or cuda:N")
          ->capture_default_str();
      app.add_option("--dtype", options->dtype, "fp32, or on CUDA bf16 / fp16")->capture_default_str()->check(one_of({"fp32", "bf16", "fp16"}));
      app.add_option("--steps", options->steps, "timed steps (the median is reported)")->capture_default_str()->check(integer_in(1, 10000));
      app.add_option("--warmup", options->warmup, "untimed steps first")->capture_default_str()->check(integer_in(0, 10000));
      app.add_option("--threads", options->threads, "CPU threads per rank (default: all)")->check(integer_in(1, 4096));
      app.add_option("--seed", options->seed, "seed of q, k, v and the random mask")->capture_default_str()->check(integer_in(0, INT64_MAX));
      app.add_flag("--check", options->check, "compare every layout's output with one rank's and with fp32 on the CPU (exit 1 on a mismatch)");
      app.add_flag("--json", options->json, "print one JSON object instead of a table");
      app.add_flag("--all-rank-phases", options->all_rank_phases,
                   "every rank prints its own phase breakdown to stderr (load imbalance between ranks)");
      add_parallel_flags(app, *flags);
      add_budget_flags(app, options->budget);
      return CommandRunner([options, flags, grid, density] {
        check_applies(grid, options->mask == "radial", "--mask radial");
        check_applies(density, options->mask == "block_sparse" || options->mask == "dynamic_topk", "--mask block_sparse or dynamic_topk");
        return run_sp_bench(*options, *flags);
      });
    }};

}  // namespace
}  // namespace tessel::cli
