// core/dynamic_library and core/cpu_features: a missing library or symbol is an Error that names
// it (with the caller's purpose and advice), a present one resolves; the widest CPU variant is the
// one the reported level names.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "tessel/core/cpu_features.h"
#include "tessel/core/current_device.h"
#include "tessel/core/device.h"
#include "tessel/core/dynamic_library.h"
#include "tessel/core/error.h"

namespace tessel {
namespace {

TEST(DynamicLibrary, AMissingLibraryIsAnErrorWithThePurposeAndTheAdvice) {
  try {
    open_runtime_library("libtessel_no_such_library.so.7", "the test needs it", "install it");
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string text = e.what();
    EXPECT_NE(text.find("the test needs it: libtessel_no_such_library.so.7 could not be opened"), std::string::npos) << text;
    EXPECT_NE(text.find("install it"), std::string::npos) << text;
  }
}

struct LibcTable {
  decltype(&::strlen) strlen = nullptr;
};

TEST(DynamicLibrary, SymbolsResolveAndAMissingOneIsNamed) {
  const LibcTable table = load_runtime_api<LibcTable>("libc.so.6", "libc", "", [](void* library, LibcTable& t) {
    TESSEL_RUNTIME_SYMBOL(t, library, "libc.so.6", strlen);
  });
  ASSERT_NE(table.strlen, nullptr);
  EXPECT_EQ(table.strlen("tessel"), 6u);
  void* libc = open_runtime_library("libc.so.6", "libc", "");
  try {
    runtime_library_symbol(libc, "libc.so.6", "tessel_no_such_symbol");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("libc.so.6 has no symbol tessel_no_such_symbol"), std::string::npos) << e.what();
  }
}

TEST(CpuFeatures, TheWidestVariantIsTheOneTheLevelNames) {
  const int chosen = widest_variant(0, 1, 2);
  switch (cpu_vector_level()) {
    case CpuVectorLevel::kBaseline: EXPECT_EQ(chosen, 0); break;
    case CpuVectorLevel::kAvx2Fma: EXPECT_EQ(chosen, 1); break;
    case CpuVectorLevel::kAvx512: EXPECT_EQ(chosen, 2); break;
  }
  EXPECT_EQ(cpu_vector_level(), cpu_vector_level());  // read once
}

// A GPU that is not there cannot be made current: the error names it (on a machine without CUDA or
// without that many GPUs); the CPU needs nothing.
TEST(CurrentDevice, AnAbsentGpuIsAnErrorNamingItAndTheCpuIsANoOp) {
  make_current_device(Device::cpu());
  const Device absent = Device::cuda(cuda_device_count() + 3);
  std::string error;
  try {
    make_current_device(absent);
  } catch (const Error& e) {
    error = e.what();
  }
  EXPECT_NE(error.find(cuda_compiled() ? absent.str() : "built without CUDA"), std::string::npos) << error;
}

}  // namespace
}  // namespace tessel

