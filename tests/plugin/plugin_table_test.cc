// The plugin table checks on plain bytes (no shared library involved).
#include "plugin_table.h"

#include <gtest/gtest.h>

#include <array>
#include <cstddef>
#include <cstring>
#include <string>

#include "tessel/core/error.h"

namespace tessel::plugin {
namespace {

tessel_status fake_plan(void*, const tessel_pattern_spec*, const tessel_plan_request*, void**, tessel_error*) { return TESSEL_OK; }
tessel_status fake_forward(void*, void*, const tessel_tensor*, const tessel_tensor*, const tessel_tensor*, const tessel_tensor*,
                           const tessel_tensor*, tessel_forward_stats*, tessel_error*) {
  return TESSEL_OK;
}
void fake_destroy(void*, void*) {}
void fake_shutdown(void*) {}

struct Reserve {
  alignas(std::max_align_t) std::array<unsigned char, kPluginTableReserve> bytes{};
  tessel_plugin_backend& table() { return *reinterpret_cast<tessel_plugin_backend*>(bytes.data()); }
};

Reserve valid_reserve() {
  Reserve reserve;
  tessel_plugin_backend& table = reserve.table();
  table.abi_version = TESSEL_PLUGIN_ABI_VERSION;
  table.struct_size = sizeof(tessel_plugin_backend);
  table.name = "fake";
  table.pattern_mask = TESSEL_BIT(TESSEL_PATTERN_DENSE);
  table.module_mask = TESSEL_BIT(TESSEL_MODULE_DIT_SELF);
  table.device_mask = TESSEL_BIT(TESSEL_DEVICE_CPU);
  table.plan = fake_plan;
  table.forward = fake_forward;
  table.destroy_plan = fake_destroy;
  table.validate_config = [](void*, const char*, tessel_error*) { return TESSEL_OK; };
  table.shutdown = fake_shutdown;
  return reserve;
}

std::string error_of(Reserve& reserve) {
  try {
    checked_plugin_table("plugin 'x.so'", reserve.bytes);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(PluginTable, AcceptsACompleteTable) {
  Reserve reserve = valid_reserve();
  const tessel_plugin_backend table = checked_plugin_table("plugin 'x.so'", reserve.bytes);
  EXPECT_STREQ(table.name, "fake");
  EXPECT_EQ(table.shutdown, &fake_shutdown);
}

TEST(PluginTable, FieldsPastTheStructSizeAreAbsent) {
  Reserve reserve = valid_reserve();
  reserve.table().struct_size = offsetof(tessel_plugin_backend, validate_config);
  const tessel_plugin_backend table = checked_plugin_table("plugin 'x.so'", reserve.bytes);
  EXPECT_EQ(table.validate_config, nullptr);
  EXPECT_EQ(table.shutdown, nullptr);
  EXPECT_EQ(table.destroy_plan, &fake_destroy);
}

TEST(PluginTable, AFieldCutByTheStructSizeIsAbsent) {
  Reserve reserve = valid_reserve();
  reserve.table().struct_size = offsetof(tessel_plugin_backend, shutdown) + 4;  // half of `shutdown`
  const tessel_plugin_backend table = checked_plugin_table("plugin 'x.so'", reserve.bytes);
  EXPECT_EQ(table.shutdown, nullptr);
  EXPECT_NE(table.validate_config, nullptr);
}

TEST(PluginTable, RejectsBadVersionsSizesAndMissingFields) {
  Reserve reserve = valid_reserve();
  reserve.table().abi_version = 0;
  EXPECT_NE(error_of(reserve).find("did not set abi_version"), std::string::npos) << error_of(reserve);
  reserve = valid_reserve();
  reserve.table().abi_version = TESSEL_PLUGIN_ABI_VERSION + 1;
  EXPECT_NE(error_of(reserve).find("ABI version mismatch"), std::string::npos) << error_of(reserve);
  reserve = valid_reserve();
  reserve.table().struct_size = offsetof(tessel_plugin_backend, destroy_plan);
  EXPECT_NE(error_of(reserve).find("struct_size"), std::string::npos) << error_of(reserve);
  reserve = valid_reserve();
  reserve.table().name = "";
  EXPECT_NE(error_of(reserve).find("'name' is not set"), std::string::npos) << error_of(reserve);
  reserve = valid_reserve();
  reserve.table().forward = nullptr;
  EXPECT_NE(error_of(reserve).find("'forward' is not set"), std::string::npos) << error_of(reserve);
  reserve = valid_reserve();
  reserve.table().device_mask = 0;
  EXPECT_NE(error_of(reserve).find("'device_mask' is not set"), std::string::npos) << error_of(reserve);
}

TEST(PluginTable, RejectsABufferShorterThanTheTable) {
  Reserve reserve = valid_reserve();
  EXPECT_THROW(checked_plugin_table("plugin 'x.so'", std::span(reserve.bytes).first(8)), Error);
}

}  // namespace
}  // namespace tessel::plugin
