#include "tessel/core/io/safetensors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tessel/core/error.h"
#include "tessel/core/random.h"
#include "hostile_text.h"

namespace tessel {
namespace {

std::string temp_path(const std::string& name) { return std::string(TESSEL_BINARY_DIR) + "/safetensors_test_" + name; }

// A file with an 8-byte little-endian header length, the header text and `data_bytes` zeros.
std::string raw_file(const std::string& name, const std::string& header, size_t data_bytes, int64_t declared_length = -1) {
  const std::string path = temp_path(name);
  std::ofstream out(path, std::ios::binary);
  const uint64_t len = declared_length >= 0 ? static_cast<uint64_t>(declared_length) : header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((len >> (8 * i)) & 0xff));
  out << header << std::string(data_bytes, '\0');
  return path;
}

void expect_open_error(const std::string& path, const std::string& needle) {
  try {
    SafetensorsFile::open(path);
    ADD_FAILURE() << "no error for " << path;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Safetensors, RoundTripsTensorsAndMetadata) {
  Tensor a = Tensor::empty({2, 3}, DType::kF32), b = Tensor::empty({4}, DType::kBF16), c = Tensor::empty({1, 2, 2}, DType::kF16);
  fill_normal(a.view(), 1);
  fill_normal(b.view(), 2);
  fill_normal(c.view(), 3);
  const std::string path = temp_path("roundtrip.safetensors");
  write_safetensors(path, {{"a", a.view()}, {"b", b.view()}, {"c", c.view()}}, {{"format", "pt"}});
  const SafetensorsFile f = SafetensorsFile::open(path);
  EXPECT_EQ(f.entries().size(), 3u);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  for (const auto& [name, t] : {std::pair<std::string, Tensor*>{"a", &a}, {"b", &b}, {"c", &c}}) {
    const Tensor loaded = f.load(name);
    EXPECT_EQ(loaded.shape(), t->shape());
    EXPECT_EQ(loaded.dtype(), t->dtype());
    EXPECT_EQ(std::memcmp(loaded.data(), t->data(), t->nbytes()), 0) << name;
  }
  EXPECT_EQ(f.find("zzz"), nullptr);
  EXPECT_THROW(f.load("zzz"), Error);
}

// F8_E4M3 (FP8 checkpoints) reads as kU8 bytes marked float8_e4m3, and writes back as F8_E4M3; U8
// stays plain bytes. The streamed writer gives the same bytes as the in-memory one.
TEST(Safetensors, Float8E4M3TensorsRoundTripAsMarkedBytes) {
  Tensor w = Tensor::empty({3, 4}, DType::kU8), u = Tensor::empty({2}, DType::kU8), s = Tensor::empty({3, 1}, DType::kF32);
  for (int64_t i = 0; i < w.numel(); ++i) w.data_as<uint8_t>()[i] = static_cast<uint8_t>(0x30 + i);
  u.data_as<uint8_t>()[0] = 7, u.data_as<uint8_t>()[1] = 9;
  fill_normal(s.view(), 4);
  const std::vector<std::pair<std::string, TensorView>> tensors = {{"w", w.view()}, {"u", u.view()}, {"s", s.view()}};
  const std::string path = temp_path("float8.safetensors");
  write_safetensors(path, tensors, {}, {"w"});
  const SafetensorsFile f = SafetensorsFile::open(path);
  ASSERT_NE(f.find("w"), nullptr);
  EXPECT_TRUE(f.find("w")->float8_e4m3);
  EXPECT_EQ(f.find("w")->dtype, DType::kU8);
  EXPECT_FALSE(f.find("u")->float8_e4m3);
  EXPECT_EQ(std::memcmp(f.load("w").data(), w.data(), w.nbytes()), 0);
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(bytes.find("\"F8_E4M3\""), std::string::npos);
  EXPECT_EQ(bytes, safetensors_bytes(tensors, {}, {"w"}));

  std::vector<SafetensorsEntry> entries;
  for (const auto& [name, view] : tensors) entries.push_back({name, view.dtype(), view.shape(), 0, 0, name == "w"});
  const std::string streamed = temp_path("float8_streamed.safetensors");
  write_safetensors_streamed(streamed, entries, {}, [&](size_t i) { return tensors[i].second; });
  std::ifstream in2(streamed, std::ios::binary);
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(in2)), std::istreambuf_iterator<char>()), bytes);
  // A producer that gives another shape is refused, naming the tensor.
  EXPECT_THROW(write_safetensors_streamed(streamed, entries, {}, [&](size_t i) { return tensors[(i + 1) % 3].second; }), Error);
  // Only kU8 tensors are written as F8_E4M3, and only names being written.
  EXPECT_THROW(write_safetensors(path, tensors, {}, {"s"}), Error);
  EXPECT_THROW(write_safetensors(path, tensors, {}, {"absent"}), Error);
  // F8_E4M3 keeps every span check: one byte per element.
  expect_open_error(raw_file("float8_span.safetensors", R"({"x":{"dtype":"F8_E4M3","shape":[2,2],"data_offsets":[0,8]}})", 8),
                    "4 bytes (shape (2, 2) x uint8)");
  expect_open_error(raw_file("float8_e5m2.safetensors", R"({"x":{"dtype":"F8_E5M2","shape":[2],"data_offsets":[0,2]}})", 2),
                    "F8_E4M3, got 'F8_E5M2'");
}

