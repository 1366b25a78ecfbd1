// Internal: the checks a plugin's backend table must pass before the host calls anything in it.
// Kept apart from dlopen (plugin_backend.cc) so the checks run on plain bytes in tests and fuzzers.
#pragma once

#include <cstddef>
#include <span>
#include <string>

#include "tessel/plugin/tessel_plugin.h"

namespace tessel::plugin {

// Zeroed room the host gives a plugin's init to write its table into: a plugin built against a
// newer header may write a longer table before the host gets to reject its ABI version, and must
// not write past what the host owns.
inline constexpr size_t kPluginTableReserve = 4096;
static_assert(sizeof(tessel_plugin_backend) <= kPluginTableReserve);

// Validates the table a plugin's init wrote at the start of `written` (at least
// sizeof(tessel_plugin_backend) bytes): ABI version in 1..TESSEL_PLUGIN_ABI_VERSION, struct_size
// covering the version-1 fields and within `written`, name, plan, forward (or, version 2,
// forward_with_context), destroy_plan and the capability masks set. Whether the function
// pointers point into loaded code is the loader's check.
// Returns the host's copy, with the fields past the plugin's struct_size cleared (absent). Throws
// Error starting with `where` (e.g. "plugin '/path/libx.so'") naming what is wrong.
tessel_plugin_backend checked_plugin_table(const std::string& where, std::span<const unsigned char> written);

}  // namespace tessel::plugin
