// The CLI's validation layer: every number, name and size given on the command line is checked
// before any work, whatever code path the command later takes.
//  - Per value: CLI11 validators attached to the option (->check(...)), so a bad value is refused
//    while the command line is parsed, with "--option: expected ..., got '...'". They refuse NaN,
//    infinities, out-of-range and non-numeric text (CLI11's own Range lets NaN through).
//  - Between values (heads vs kv-heads, block vs chunk) and for the memory a request implies:
//    the functions below, called first thing by a command, throwing tessel::Error.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "tessel/core/device.h"
#include "tessel/diffusion/wan_pipeline.h"

namespace tessel::cli {

// An integer in [low, high].
CLI::Validator integer_in(int64_t low, int64_t high);
// A finite number in the interval; an open end excludes the bound: number_in(0, 1, kOpenLow) is (0, 1].
enum class Bounds { kClosed, kOpenLow, kOpenHigh, kOpen };
CLI::Validator number_in(double low, double high, Bounds bounds = Bounds::kClosed);
// One of the names (case-sensitive).
CLI::Validator one_of(std::vector<std::string> names);
// A value the parser accepts: runs `parse` (which throws tessel::Error) on the text.
CLI::Validator parsed_by(const std::string& description, std::function<void(const std::string&)> parse);

// Names shared by several commands: a device ("cpu", "cuda", "cuda:N") and an attention dtype
// (fp32, fp16, bf16 and their long names).
CLI::Validator device_name();
CLI::Validator attention_dtype_name();
// A path given: not empty (an empty output path would write into the working directory or be
// ignored; an empty input path would read as "not given" and run something else).
CLI::Validator non_empty_path();
// A file to read: present, a regular file (not a directory, a device or a symlink loop) this
// process may stat, checked when the flag is parsed (not after a model of gigabytes has loaded).
CLI::Validator regular_file();
// A file to write: not empty, not a directory, in a directory that exists and this process may
// write to. Checked when the flag is parsed, so a bad path fails before any work (not after a
// generation or a calibration of minutes).
CLI::Validator writable_file_path();
// An option that only matters with another setting, given without it: an Error
// "<flag>: applies to <when> only" (silently ignoring it would hide the user's mistake).
void check_applies(const CLI::Option* option, bool applies, const std::string& when);
// An even integer in [low, high].
CLI::Validator even_integer_in(int64_t low, int64_t high);

// The one parser of "WIDTHxHEIGHT" (both positive integers, nothing before, between or after them):
// throws Error naming `flag`.
std::pair<int64_t, int64_t> parse_width_height(const std::string& text, const std::string& flag);
// --size WIDTHxHEIGHT and --frames as a video the model makes (sizes a multiple of twice the VAE's
// stride, frames 4k + 1): an Error naming the flag at fault.
WanVideoSize parse_video_size(const std::string& size, int64_t frames, int64_t vae_spatial_stride);
// The same check as a CLI11 validator (the value refused while the command line is parsed).
CLI::Validator width_height();

// Comma lists (options with a ',' delimiter): CLI11 drops empty elements, so "0.1,,0.2" would be
// read as two values. Checks the raw command line of the subcommand about to run and throws
// Error naming the flag when a list value has an empty element (",,", a leading or trailing comma).
void check_list_values(const CLI::App& command, int argc, char** argv);

// Common ranges, so that commands agree on them.
constexpr int64_t kMaxHeads = 1024;
constexpr int64_t kMaxHeadDim = 1024;
constexpr int64_t kMaxBlockTokens = 4096;       // as the sparse config's block_size_q/kv
constexpr int64_t kMaxTokens = (1ll << 31) - 1;  // a sequence: BlockMask indices are int32
constexpr int64_t kMaxThreads = 4096;
constexpr int64_t kMaxRepeats = 100000;

// Throws Error("<option>: expected a multiple of <of_option> <of_value>, got <value>").
void require_multiple(const std::string& option, int64_t value, const std::string& of_option, int64_t of_value);

// The memory a command may plan to use: half of this machine's physical memory.
uint64_t memory_budget_bytes();

// The device `text` names (`flag`'s value), present on this machine: an Error naming the flag when
// it is a CUDA device and tessel was built without CUDA or no GPU is visible (not the driver's
// message from the first CUDA call).
Device present_device(const std::string& text, const std::string& flag);
Device present_device(Device device, const std::string& flag);
// Bytes as "12.3 GiB".
std::string format_bytes(double bytes);

}  // namespace tessel::cli
