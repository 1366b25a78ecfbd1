#include "tessel/core/io/limited_json.h"

#include <set>
#include <vector>

#include "tessel/core/error.h"

namespace tessel {
namespace {

using nlohmann::json;

constexpr size_t kMaxParseMessageChars = 160;

// A first pass over the text that builds nothing: checks depth and duplicate keys as the tokens
// stream by (nlohmann's SAX parser is iterative, so this pass itself never recurses).
class LimitChecker : public nlohmann::json_sax<json> {
 public:
  explicit LimitChecker(int max_depth) : max_depth_(max_depth) {}

  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    keys_.emplace_back();
    return enter();
  }
  bool key(string_t& name) override {
    if (keys_.back().insert(name).second) return true;
    problem_ = "the key " + quoted_excerpt(name) + " appears twice in one object";
    return false;
  }
  bool end_object() override {
    keys_.pop_back();
    --depth_;
    return true;
  }
  bool start_array(std::size_t) override { return enter(); }
  bool end_array() override {
    --depth_;
    return true;
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) override {
    std::string message = e.what();
    // nlohmann's text: "[json.exception.parse_error.101] parse error at line 1, column 2: ..."
    const size_t bracket = message.find("] ");
    if (message.rfind("[json.exception", 0) == 0 && bracket != std::string::npos) message = message.substr(bracket + 2);
    if (message.size() > kMaxParseMessageChars) message = message.substr(0, kMaxParseMessageChars) + "...";
    problem_ = detail::concat("invalid JSON at byte ", position, ": ", message);
    return false;
  }

  const std::string& problem() const { return problem_; }

 private:
  bool enter() {
    if (++depth_ <= max_depth_) return true;
    problem_ = detail::concat("nested deeper than ", max_depth_, " levels of objects and arrays");
    return false;
  }

  int max_depth_;
  int depth_ = 0;
  std::vector<std::set<std::string>> keys_;
  std::string problem_;
};

}  // namespace

json parse_json_limited(std::string_view text, const JsonLimits& limits, const std::string& what) {
  if (text.size() > limits.max_bytes)
    throw Error(detail::concat(what, ": expected at most ", limits.max_bytes, " bytes of JSON, got ", text.size()));
  LimitChecker checker(limits.max_depth);
  if (!json::sax_parse(text, &checker)) {
    const std::string problem = checker.problem().empty() ? "invalid JSON" : checker.problem();
    throw Error(what + ": " + problem);
  }
  return json::parse(text);  // within the limits now, and valid
}

std::string json_excerpt(const json& value, size_t max_chars) {
  const std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() <= max_chars) return text;
  return text.substr(0, max_chars) + "... (" + std::to_string(text.size()) + " characters)";
}

}  // namespace tessel