TEST(Safetensors, MalformedFilesGiveClearErrors) {
  const std::string good = R"({"x":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})";
  EXPECT_NO_THROW(SafetensorsFile::open(raw_file("good", good, 16)));
  {
    const std::string path = temp_path("short");
    std::ofstream(path, std::ios::binary) << "abc";
    expect_open_error(path, "truncated");
  }
  expect_open_error(raw_file("header_too_long", good, 16, 1000), "header length");
  expect_open_error(raw_file("bad_json", "{\"x\": [1,", 0), "invalid JSON");
  expect_open_error(raw_file("not_object", "[1,2]", 0), "a JSON object");
  expect_open_error(raw_file("truncated_data", good, 8), "out of range");
  expect_open_error(raw_file("offsets_out", R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", 8), "out of range");
  expect_open_error(raw_file("unknown_dtype", R"({"x":{"dtype":"Q7","shape":[2],"data_offsets":[0,8]}})", 8), "dtype");
  expect_open_error(raw_file("unsupported_dtype", R"({"x":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", 8), "one of F32");
  expect_open_error(raw_file("span", R"({"x":{"dtype":"F16","shape":[3],"data_offsets":[0,8]}})", 8), "byte span");
  expect_open_error(raw_file("negative_shape", R"({"x":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}})", 0), "non-negative");
  expect_open_error(raw_file("reversed", R"({"x":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}})", 4), "begin <= end");
  expect_open_error(raw_file("missing_field", R"({"x":{"dtype":"F32","shape":[1]}})", 4), "data_offsets");
  expect_open_error(raw_file("overlap", R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"y":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
                    "overlap");
  expect_open_error(raw_file("bad_metadata", R"({"__metadata__":{"k":1}})", 0), "__metadata__.k");
  expect_open_error(temp_path("does_not_exist"), "readable file");
}

using testing::nested;

// Hostile headers: deep nesting anywhere, long values, duplicate names and special files give an
// Error with a short message (the value is never echoed whole), not a crash or a hang.
TEST(Safetensors, HostileHeadersGiveShortErrors) {
  const std::string entry = R"({"dtype":"F32","shape":[1],"data_offsets":[0,4]})";
  const struct {
    const char* name;
    std::string header;
    std::string fragment;
  } cases[] = {
      {"deep shape", R"({"x":{"dtype":"F32","shape":)" + nested(100000, "[", "1", "]") + R"(,"data_offsets":[0,4]}})",
       "nested deeper than 8"},
      {"deep dtype", R"({"x":{"dtype":)" + nested(100000, "[", "1", "]") + R"(,"shape":[1],"data_offsets":[0,4]}})",
       "nested deeper than 8"},
      {"deep metadata", R"({"__metadata__":)" + nested(100000, "{\"a\":", "1", "}") + "}", "nested deeper than 8"},
      {"shallow but wrong dtype value", R"({"x":{"dtype":)" + nested(6, "[", "1", "]") + R"(,"shape":[1],"data_offsets":[0,4]}})",
       "dtype: expected a string, got [[[[[[1]]]]]]"},
      {"long dtype", R"({"x":{"dtype":")" + std::string(100000, 'Q') + R"(","shape":[1],"data_offsets":[0,4]}})",
       "(100000 bytes)"},
      {"long shape", R"({"x":{"dtype":"F32","shape":[)" + nested(20000, "1,", "-1", "") + R"(],"data_offsets":[0,4]}})",
       "shape entry: expected a non-negative integer, got -1"},
      {"long name", "{\"" + std::string(100000, 'n') + R"(":{"dtype":"Q4","shape":[1],"data_offsets":[0,4]}})", "(100000 bytes)"},
      {"duplicate name", "{\"x\":" + entry + ",\"x\":" + entry + "}", "'x' appears twice"},
  };
  for (const auto& c : cases) {
    const std::string path = raw_file("hostile.safetensors", c.header, 4);
    try {
      SafetensorsFile::open(path);
      ADD_FAILURE() << c.name << ": accepted";
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(c.fragment), std::string::npos) << c.name << ": " << message.substr(0, 500);
      EXPECT_LT(message.size(), 600u) << c.name << ": " << message.substr(0, 600);
    }
  }
  expect_open_error("/dev/zero", "a character device");
  expect_open_error(std::string(TESSEL_BINARY_DIR), "a directory");
}

}  // namespace
}  // namespace tessel
