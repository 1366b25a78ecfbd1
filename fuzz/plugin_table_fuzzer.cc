// Fuzzes the checks a plugin's backend table passes before the host calls into it (what the
// loader runs right after the plugin's init): ABI version, struct_size, name, required function
// pointers and capability masks, written into the host's reserve as a plugin would. Pointers a
// real plugin would set are either NULL or valid (a fuzzed NUL-terminated name, stand-in
// functions); every other byte of the reserve is fuzzed. Input layout: name (length byte + bytes),
// a byte with one presence bit per pointer field (name, description, plan, update_step, forward,
// destroy_plan, validate_config, shutdown), then uint32 abi_version, struct_size, pattern_mask,
// module_mask, device_mask, int32 score, and the bytes written past the host's struct. Properties: the check either accepts or
// throws tessel::Error; an accepted table has a supported version, the required fields, and no
// field past the plugin's struct_size.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "byte_reader.h"
#include "plugin/plugin_table.h"
#include "tessel/core/error.h"

namespace {

void check(bool condition, const char* what) {
  if (!condition) {
    std::fprintf(stderr, "plugin table property violated: %s\n", what);
    std::abort();
  }
}

tessel_status stand_in_plan(void*, const tessel_pattern_spec*, const tessel_plan_request*, void**, tessel_error*) {
  return TESSEL_OK;
}
tessel_status stand_in_update_step(void*, void*, const tessel_step_info*, tessel_error*) { return TESSEL_OK; }
tessel_status stand_in_forward(void*, void*, const tessel_tensor*, const tessel_tensor*, const tessel_tensor*,
                               const tessel_tensor*, const tessel_tensor*, tessel_forward_stats*, tessel_error*) {
  return TESSEL_OK;
}
void stand_in_destroy_plan(void*, void*) {}
tessel_status stand_in_validate_config(void*, const char*, tessel_error*) { return TESSEL_OK; }
void stand_in_shutdown(void*) {}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tessel::fuzz::ByteReader input(data, size);
  alignas(std::max_align_t) std::array<unsigned char, tessel::plugin::kPluginTableReserve> reserve{};
  const std::string name = input.read_string();
  const auto present = input.read<uint8_t>();
  tessel_plugin_backend table{};
  table.abi_version = input.read<uint32_t>();
  table.struct_size = input.read<uint32_t>();
  table.pattern_mask = input.read<uint32_t>();
  table.module_mask = input.read<uint32_t>();
  table.device_mask = input.read<uint32_t>();
  table.score = input.read<int32_t>();
  table.name = (present & 1) ? name.c_str() : nullptr;
  table.description = (present & 2) ? name.c_str() : nullptr;
  table.plan = (present & 4) ? stand_in_plan : nullptr;
  table.update_step = (present & 8) ? stand_in_update_step : nullptr;
  table.forward = (present & 16) ? stand_in_forward : nullptr;
  table.destroy_plan = (present & 32) ? stand_in_destroy_plan : nullptr;
  table.validate_config = (present & 64) ? stand_in_validate_config : nullptr;
  table.shutdown = (present & 128) ? stand_in_shutdown : nullptr;
  std::memcpy(reserve.data(), &table, sizeof table);
  // A plugin built against a newer header writes past the host's struct: fuzzed trailing bytes.
  const std::string trailing = input.read_rest();
  std::memcpy(reserve.data() + sizeof table, trailing.data(),
              std::min(trailing.size(), reserve.size() - sizeof table));

  tessel_plugin_backend accepted;
  try {
    accepted = tessel::plugin::checked_plugin_table("plugin 'fuzzed.so'", reserve);
  } catch (const tessel::Error&) {
    return 0;
  }
  check(accepted.abi_version >= 1 && accepted.abi_version <= TESSEL_PLUGIN_ABI_VERSION, "supported ABI version");
  check(accepted.name != nullptr && accepted.name[0] != '\0', "a name");
  check(accepted.plan != nullptr && accepted.forward != nullptr && accepted.destroy_plan != nullptr,
        "the required functions");
  check(accepted.pattern_mask != 0 && accepted.module_mask != 0 && accepted.device_mask != 0, "capabilities");
  // The fields struct_size covers whole (every field past the required ones is a pointer).
  const size_t used = std::min<size_t>(accepted.struct_size / sizeof(void*) * sizeof(void*), sizeof accepted);
  const auto* bytes = reinterpret_cast<const unsigned char*>(&accepted);
  check(std::all_of(bytes + used, bytes + sizeof accepted, [](unsigned char b) { return b == 0; }),
        "no field past the plugin's struct_size");
  check(std::memcmp(bytes, reserve.data(), used) == 0, "the fields inside struct_size are the plugin's");
  // A field cut by struct_size must be absent, never a torn pointer the host would call.
  check(accepted.update_step == nullptr || accepted.update_step == table.update_step, "update_step whole or absent");
  check(accepted.validate_config == nullptr || accepted.validate_config == table.validate_config,
        "validate_config whole or absent");
  check(accepted.shutdown == nullptr || accepted.shutdown == table.shutdown, "shutdown whole or absent");
  return 0;
}
