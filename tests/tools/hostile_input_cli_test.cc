// Hostile input through the `tessel` binary, one table per class of failure seen before the
// validation layer existed: inputs that crashed, hung, were silently accepted (or gave a
// meaningless number) or failed with a vague message. Every case must now fail fast with a message
// naming the input, never by a signal, a timeout or a long echo of the input; and the valid
// neighbours of those inputs must still run.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "tessel/core/io/safetensors.h"
#include "tessel/core/tensor.h"
#include "hostile_text.h"

namespace tessel {
namespace {

namespace fs = std::filesystem;

constexpr int kTimeoutSeconds = 60;
constexpr int kTimedOut = 124;        // the exit status of timeout(1)
constexpr size_t kMaxMessageChars = 2000;

struct CommandOutput {
  int status = -1;  // exit status; -1 when killed by a signal
  std::string out;
};

fs::path test_dir() {
  const fs::path dir = fs::path(::testing::TempDir()) / ("tessel_hostile_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir;
}

std::string quote(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Runs the tessel binary under timeout(1) with `args` (already shell-quoted) and extra environment.
CommandOutput run_tessel(const std::string& args, const std::string& env = "") {
  const fs::path log = test_dir() / "output.txt";
  const std::string command = "timeout " + std::to_string(kTimeoutSeconds) +
                              " env -u TESSEL_SPARSE_ATTN_BACKEND -u TESSEL_SPARSE_ATTN_CONFIG -u TESSEL_PLUGIN_PATH " + env + " " +
                              quote(std::string(TESSEL_BINARY_DIR) + "/bin/tessel") + " " + args + " > " +
                              quote(log.string()) + " 2>&1";
  const int status = std::system(command.c_str());
  std::ifstream in(log);
  std::stringstream text;
  text << in.rdbuf();
  return CommandOutput{WIFEXITED(status) ? WEXITSTATUS(status) : -1, text.str()};
}

// In a sanitizer build a memory error aborts with a non-zero status, which would pass for a
// refusal: look for the report itself.
void expect_no_sanitizer_report(const std::string& name, const std::string& out) {
  for (const char* marker : {"AddressSanitizer", "LeakSanitizer", "runtime error:"})
    EXPECT_EQ(out.find(marker), std::string::npos) << name << ": " << out.substr(0, 2000);
}

struct ErrorCase {
  const char* name;
  std::string args;
  std::vector<std::string> fragments;  // every one must appear in the message
  std::string env = "";
};

void expect_clear_errors(const std::vector<ErrorCase>& cases) {
  for (const ErrorCase& c : cases) {
    const CommandOutput r = run_tessel(c.args, c.env);
    EXPECT_NE(r.status, kTimedOut) << c.name << ": hung";
    EXPECT_NE(r.status, -1) << c.name << ": killed by a signal";
    EXPECT_NE(r.status, 0) << c.name << ": accepted: " << r.out.substr(0, 500);
    EXPECT_LT(r.out.size(), kMaxMessageChars) << c.name << ": message too long: " << r.out.substr(0, 500);
    EXPECT_EQ(r.out.find("unexpected error"), std::string::npos) << c.name << ": " << r.out;
    EXPECT_EQ(r.out.find("bad_alloc"), std::string::npos) << c.name << ": " << r.out;
    expect_no_sanitizer_report(c.name, r.out);
    for (const std::string& fragment : c.fragments)
      EXPECT_NE(r.out.find(fragment), std::string::npos) << c.name << ": '" << fragment << "' not in: " << r.out.substr(0, 800);
  }
}

using testing::nested;

// A safetensors file with `header` as its header text and `data_bytes` zero bytes of data.
std::string raw_safetensors(const std::string& name, const std::string& header, size_t data_bytes) {
  const std::string path = (test_dir() / name).string();
  std::ofstream out(path, std::ios::binary);
  const uint64_t length = header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((length >> (8 * i)) & 0xff));
  out << header << std::string(data_bytes, '\0');
  return path;
}

// q, k, v of shape (1, 64, 2, 16) with `poison` written at element 5 of tensor `poisoned`.
std::string qkv_file(const std::string& name, const std::string& poisoned, float poison) {
  std::vector<Tensor> tensors;
  std::vector<std::pair<std::string, TensorView>> views;
  for (const char* tensor : {"q", "k", "v"}) {
    Tensor t = Tensor::empty({1, 64, 2, 16}, DType::kF32);
    for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = std::sin(0.37f * static_cast<float>(i) + tensor[0]);
    if (poisoned == tensor) t.data_as<float>()[5] = poison;
    tensors.push_back(std::move(t));
  }
  const std::string path = (test_dir() / name).string();
  write_safetensors(path, {{"q", tensors[0].view()}, {"k", tensors[1].view()}, {"v", tensors[2].view()}});
  return path;
}

// `base` with each "--option value" of `extra` replacing the same option's value in `base` (CLI11
// refuses an option given twice).
std::string with(std::string base, const std::string& extra) {
  std::istringstream words(extra);
  std::string word;
  while (words >> word) {
    if (word.rfind("--", 0) != 0) continue;
    const size_t at = base.find(" " + word + " ");
    if (at == std::string::npos) continue;
    const size_t value_end = base.find(' ', at + word.size() + 2);
    base.erase(at, value_end == std::string::npos ? std::string::npos : value_end - at);
  }
  return base + " " + extra;
}

const std::string kBench = "bench --device cpu --dtype fp32 --heads 2 --head-dim 32 --seq 128 --density 1,0.5 --iters 1 --warmup 0 "
                           "--block-q 32 --block-kv 32";
const std::string kEval = "eval --grid 2x8x8 --heads 2 --head-dim 32 --block-q 32 --block-kv 16 --methods random,threshold "
                          "--topk 0.3 --threshold 0.9 --json";
const std::string kPrefill = "prefill-bench --device cpu --context 1024 --chunk 256 --block 128 --slots 2 --heads 4 --kv-heads 2 "
                             "--head-dim 32 --decode-steps 2 --json";

// Inputs that crashed: deep JSON (the error path printed the value back recursively), SIGFPE.
TEST(HostileInputCli, FormerCrashesAreClearErrors) {
  // A command-line argument is at most 128 KiB (execve); a file holds the deeper text.
  const std::string deep_config = nested(8000, "{\"options\":", "{}", "}");
  const std::string deep_config_file = (test_dir() / "deep.json").string();
  std::ofstream(deep_config_file) << nested(80000, "{\"options\":", "{}", "}");
  const std::string deep_shape = raw_safetensors(
      "deep_shape.safetensors", "{\"q\": {\"dtype\": \"F32\", \"shape\": " + nested(100000, "[", "1", "]") + ", \"data_offsets\": [0, 4]}}", 4);
  const std::string deep_dtype = raw_safetensors(
      "deep_dtype.safetensors", "{\"q\": {\"dtype\": " + nested(100000, "[", "1", "]") + ", \"shape\": [1], \"data_offsets\": [0, 4]}}", 4);
  expect_clear_errors({
      {"nested --sparse-attn-config", with(kBench, "--steps 1 --sparse-attn-config ") + quote(deep_config),
       {"sparse_attn config", "nested deeper than"}},
      {"nested config file", with(kBench, "--steps 1 --sparse-attn-config @") + quote(deep_config_file), {"nested deeper than"}},
      {"nested config in mask", "mask --pattern radial --grid 2x8x8 --png x.png --sparse-attn-config " + quote(deep_config),
       {"nested deeper than"}},
      {"nested config from the environment", with(kBench, "--steps 1"), {"nested deeper than"},
       "TESSEL_SPARSE_ATTN_CONFIG=" + quote(deep_config)},
      {"nested safetensors shape", "eval --qkv " + quote(deep_shape), {"deep_shape.safetensors: header", "nested deeper than"}},
      {"nested safetensors dtype", "eval --qkv " + quote(deep_dtype), {"deep_dtype.safetensors: header", "nested deeper than"}},
      {"prefill-bench --block 0", with(kPrefill, "--block 0"), {"--block", "[1, 1048576]", "'0'"}},
  });
}

// Inputs that hung or asked for unbounded memory.
TEST(HostileInputCli, FormerHangsAreRefusedUpFront) {
  expect_clear_errors({
      {"config from /dev/zero", with(kBench, "--steps 1 --sparse-attn-config @/dev/zero"), {"/dev/zero", "a character device"}},
      {"config from a directory", with(kBench, "--steps 1 --sparse-attn-config @/tmp"), {"'/tmp'", "a directory"}},
      {"safetensors from /dev/zero", "eval --qkv /dev/zero", {"/dev/zero", "a character device"}},
      {"tiny simulated bandwidth", with(kPrefill, "--cpu-copy-bandwidth 1e-9"), {"--cpu-copy-bandwidth", "at least 0.1 GB/s"}},
      {"eval grid 200x200x200", with(kEval, "--grid 200x200x200"), {"--grid 200x200x200", "memory budget", "GiB", "--max-memory"}},
      {"eval quadratic reference", with(kEval, "--grid 100x100x100"), {"--grid 100x100x100 (1000000 tokens)", "TFLOP", "--force"}},
      {"bench seq over the budget", with(kBench, "--seq 100000000"), {"--seq", "memory budget"}},
      {"prefill context over the budget", with(kPrefill, "--context 2000000000"), {"--context", "memory budget"}},
  });
}

// Inputs that were silently accepted or produced meaningless numbers with exit status 0.
TEST(HostileInputCli, FormerSilentAcceptsAreErrors) {
  const std::string nan_q = qkv_file("nan_q.safetensors", "q", std::numeric_limits<float>::quiet_NaN());
  const std::string inf_k = qkv_file("inf_k.safetensors", "k", std::numeric_limits<float>::infinity());
  const std::string qkv_run = " --block-q 16 --block-kv 16 --methods random,threshold --json";
  expect_clear_errors({
      {"NaN in captured q", "eval --qkv " + quote(nan_q) + qkv_run, {"nan_q.safetensors: tensor 'q'", "1 non-finite", "nan"}},
      {"inf in captured k", "eval --qkv " + quote(inf_k) + qkv_run, {"tensor 'k'", "non-finite", "inf"}},
      {"--sharpness 1e308", with(kEval, "--sharpness 1e308"), {"--sharpness", "(0, 100]", "'1e308'"}},
      {"--sharpness nan", with(kEval, "--sharpness nan"), {"--sharpness", "finite"}},
      {"--decode-policy checked on a small context", with(kPrefill, "--decode-policy bogus"), {"--decode-policy", "'bogus'"}},
      {"--decode-policy checked with --policy full", with(kPrefill, "--policy full --decode-policy bogus"), {"--decode-policy"}},
      {"--stride checked on a small context", with(kPrefill, "--stride 3"), {"--block", "a multiple of --stride 3"}},
      {"--scoring device on the CPU", with(kPrefill, "--scoring device"), {"--scoring", "needs a CUDA device"}},
      {"--scoring device with --policy full", with(kPrefill, "--policy full --scoring device"), {"--scoring"}},
      {"--kv-heads 0", with(kBench, "--kv-heads 0"), {"--kv-heads", "'0'"}},
      {"--seq-kv 0", with(kBench, "--seq-kv 0"), {"--seq-kv", "'0'"}},
      {"--threads -1", with(kBench, "--threads -1"), {"--threads", "'-1'"}},
      {"eval --threads -1", with(kEval, "--threads -1"), {"--threads", "'-1'"}},
      {"--pixels-per-block -1", "mask --pattern radial --grid 2x8x8 --png x.png --pixels-per-block -1",
       {"--pixels-per-block", "'-1'"}},
      {"--context ''", with(kPrefill, "--context ''"), {"--context", "''"}},
      {"--similarity-threshold nan", with(kEval, "--similarity-threshold nan"), {"--similarity-threshold", "[-1, 1]"}},
      {"--similarity-threshold 2", with(kEval, "--similarity-threshold 2"), {"--similarity-threshold", "'2'"}},
      {"--policy quest --top-k 0", with(kPrefill, "--policy quest --top-k 0"), {"--top-k", "'0'"}},
      {"--heads not a multiple of --kv-heads", with(kPrefill, "--heads 3"), {"--heads", "a multiple of --kv-heads 2"}},
      {"--density nan", with(kBench, "--density 1,nan"), {"--density", "finite"}},
      {"--layers without --steps", with(kBench, "--layers 0"), {"--layers"}},
      {"--kernel-variants on the CPU", with(kBench, "--kernel-variants all"), {"--kernel-variants", "--device cuda"}},
      {"--tune on the CPU", with(kBench, "--tune"), {"--tune", "--device cuda"}},
      {"init-model --out ''", "init-model --preset tiny --out ''", {"--out", "a non-empty path"}},
      {"dit-bench --save-output ''", "dit-bench --layers 1 --frames 1 --height 16 --width 16 --steps 1 --save-output ''",
       {"--save-output", "an empty path"}},
      {"calibrate --out ''", "calibrate --out ''", {"--out", "an empty path"}},
      {"dit-bench --offload blocks on the CPU", "dit-bench --layers 1 --frames 1 --height 16 --width 16 --offload blocks",
       {"--offload blocks", "--device cuda"}},
      {"dit-bench --offload disk", "dit-bench --layers 1 --frames 1 --height 16 --width 16 --offload disk", {"--offload", "'disk'"}},
      {"dit-bench --device-memory-limit on the CPU", "dit-bench --layers 1 --frames 1 --height 16 --width 16 --device-memory-limit 8",
       {"--device-memory-limit", "--device cuda"}},
      {"dit-bench --device-memory-limit nan", "dit-bench --layers 1 --frames 1 --height 16 --width 16 --device-memory-limit nan",
       {"--device-memory-limit"}},
      // One parser for sizes, grids and lists: nothing after the last number, no empty element.
      {"eval --topk 0.1,,0.2", with(kEval, "--topk 0.1,,0.2"), {"--topk", "without empty elements", "'0.1,,0.2'"}},
      {"eval --topk 0.1,", with(kEval, "--topk=0.1,"), {"--topk", "without empty elements"}},
      {"bench --density ,0.5", with(kBench, "--density ,0.5"), {"--density", "without empty elements"}},
      {"sp-bench --grid 2x4x4junk", "sp-bench --mask radial --grid 2x4x4junk --steps 1", {"--grid", "'2x4x4junk'"}},
      {"sp-bench --grid 4x4", "sp-bench --mask radial --grid 4x4 --steps 1", {"--grid", "FxHxW"}},
      {"serve --size 64x64junk", "serve --model /nonexistent --size 64x64junk", {"--size", "'64x64junk'"}},
      {"serve --size 64x+64", "serve --model /nonexistent --size 64x+64", {"--size", "two positive integers"}},
      {"generate --size 64x64junk", "generate --model /nonexistent --prompt x --size 64x64junk --out x.png", {"--size", "'64x64junk'"}},
      // A setting of a step cache that does not run.
      {"--teacache-thresh without the cache", "generate --model /nonexistent --prompt x --teacache-thresh 0.2 --out x.png",
       {"--teacache-thresh", "--cache teacache only"}},
      {"--dbcache-fn with --cache teacache", "generate --model /nonexistent --prompt x --cache teacache --dbcache-fn 2 --out x.png",
       {"--dbcache-fn", "--cache dbcache only"}},
      {"serve --dbcache-thresh without the cache", "serve --model /nonexistent --dbcache-thresh 0.1", {"--dbcache-thresh", "--cache dbcache"}},
      // Budgets: calibrate and eval --config estimate memory and work from their flags first.
      {"calibrate past the hour", "calibrate --grid 21x45x80 --synthetic-layers 40 --heads 40 --head-dim 128 --max-memory 1T",
       {"--grid 21x45x80 --synthetic-layers 40", "TFLOP", "over the hour", "--force"}},
      {"calibrate past --max-memory", "calibrate --grid 2x8x8 --synthetic-layers 2 --heads 2 --head-dim 16 --max-memory 64K",
       {"--grid 2x8x8", "MiB of host memory", "--max-memory"}},
      {"calibrate --max-memory 12Q", "calibrate --grid 2x8x8 --synthetic-layers 2 --heads 2 --head-dim 16 --max-memory 12Q",
       {"--max-memory", "K, M, G or T"}},
      {"calibrate on an absent GPU", "calibrate --grid 2x8x8 --synthetic-layers 1 --device cuda", {"--device", "cuda:0"}},
  });
  // A rank without a world: refused by every parallel command, naming both variables.
  for (const std::string command : {"sp-bench --seq 64 --heads 2 --steps 1", "dit-bench --layers 1 --frames 1 --height 16 --width 16 --steps 1"}) {
    const CommandOutput rank_alone = run_tessel(command, "TESSEL_RANK=1");
    EXPECT_NE(rank_alone.status, 0) << command << "\n" << rank_alone.out;
    EXPECT_NE(rank_alone.out.find("TESSEL_RANK"), std::string::npos) << rank_alone.out;
    EXPECT_NE(rank_alone.out.find("TESSEL_WORLD_SIZE"), std::string::npos) << rank_alone.out;
  }
  // A plugin path entry that is a file: the command runs, and says so.
  const std::string file = (test_dir() / "plugins.txt").string();
  std::ofstream(file) << "not a folder";
  const CommandOutput r = run_tessel("backends", "TESSEL_PLUGIN_PATH=" + quote(file));
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("plugin folder is a file, not a directory"), std::string::npos) << r.out;
  expect_no_sanitizer_report("plugin folder that is a file", r.out);
}

// Inputs that failed with a message that did not name them.
// The weights' flags (--transformer-file, --weights, --fp8-format, per-request LoRA), --attention-dtype and the
// budgets of bench, eval, mask and prefill-bench: each bad value or lone flag an error naming it.
TEST(HostileInputCli, WeightFlagsAndBudgetsNameTheInput) {
  const fs::path loop = test_dir() / "loop.safetensors";
  fs::remove(loop);
  fs::create_symlink(loop.filename(), loop);
  const std::string garbage = raw_safetensors("garbage.safetensors", "not json", 0);
  const std::string dit = "dit-bench --layers 1 --frames 1 --height 16 --width 16 --steps 1 --warmup 0";
  const std::string qkv = qkv_file("budget_qkv.safetensors", "", 0.0f);
  expect_clear_errors({
      {"--transformer-file a symlink loop", "generate --model /nonexistent --prompt x --out x.png --transformer-file " + quote(loop.string()),
       {"--transformer-file", "loop.safetensors", "symbolic links"}},
      {"--transformer-file a directory", "serve --model /nonexistent --transformer-file " + quote(test_dir().string()),
       {"--transformer-file", "a directory"}},
      {"--transformer-2-file missing", "generate --model /nonexistent --prompt x --out x.png --transformer-2-file /nonexistent.safetensors",
       {"--transformer-2-file", "/nonexistent.safetensors"}},
      {"dit-bench --transformer-file without --from-dir", with(dit, "--transformer-file " + quote(garbage)),
       {"--transformer-file", "--from-dir"}},
      {"--weights fp16", with(dit, "--weights fp16"), {"--weights", "'fp16'"}},
      {"--weights fp8 on the CPU", with(dit, "--weights fp8"), {"--weights fp8", "--device cuda"}},
      {"--attention-dtype fp16", with(dit, "--attention-dtype fp16"), {"--attention-dtype", "'fp16'"}},
      {"--attention-dtype fp8 on the CPU", with(dit, "--attention-dtype fp8"), {"--attention-dtype fp8", "--device cuda"}},
      {"--attention-kernel-variant on the CPU", with(dit, "--attention-kernel-variant fp8+lazy"),
       {"--attention-kernel-variant", "--device cuda"}},
      {"serve --attention-dtype int8", "serve --model /nonexistent --attention-dtype int8", {"--attention-dtype", "'int8'"}},
      {"generate --attention-dtype e5m2", "generate --model /nonexistent --prompt x --out x.png --attention-dtype e5m2",
       {"--attention-dtype", "'e5m2'"}},
      {"--fp8-format without --weights fp8", "init-model --preset tiny --out " + quote((test_dir() / "fp8").string()) + " --fp8-format comfyui",
       {"--fp8-format", "--weights fp8"}},
      {"--fp8-format bogus", "init-model --preset tiny --out x --weights fp8 --fp8-format bogus", {"--fp8-format", "'bogus'"}},
      {"--lora-adapters without --lora-rank", with(dit, "--lora-adapters 2"), {"--lora-adapters", "--lora-rank"}},
      {"--lora-adapters not dividing the batch", with(dit, "--lora-rank 4 --lora-adapters 3 --batch 2"), {"--lora-adapters", "batch 2"}},
      {"--lora-adapter a symlink loop", "serve --model /nonexistent --lora-adapter style=" + quote(loop.string()),
       {"--lora-adapter style", "loop.safetensors"}},
      {"--lora-adapter without a name", "serve --model /nonexistent --lora-adapter " + quote("=" + garbage), {"--lora-adapter"}},
      {"--lora-adapter scale nan", "serve --model /nonexistent --lora-adapter " + quote("style=" + garbage + ":nan"),
       {"--lora-adapter", "finite"}},
      {"bench over --max-memory", with(kBench, "--seq 4096 --max-memory 1M"), {"--seq 4096", "bench needs", "(--max-memory)", "--force"}},
      {"bench --max-memory junk", with(kBench, "--max-memory 12Q"), {"--max-memory", "K, M, G or T"}},
      {"eval --qkv over --max-memory", "eval --qkv " + quote(qkv) + " --block-q 32 --block-kv 16 --max-memory 1K",
       {"--qkv '", "budget_qkv.safetensors", "(--max-memory)"}},
      {"mask over --max-memory", "mask --pattern radial --grid 21x45x80 --png x.png --max-memory 1M", {"--grid 21x45x80", "mask needs"}},
      {"prefill-bench over --max-memory", with(kPrefill, "--max-memory 1K"), {"--context 1024", "prefill-bench needs", "(--max-memory)"}},
      {"prefill-bench --device tpu with --dry-run", with(kPrefill, "--dry-run --device tpu"), {"--device", "'tpu'"}},
  });
}

TEST(HostileInputCli, FormerVagueErrorsNameTheInput) {
  expect_clear_errors({
      {"huge grid", with(kEval, "--grid 99999999999x99999999999x99999999999"), {"--grid", "2147483647 tokens"}},
      {"config number out of range", with(kBench, "--steps 1 --sparse-attn-config '{\"block_size_q\": 18446744073709551615}'"),
       {"sparse_attn.block_size_q", "below 2^31"}},
      {"config float for an integer", with(kBench, "--steps 1 --sparse-attn-config '{\"block_size_q\": 1e20}'"),
       {"sparse_attn.block_size_q", "an integer"}},
      {"config long unknown key", with(kBench, "--steps 1 --sparse-attn-config '{\"" + std::string(5000, 'k') + "\": 1}'"),
       {"unknown key", "(5000 bytes)"}},
      {"unknown subcommand", "frobnicate --x 1", {"unknown command 'frobnicate'", "bench"}},
      {"device index overflow", with(kBench, "--device cuda:99999999999"), {"--device", "cuda:N"}},
      {"path:symbol naming a libc function", "backends --sparse-attn-backend " +
                                                 quote(std::string(TESSEL_BINARY_DIR) + "/lib/tessel/plugins/libtessel_sink_window.so:printf"),
       {"'printf' is not defined by this library"}},
  });
}

// The valid neighbours of the refused inputs still run, and their numbers are finite.
TEST(HostileInputCli, ValidNeighboursStillRun) {
  const std::string good = qkv_file("good.safetensors", "", 0.0f);
  const std::vector<std::string> runs = {
      with(kBench, "--kv-heads 1 --seq-kv 96 --threads 1"),
      with(kEval, "--sharpness 100 --similarity-threshold -1"),
      "eval --qkv " + quote(good) + " --block-q 16 --block-kv 16 --methods random,threshold --json",
      with(kPrefill, "--policy quest --top-k 1 --decode-policy topk"),
      with(kPrefill, "--cpu-copy-bandwidth 50 --scoring host"),
      "mask --pattern radial --grid 2x8x8 --png " + quote((test_dir() / "ok.png").string()) + " --pixels-per-block 0",
  };
  for (const std::string& args : runs) {
    const CommandOutput r = run_tessel(args);
    EXPECT_EQ(r.status, 0) << args << "\n" << r.out.substr(0, 800);
    expect_no_sanitizer_report(args, r.out);
    EXPECT_EQ(r.out.find("nan"), std::string::npos) << args << "\n" << r.out.substr(0, 800);
  }
}

}  // namespace
}  // namespace tessel
