#include "plugin_table.h"

#include <algorithm>
#include <cstring>

#include "tessel/core/error.h"

namespace tessel::plugin {
namespace {

// The fields a version-1 table must provide (everything up to destroy_plan).
constexpr size_t kMinimumTableSize = offsetof(tessel_plugin_backend, destroy_plan) + sizeof(void (*)(void*, void*));
// Every field after the required ones is a pointer (tables only ever append function pointers),
// so a field is inside the plugin's table only when struct_size covers it whole.
constexpr size_t kOptionalFieldSize = sizeof(void (*)(void*));
static_assert(kMinimumTableSize % kOptionalFieldSize == 0);
static_assert((sizeof(tessel_plugin_backend) - kMinimumTableSize) % kOptionalFieldSize == 0);

}  // namespace

tessel_plugin_backend checked_plugin_table(const std::string& where, std::span<const unsigned char> written) {
  if (written.size() < sizeof(tessel_plugin_backend))
    fail_argument(where + ": table buffer", detail::concat(">= ", sizeof(tessel_plugin_backend), " bytes"), written.size());
  tessel_plugin_backend table;
  std::memcpy(&table, written.data(), sizeof table);
  if (table.abi_version == 0)
    throw Error(where + ": the entry point did not set abi_version (expected " +
                std::to_string(TESSEL_PLUGIN_ABI_VERSION) + ")");
  if (table.abi_version > TESSEL_PLUGIN_ABI_VERSION)
    throw Error(where + ": ABI version mismatch: the plugin was built for ABI version " + std::to_string(table.abi_version) +
                ", this tessel supports versions 1.." + std::to_string(TESSEL_PLUGIN_ABI_VERSION));
  // The version and size come first: nothing else in the table is read before they are known good.
  if (table.struct_size < kMinimumTableSize || table.struct_size > written.size())
    fail_argument(where + ": table struct_size",
                  detail::concat("between ", kMinimumTableSize, " and the ", written.size(), " bytes reserved"), table.struct_size);
  const auto require = [&](bool present, const char* field) {
    if (!present) throw Error(where + ": incomplete table: '" + field + "' is not set");
  };
  require(table.name != nullptr && table.name[0] != '\0', "name");
  require(table.plan != nullptr, "plan");
  // Version 2: forward_with_context may replace forward, when the table reaches that far.
  const bool has_forward_with_context =
      table.struct_size >= offsetof(tessel_plugin_backend, forward_with_context) + kOptionalFieldSize &&
      table.forward_with_context != nullptr;
  require(table.forward != nullptr || has_forward_with_context, "forward");
  require(table.destroy_plan != nullptr, "destroy_plan");
  require(table.pattern_mask != 0, "pattern_mask");
  require(table.module_mask != 0, "module_mask");
  require(table.device_mask != 0, "device_mask");
  // Fields past the plugin's table are absent (NULL) for the host, and so is a field that
  // struct_size cuts in two: half a pointer must never be called.
  const size_t used = std::min<size_t>(table.struct_size / kOptionalFieldSize * kOptionalFieldSize,
                                       sizeof(tessel_plugin_backend));
  std::memset(reinterpret_cast<unsigned char*>(&table) + used, 0, sizeof(tessel_plugin_backend) - used);
  return table;
}

}  // namespace tessel::plugin
