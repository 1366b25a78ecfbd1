// Out-of-memory errors that name what asked for the memory: the size flags of the command that
// ran (given ones with their values; the defaults when none was given), so that "out of host
// memory for N bytes" tells the user which flag to lower.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace tessel::cli {

// Whether `message` is an allocation failure (host or device, from the library's allocator, a
// CUDA allocation or std::bad_alloc's what()).
bool is_out_of_memory(const std::string& message);

// " (the memory asked for by --seq 2000000 --heads 64: lower them)" for `command`, or "" when it
// has no size flags.
std::string memory_flags_suffix(const CLI::App& command);

}  // namespace tessel::cli
