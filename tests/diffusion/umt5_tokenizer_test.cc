// The UMT5 tokenizer against transformers (tests/fixtures/diffusion/tokenizer/, written by
// scripts/make_tokenizer_fixture.py): a tiny sentencepiece model with byte fallback, prompts with
// unicode, whitespace runs, curly quotes, HTML entities, control characters and cuts at max_length,
// cleaned as diffusers' WanPipeline cleans them and tokenized by transformers' AutoTokenizer.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tessel/core/error.h"
#include "tessel/core/log.h"
#include "tessel/core/random.h"
#include "tessel/diffusion/prompt_clean.h"
#include "tessel/diffusion/umt5_tokenizer.h"

namespace tessel {
namespace {

const std::string kDir = std::string(TESSEL_SOURCE_DIR) + "/tests/fixtures/diffusion/tokenizer";

nlohmann::json load_cases() {
  std::ifstream file(kDir + "/cases.json");
  std::stringstream text;
  text << file.rdbuf();
  return nlohmann::json::parse(text.str());
}

TEST(UMT5Tokenizer, MatchesTransformersIdsAndMasks) {
  const UMT5Tokenizer tokenizer = UMT5Tokenizer::load(kDir);
  const nlohmann::json cases = load_cases();
  ASSERT_GE(cases.size(), 10u);
  for (const nlohmann::json& c : cases) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const auto expected_ids = c["input_ids"].get<std::vector<int32_t>>();
    const auto expected_mask = c["attention_mask"].get<std::vector<int32_t>>();
    const int64_t max_length = c["max_length"].get<int64_t>();
    const TokenizedPrompts out = tokenizer.tokenize({c["prompt"].get<std::string>()}, max_length);
    ASSERT_EQ(out.input_ids.shape(), (Shape{1, max_length}));
    const int32_t* ids = out.input_ids.data_as<int32_t>();
    const int32_t* mask = out.attention_mask.data_as<int32_t>();
    EXPECT_EQ(std::vector<int32_t>(ids, ids + max_length), expected_ids);
    EXPECT_EQ(std::vector<int32_t>(mask, mask + max_length), expected_mask);
    int64_t kept = 0;
    for (int32_t m : expected_mask) kept += m;
    EXPECT_EQ(out.lengths[0], kept);
  }
}

TEST(UMT5Tokenizer, CleansPromptsAsWanPipeline) {
  const nlohmann::json cases = load_cases();
  for (const nlohmann::json& c : cases) {
    if (c["name"] == "combining accent") continue;  // ftfy's NFC composition is not reproduced
    SCOPED_TRACE(c["name"].get<std::string>());
    EXPECT_EQ(wan_prompt_clean(c["prompt"].get<std::string>()), c["cleaned"].get<std::string>());
  }
}

TEST(UMT5Tokenizer, CutsLongPromptsWithAWarning) {
  const UMT5Tokenizer tokenizer = UMT5Tokenizer::load(kDir);
  std::vector<std::string> warnings;
  const LogSink previous = set_log_sink([&](LogLevel, std::string_view m) { warnings.emplace_back(m); });
  const TokenizedPrompts out = tokenizer.tokenize({"a cat", "a quick brown fox jumps over the lazy dog"}, 6);
  set_log_sink(previous);
  EXPECT_EQ(out.tokens_cut[0], 0);
  EXPECT_GT(out.tokens_cut[1], 0);
  EXPECT_EQ(out.lengths[1], 6);
  EXPECT_EQ(out.input_ids.data_as<int32_t>()[11], tokenizer.eos_id());
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("prompts[1]"), std::string::npos) << warnings[0];
}

TEST(UMT5Tokenizer, RejectsBadInput) {
  const UMT5Tokenizer tokenizer = UMT5Tokenizer::load(kDir);
  try {
    tokenizer.tokenize({"fine", std::string("bad \xff byte")});
    FAIL() << "invalid UTF-8 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("prompts[1]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("offset 4"), std::string::npos) << e.what();
  }
  EXPECT_THROW(tokenizer.tokenize({"a"}, 0), Error);
  EXPECT_THROW(tokenizer.encode(std::string(UMT5Tokenizer::kMaxPromptBytes + 1, 'a')), Error);
  EXPECT_THROW(wan_prompt_clean("\xc0\x80"), Error);     // overlong
  EXPECT_THROW(wan_prompt_clean("\xed\xa0\x80"), Error);  // surrogate
  EXPECT_THROW(UMT5Tokenizer::load(kDir + "/missing"), Error);
  try {
    UMT5Tokenizer::from_serialized_model("not a model", "spiece.model");
    FAIL() << "garbage accepted as a model";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("spiece.model"), std::string::npos) << e.what();
  }
}

// Hostile text: random bytes are either rejected as not UTF-8 or cleaned to well-formed text, and
// random mixes of the characters the cleaner treats specially come out valid, stripped, with single
// spaces, and tokenize within max_length.
TEST(UMT5Tokenizer, RandomTextIsRejectedOrCleanedWellFormed) {
  const UMT5Tokenizer tokenizer = UMT5Tokenizer::load(kDir);
  const LogSink previous = set_log_sink([](LogLevel, std::string_view) {});  // the cut warnings
  SplitMix64 rng{17};
  const std::vector<std::string> pieces = {"&", "amp;", "#", "x", "1", "3", "9", ";", "<", "\n", " ", "\t", "\x1b[", "m",
                                           "\xc2\x85", "\xc2\x93", "\xe2\x80\x9c", "\xef\xac\x81", "\xef\xbc\xa1",
                                           "\xe3\x80\x80", "\xf0\x9f\x98\x80", "\xef\xbb\xbf", "a", "EACUTE", "lt"};
  for (int round = 0; round < 2000; ++round) {
    std::string bytes, mix;
    for (uint64_t i = 0, n = rng.below(24); i < n; ++i) bytes.push_back(static_cast<char>(rng.below(256)));
    for (uint64_t i = 0, n = rng.below(24); i < n; ++i) mix += pieces[rng.below(pieces.size())];
    try {
      wan_prompt_clean(bytes);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("UTF-8"), std::string::npos) << e.what();
    }
    const std::string cleaned = wan_prompt_clean(mix);
    ASSERT_NO_THROW(wan_prompt_clean(cleaned)) << mix;
    EXPECT_EQ(cleaned.find("  "), std::string::npos) << mix;
    if (!cleaned.empty()) {
      EXPECT_NE(cleaned.front(), ' ') << mix;
      EXPECT_NE(cleaned.back(), ' ') << mix;
    }
    const TokenizedPrompts tokens = tokenizer.tokenize({mix}, 16);
    EXPECT_LE(tokens.lengths[0], 16);
  }
  set_log_sink(previous);
}

}  // namespace
}  // namespace tessel
