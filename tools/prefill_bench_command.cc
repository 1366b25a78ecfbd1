// `tessel prefill-bench`: long-context chunked prefill + decode with the KV cache offloaded to the
// host, per context length: prefill and decode tokens/s, selected density, bytes copied, achieved
// host→device bandwidth against the measured peak, and the needle result.
#include <algorithm>
#include <iostream>
#include <sstream>

#include "command.h"
#include "option_checks.h"
#include "work_budget.h"
#include "prefill_bench.h"
#include "tessel/core/device.h"
#include "tessel/core/error.h"

namespace tessel::cli {
namespace {

std::vector<int64_t> parse_contexts(const std::string& list) {
  std::vector<int64_t> contexts;
  std::stringstream in(list);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    int64_t value = 0;
    try {
      value = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size() || value < 1 || value > kMaxTokens)
      fail_argument("--context", detail::concat("comma-separated token counts in [1, ", kMaxTokens, "]"), quoted_excerpt(list));
    contexts.push_back(value);
  }
  if (contexts.empty() || list.back() == ',') fail_argument("--context", "comma-separated token counts", quoted_excerpt(list));
  return contexts;
}

// Relations between the options, checked before any work and whatever path the run would take (a
// small context never reaches some of them).
void check_prefill_config(const PrefillBenchConfig& c, bool stride_given) {
  require_multiple("--heads", c.heads, "--kv-heads", c.kv_heads);
  require_multiple("--chunk", c.chunk, "--block", c.block);
  if (c.policy == "xattn" || c.policy == "xattention-bsa" || stride_given) require_multiple("--block", c.block, "--stride", c.stride);
  if (c.scoring == "device" && !c.device.is_cuda())
    fail_argument("--scoring", "auto or host on " + c.device.str() + " (device scoring needs a CUDA device)", "'device'");
  if (c.cpu_copy_bandwidth != 0.0 && c.cpu_copy_bandwidth < 0.1)
    fail_argument("--cpu-copy-bandwidth", "0 (plain memcpy) or at least 0.1 GB/s", c.cpu_copy_bandwidth);
}

// What the longest context holds: the offloaded KV cache of every layer on the host and every
// chunk's q, k, v made up front, the fp32 staging of one chunk, and on a CUDA device the ring of
// --slots KV blocks per layer beside a chunk's q, k, v and output. The work: every context's causal
// prefill (half of 4 x context^2 x heads x head-dim per layer; the selecting policies at the
// density the data keeps, counted whole) and its decode steps over the whole context.
WorkEstimate prefill_estimate(const PrefillBenchConfig& c) {
  const int64_t longest = *std::max_element(c.contexts.begin(), c.contexts.end());
  const double element = static_cast<double>(dtype_size(c.dtype)), head_dim = double(c.head_dim), layers = double(c.layers);
  const double cache = layers * 2.0 * double(longest + c.decode_steps + 2 * c.block) * double(c.kv_heads) * head_dim * element;
  const double inputs = double(longest) * double(c.heads + 2 * c.kv_heads) * head_dim * element;
  const double chunk = double(c.chunk) * double(c.heads + 2 * c.kv_heads) * head_dim;
  const double ring = layers * double(c.slots) * double(c.block) * 2.0 * double(c.kv_heads) * head_dim * element;
  WorkEstimate e;
  e.host_bytes = cache + inputs + 4.0 * chunk + (c.device.is_cuda() ? 0.0 : ring);
  e.device_bytes = c.device.is_cuda() ? ring + chunk * element + double(c.chunk) * double(c.heads) * head_dim * element : 0.0;
  for (int64_t context : c.contexts)
    e.flop += layers * double(c.heads) * head_dim * (2.0 * double(context) * double(context) + 4.0 * double(c.decode_steps) * double(context));
  return e;
}

std::string prefill_shape_flags(const PrefillBenchConfig& c) {
  std::string contexts;
  for (int64_t context : c.contexts) contexts += (contexts.empty() ? "" : ",") + std::to_string(context);
  return detail::concat("--context ", contexts, " --layers ", c.layers, " --heads ", c.heads, " --kv-heads ", c.kv_heads,
                        " --head-dim ", c.head_dim, " --decode-steps ", c.decode_steps);
}

CommandRegistration registration{
    "prefill-bench", "Chunked prefill/decode with offloaded KV and sparse block selection", [](CLI::App& app) {
      auto config = std::make_shared<PrefillBenchConfig>();
      auto contexts = std::make_shared<std::string>();
      auto device = std::make_shared<std::string>();
      auto dtype = std::make_shared<std::string>();
      auto json = std::make_shared<bool>(false);
      const CLI::Validator count = integer_in(1, 1 << 20);
      app.add_option("--context", *contexts, "context lengths, e.g. 32768,65536,131072 (default: those on cuda, 4096 on cpu)")
          ->check(parsed_by("comma-separated token counts", [](const std::string& text) { parse_contexts(text); }));
      app.add_option("--chunk", config->chunk, "prefill chunk tokens (a multiple of --block)")->capture_default_str()->check(count);
      app.add_option("--block", config->block, "KV block tokens")->capture_default_str()->check(count);
      app.add_option("--slots", config->slots, "device ring slots")->capture_default_str()->check(integer_in(1, 1024));
      app.add_option("--layers", config->layers, "attention layers")->capture_default_str()->check(integer_in(1, 1024));
      app.add_option("--heads", config->heads, "query heads")->capture_default_str()->check(integer_in(1, kMaxHeads));
      app.add_option("--kv-heads", config->kv_heads, "key/value heads")->capture_default_str()->check(integer_in(1, kMaxHeads));
      app.add_option("--head-dim", config->head_dim, "head dimension")->capture_default_str()->check(integer_in(1, kMaxHeadDim));
      app.add_option("--decode-steps", config->decode_steps, "decoded tokens")->capture_default_str()->check(count);
      app.add_option("--policy", config->policy, "prefill policy: full, xattn, quest")
          ->capture_default_str()
          ->check(one_of({"full", "xattn", "xattention-bsa", "quest"}));
      app.add_option("--decode-policy", config->decode_policy,
                     "decode policy: full, quest, topk (default: --policy when it decodes, else full)")
          ->check(one_of({"full", "quest", "topk"}));
      app.add_option("--threshold", config->threshold, "XAttention threshold tau in (0, 1]")
          ->capture_default_str()
          ->check(number_in(0.0, 1.0, Bounds::kOpenLow));
      auto* stride = app.add_option("--stride", config->stride, "XAttention stride (--block a multiple of it)")
                         ->capture_default_str()
                         ->check(integer_in(1, 64));
      app.add_option("--scoring", config->scoring,
                     "XAttention scoring: auto (device when supported), device (or fail), host")
          ->capture_default_str()
          ->check(one_of({"auto", "device", "host"}));
      app.add_option("--top-k", config->top_k, "Quest / Top-K block budget")->capture_default_str()->check(count);
      app.add_option("--data", config->data, "synthetic inputs: clustered or random")
          ->capture_default_str()
          ->check(one_of({"clustered", "random"}));
      app.add_option("--cpu-copy-bandwidth", config->cpu_copy_bandwidth,
                     "CPU engine: simulated host-device link in GB/s (0 = plain memcpy, else >= 0.1)")
          ->capture_default_str()
          ->check(number_in(0.0, 1e6));
      app.add_option("--device", *device, "cpu or cuda[:N] (default: cuda when a GPU is present)")->check(device_name());
      app.add_option("--dtype", *dtype, "fp32, fp16 or bf16 (default: bf16 on cuda, fp32 on cpu)")->check(attention_dtype_name());
      app.add_option("--seed", config->seed, "data seed")->capture_default_str()->check(integer_in(0, INT64_MAX));
      app.add_flag("--json", *json, "print JSON instead of a table");
      auto budget = std::make_shared<BudgetFlags>();
      add_budget_flags(app, *budget);
      return CommandRunner([=] {
        config->device = device->empty() ? (cuda_available() ? Device::cuda(0) : Device::cpu()) : budget_device(*budget, *device, "--device");
        config->dtype = dtype->empty() ? (config->device.is_cpu() ? DType::kF32 : DType::kBF16) : parse_dtype(*dtype);
        config->contexts = contexts->empty() ? (config->device.is_cpu() ? std::vector<int64_t>{4096}
                                                                         : std::vector<int64_t>{32768, 65536, 131072})
                                             : parse_contexts(*contexts);
        check_prefill_config(*config, stride->count() > 0);
        const WorkEstimate estimate = prefill_estimate(*config);
        if (!check_work_budget(estimate, *budget, config->device, 0, prefill_shape_flags(*config), "prefill-bench")) return 0;
        nlohmann::json results = nlohmann::json::array();
        // H2D GB: everything prefill copied host→device; "keys" the part that was history K copied
        // for device scoring. select s: host time in select_blocks (see prefill_bench.cc).
        if (!*json)
          std::cout << "context  policy  prefill tok/s  decode tok/s  density  select s  scoring  kernel s  H2D GB"
                       "  keys GB  eff GB/s  peak GB/s  needle\n";
        for (int64_t context : config->contexts) {
          nlohmann::json r = run_prefill_bench(*config, context);
          r["estimated_host_memory_bytes"] = estimate.host_bytes;  // the longest context's, beside the peak so far
          r["peak_host_memory_bytes"] = peak_host_memory_bytes();
          if (!*json) {
            std::printf("%7lld  %-6s  %13.0f  %12.1f  %7.3f  %8.3f  %-7s  %8.4f  %6.2f  %7.2f  %8.2f  %9.2f  %s\n",
                        static_cast<long long>(context), r["policy"].get<std::string>().c_str(),
                        r["prefill_tokens_per_s"].get<double>(), r["decode_tokens_per_s"].get<double>(),
                        r["density"].get<double>(), r["select_seconds"].get<double>(),
                        r["scoring"].get<std::string>().c_str(), r["score_kernel_seconds"].get<double>(),
                        r["bytes_h2d"].get<double>() / 1e9, r["bytes_h2d_score_keys"].get<double>() / 1e9,
                        r["h2d_gb_per_s_effective"].get<double>(), r["peak_h2d_gb_per_s"].get<double>(),
                        r["needle_found"].get<bool>() ? "found" : "MISSED");
            std::fflush(stdout);
          }
          results.push_back(std::move(r));
        }
        if (*json) std::cout << results.dump(2) << "\n";
        return 0;
      });
    }};

}  // namespace
}  // namespace tessel::cli
