#include "openai_api.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string_view>

#include "tessel/core/io/limited_json.h"
#include "tessel/core/base64.h"
#include "tessel/core/utf8.h"
#include "tessel/diffusion/image_io.h"

namespace tessel::serve {
namespace {

using engine::GenerationRequest;
using engine::OutputKind;
using engine::RequestStatus;

[[noreturn]] void bad_field(const std::string& field, const std::string& expected, const std::string& actual) {
  throw ApiError(400, field, detail::concat(field, ": expected ", expected, ", got ", actual));
}

// Where a body's text is not UTF-8: it reaches the tokenizer and the workers' wire format, where an
// invalid byte would surface as a 500 (the JSON writer refuses it) or a job failing later. A 400 naming
// the field instead (its path: "prompt", "extra.name", "items[2]"; "a field name" for a name).
constexpr std::string_view kInvalidMark = "\xEE\x80\x80";  // U+E000, standing in for each invalid byte

std::optional<std::string> field_with_mark(const nlohmann::json& value, const std::string& field) {
  const auto marked = [](const std::string& text) { return text.find(kInvalidMark) != std::string::npos; };
  if (value.is_string()) return marked(value.get_ref<const std::string&>()) ? std::optional(field) : std::nullopt;
  if (value.is_object()) {
    for (const auto& [name, member] : value.items()) {
      if (marked(name)) return field.empty() ? std::string("a field name") : "a field name in " + field;
      if (auto found = field_with_mark(member, field.empty() ? name : field + "." + name)) return found;
    }
  }
  if (value.is_array())
    for (size_t i = 0; i < value.size(); ++i)
      if (auto found = field_with_mark(value[i], detail::concat(field.empty() ? "body" : field, "[", i, "]"))) return found;
  return std::nullopt;
}

// `text` (a body, or a form field's value named `field`) as UTF-8, or a 400 naming where it is not.
void check_utf8(const std::string& text, const std::string& field) {
  try {
    utf8_check(text, field.empty() ? "request body" : field);
    return;
  } catch (const Error& e) {
    if (!field.empty()) throw ApiError(400, field, e.what());
    // A JSON body: the field that holds the byte, found in the body with each invalid byte marked.
    std::optional<std::string> where;
    try {
      where = field_with_mark(parse_json_limited(utf8_replace_invalid(text, kInvalidMark), JsonLimits{text.size() * 3 + 16, 8}, "request body"), "");
    } catch (const Error&) {
    }
    const std::string what = std::string(e.what()).substr(std::string("request body: ").size());
    throw ApiError(400, where.value_or(""), where ? *where + ": " + what + " of the request body" : std::string(e.what()));
  }
}

constexpr size_t kMaxJsonBytes = 1 << 20;  // a body's JSON beside its reference images

// `max_bytes`: the JSON text's limit (more than kMaxJsonBytes for base64 images).
nlohmann::json parse_body(const std::string& body, size_t max_bytes = kMaxJsonBytes) {
  check_utf8(body, "");  // before the parser, whose errors quote the text
  nlohmann::json json;
  try {
    json = parse_json_limited(body, JsonLimits{max_bytes, 8}, "request body");
  } catch (const Error& e) {
    throw ApiError(400, "", e.what());
  }
  if (!json.is_object()) bad_field("body", "a JSON object", json_excerpt(json));
  return json;
}

std::string string_field(const nlohmann::json& body, const std::string& field, const std::string& fallback, bool required = false) {
  const auto it = body.find(field);
  if (it == body.end() || it->is_null()) {
    if (required) throw ApiError(400, field, field + ": required");
    return fallback;
  }
  if (!it->is_string()) bad_field(field, "a string", json_excerpt(*it));
  return it->get<std::string>();
}

int64_t integer_field(const nlohmann::json& body, const std::string& field, int64_t fallback, int64_t low, int64_t high) {
  const auto it = body.find(field);
  if (it == body.end() || it->is_null()) return fallback;
  if (!it->is_number_integer() && !it->is_number_unsigned()) bad_field(field, "an integer", json_excerpt(*it));
  if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(high))
    bad_field(field, detail::concat("an integer in ", low, "..", high), json_excerpt(*it));
  const int64_t value = it->get<int64_t>();
  if (value < low || value > high) bad_field(field, detail::concat("an integer in ", low, "..", high), json_excerpt(*it));
  return value;
}

double number_field(const nlohmann::json& body, const std::string& field, double fallback, double low, double high) {
  const auto it = body.find(field);
  if (it == body.end() || it->is_null()) return fallback;
  if (!it->is_number()) bad_field(field, "a number", json_excerpt(*it));
  const double value = it->get<double>();
  if (!(value >= low && value <= high)) bad_field(field, detail::concat("a number in ", low, "..", high), json_excerpt(*it));
  return value;
}

// "WIDTHxHEIGHT", both positive integers.
void parse_size(const nlohmann::json& body, GenerationRequest& request, const ApiDefaults& defaults) {
  request.width = defaults.default_width;
  request.height = defaults.default_height;
  const std::string text = string_field(body, "size", "");
  if (text.empty()) return;
  const size_t x = text.find('x');
  const auto digits = [](const std::string& part) {
    return !part.empty() && part.size() <= 6 && part.find_first_not_of("0123456789") == std::string::npos;
  };
  if (x == std::string::npos || !digits(text.substr(0, x)) || !digits(text.substr(x + 1)))
    bad_field("size", "\"WIDTHxHEIGHT\" in pixels, e.g. \"832x480\"", quoted_excerpt(text));
  request.width = std::stoll(text.substr(0, x));
  request.height = std::stoll(text.substr(x + 1));
}

void check_fields(const nlohmann::json& body, const std::set<std::string>& allowed) {
  for (const auto& [key, value] : body.items())
    if (!allowed.count(key)) throw ApiError(400, key, key + ": unknown field");
}

void check_model(const nlohmann::json& body, const ApiDefaults& defaults) {
  const std::string model = string_field(body, "model", "");
  if (!model.empty() && model != defaults.model_name)
    throw ApiError(404, "model", detail::concat("model: expected ", quoted_excerpt(defaults.model_name), " (the model this server runs), got ",
                                               quoted_excerpt(model)));
}

// The fields both endpoints share.
void parse_common(const nlohmann::json& body, GenerationRequest& request, const ApiDefaults& defaults) {
  check_model(body, defaults);
  request.prompt = string_field(body, "prompt", "", true);
  request.negative_prompt = string_field(body, "negative_prompt", "");
  request.num_inference_steps = integer_field(body, "num_inference_steps", defaults.default_steps, 1, 1000000);
  request.guidance_scale = number_field(body, "guidance_scale", defaults.default_guidance, 0.0, 1e6);
  // Wan 2.2's low-noise expert's scale; absent: guidance_scale (the engine refuses it for one expert).
  if (const auto second = body.find("guidance_scale_2"); second != body.end() && !second->is_null())
    request.guidance_scale_2 = number_field(body, "guidance_scale_2", 0.0, 0.0, 1e6);
  const auto seed = body.find("seed");
  if (seed == body.end() || seed->is_null()) {
    request.seed = std::random_device{}() & 0x7fffffff;
  } else {
    request.seed = static_cast<uint64_t>(integer_field(body, "seed", 0, 0, INT64_MAX));
  }
  request.sparse_attention = string_field(body, "sparse_attention", "");
  request.cache = string_field(body, "cache", "");
  request.lora = string_field(body, "lora", "");
  parse_size(body, request, defaults);
}

// The reference image fields and the request member each fills.
struct ReferenceField {
  const char* name;
  std::shared_ptr<const std::string> GenerationRequest::*member;
};
constexpr ReferenceField kReferenceFields[] = {{"input_reference", &GenerationRequest::image},
                                               {"last_frame", &GenerationRequest::last_image}};

// A reference given in a JSON body (or a form's text field): the image's bytes.
std::string reference_bytes(const nlohmann::json& value, const std::string& field) {
  const std::string expected = "a PNG or JPEG image: a multipart file part, a data URL (\"data:image/png;base64,...\"), base64, or "
                               "{\"image_url\": a data URL}";
  if (value.is_object()) {
    for (const auto& [key, member] : value.items())
      if (key != "image_url") {
        if (key == "file_id")
          throw ApiError(400, field, field + ": file_id references are not supported (this server has no files API); send the image itself");
        throw ApiError(400, field + "." + key, field + "." + key + ": unknown field (expected image_url)");
      }
    const auto url = value.find("image_url");
    if (url == value.end() || !url->is_string()) bad_field(field + ".image_url", "a data URL", url == value.end() ? "nothing" : json_excerpt(*url));
    return reference_bytes(*url, field);
  }
  if (!value.is_string()) bad_field(field, expected, json_excerpt(value));
  const std::string& text = value.get_ref<const std::string&>();
  std::string_view data = text;
  if (text.rfind("data:", 0) == 0) {
    const size_t comma = text.find(',');
    const std::string_view media = std::string_view(text).substr(0, comma == std::string::npos ? 0 : comma);
    if (comma == std::string::npos || media.size() < 7 || media.substr(media.size() - 7) != ";base64")
      bad_field(field, "a base64 data URL (\"data:image/png;base64,...\")", quoted_excerpt(text.substr(0, 40)));
    data = std::string_view(text).substr(comma + 1);
  } else if (text.find("://") != std::string::npos) {
    throw ApiError(400, field, field + ": remote URLs are not fetched (remote fetching is not supported); send the image as a multipart "
                               "file part, a data URL or base64, got " + quoted_excerpt(text.substr(0, 80)));
  }
  std::optional<std::string> bytes = base64_decode(data);
  if (!bytes) bad_field(field, expected, "text that is not base64 " + quoted_excerpt(text.substr(0, 40)));
  return std::move(*bytes);
}

// The references of a video request (file parts or body fields), each checked by decoding it.
void parse_references(const nlohmann::json& body, const std::map<std::string, std::string>& file_parts, const ApiDefaults& defaults,
                      GenerationRequest& request) {
  size_t total = 0;
  for (const ReferenceField& reference : kReferenceFields) {
    const std::string field = reference.name;
    const auto part = file_parts.find(field);
    const auto value = body.find(field);
    const bool in_body = value != body.end() && !value->is_null();
    if (part == file_parts.end() && !in_body) continue;
    if (part != file_parts.end() && in_body) bad_field(field, "one value", "a file part and a field");
    std::string bytes = part != file_parts.end() ? part->second : reference_bytes(*value, field);
    total += bytes.size();
    if (total > defaults.max_reference_bytes)
      bad_field(field, detail::concat("images of at most ", defaults.max_reference_bytes, " bytes (input_reference and last_frame together)"),
                detail::concat(total, " bytes"));
    try {
      (void)decode_image(bytes, field);
    } catch (const Error& e) {
      throw ApiError(400, field, e.what());
    }
    request.*reference.member = std::make_shared<const std::string>(std::move(bytes));
  }
}

int64_t unix_seconds(std::chrono::system_clock::time_point at) {
  return std::chrono::duration_cast<std::chrono::seconds>(at.time_since_epoch()).count();
}

}  // namespace

GenerationRequest parse_image_request(const std::string& body_text, const ApiDefaults& defaults) {
  const nlohmann::json body = parse_body(body_text);
  check_fields(body, {"prompt", "model", "n", "size", "response_format", "quality", "style", "user", "negative_prompt",
                      "num_inference_steps", "guidance_scale", "guidance_scale_2", "seed", "sparse_attention", "cache", "lora"});
  GenerationRequest request;
  request.kind = OutputKind::kImage;
  request.frames = 1;
  parse_common(body, request, defaults);
  request.num_outputs = integer_field(body, "n", 1, 1, 1000);
  const std::string format = string_field(body, "response_format", "b64_json");
  if (format != "b64_json") bad_field("response_format", "\"b64_json\" (this server returns no URLs)", quoted_excerpt(format));
  return request;
}

GenerationRequest parse_video_request(const std::string& body_text, const ApiDefaults& defaults) {
  // References as base64 (4 characters per 3 bytes) beside the other fields.
  return parse_video_request(parse_body(body_text, kMaxJsonBytes + (defaults.max_reference_bytes + 2) / 3 * 4), defaults);
}

GenerationRequest parse_video_request(const nlohmann::json& body, const ApiDefaults& defaults,
                                      const std::map<std::string, std::string>& file_parts) {
  if (!body.is_object()) bad_field("body", "a JSON object", json_excerpt(body));
  check_fields(body, {"prompt", "model", "size", "seconds", "num_frames", "fps", "negative_prompt", "num_inference_steps",
                      "guidance_scale", "guidance_scale_2", "seed", "sparse_attention", "cache", "lora", "user", "input_reference",
                      "last_frame"});
  for (const auto& [name, bytes] : file_parts)
    if (!is_reference_field(name))
      throw ApiError(400, "", "unknown file part " + quoted_excerpt(name) + " (expected input_reference or last_frame)");
  GenerationRequest request;
  request.kind = OutputKind::kVideo;
  parse_common(body, request, defaults);
  parse_references(body, file_parts, defaults, request);
  request.fps = number_field(body, "fps", defaults.default_fps, 1.0, 120.0);
  request.frames = integer_field(body, "num_frames", defaults.default_frames, 1, 100000);
  if (body.contains("seconds") && !body.contains("num_frames")) {
    // OpenAI sends seconds as a string ("4"); a number is accepted too. Wan needs 4k + 1 frames.
    const nlohmann::json& value = body["seconds"];
    double seconds = 0.0;
    if (value.is_string()) {
      try {
        size_t end = 0;
        seconds = std::stod(value.get<std::string>(), &end);
        if (end != value.get<std::string>().size()) throw std::invalid_argument("trailing text");
      } catch (const std::logic_error&) {
        bad_field("seconds", "a number of seconds, e.g. \"4\"", json_excerpt(value));
      }
    } else if (value.is_number()) {
      seconds = value.get<double>();
    } else {
      bad_field("seconds", "a number of seconds, e.g. \"4\"", json_excerpt(value));
    }
    if (!(seconds > 0.0 && seconds <= 60.0)) bad_field("seconds", "0 < seconds <= 60", json_excerpt(value));
    request.frames = std::llround(seconds * request.fps / 4.0) * 4 + 1;
  }
  return request;
}

bool is_reference_field(const std::string& name) {
  return std::any_of(std::begin(kReferenceFields), std::end(kReferenceFields), [&](const ReferenceField& r) { return name == r.name; });
}

nlohmann::json image_response(const engine::GenerationOutput& output) {
  nlohmann::json data = nlohmann::json::array();
  for (const engine::EncodedMedia& media : output.media) data.push_back({{"b64_json", base64_encode(media.bytes)}, {"mime_type", media.mime_type}});
  return {{"created", unix_seconds(std::chrono::system_clock::now())}, {"data", std::move(data)}};
}

nlohmann::json video_object(const engine::RequestSnapshot& snapshot, const std::string& model_name) {
  const GenerationRequest& r = snapshot.request;
  std::string status;
  switch (snapshot.status) {
    case RequestStatus::kQueued: status = "queued"; break;
    case RequestStatus::kRunning: status = "in_progress"; break;
    case RequestStatus::kSucceeded: status = "completed"; break;
    case RequestStatus::kFailed: status = "failed"; break;
    case RequestStatus::kCancelled: status = "cancelled"; break;
  }
  const engine::RequestProgress& p = snapshot.progress;
  int64_t percent = p.total_steps > 0 ? p.step * 100 / p.total_steps : 0;
  if (snapshot.status == RequestStatus::kSucceeded) percent = 100;
  nlohmann::json object = {{"id", r.id},
                           {"object", "video"},
                           {"model", model_name},
                           {"status", status},
                           {"progress", percent},
                           {"created_at", unix_seconds(snapshot.created_at)},
                           {"size", detail::concat(r.width, "x", r.height)},
                           {"seconds", detail::concat(static_cast<double>(r.frames) / r.fps)},
                           {"num_frames", r.frames},
                           {"fps", r.fps},
                           {"seed", r.seed},
                           {"phase", p.phase},
                           {"step", p.step},
                           {"total_steps", p.total_steps != 0 ? p.total_steps : r.num_inference_steps},
                           {"eta_seconds", p.eta_seconds},
                           // The deadline of its run (--request-timeout), from its start; 0: none.
                           {"timeout_seconds", r.timeout_seconds}};
  if (snapshot.status == RequestStatus::kQueued) object["queue_position"] = snapshot.queue_position;
  if (snapshot.output) {
    object["completed_at"] = unix_seconds(snapshot.created_at) + static_cast<int64_t>(snapshot.output->seconds);
    object["run_seconds"] = snapshot.output->seconds;  // from the start of its run to its encoded output
    if (!snapshot.output->error.empty())
      object["error"] = {{"code", status}, {"message", snapshot.output->error}};
  }
  return object;
}

nlohmann::json video_form_to_json(const std::vector<std::pair<std::string, std::string>>& fields) {
  // The SDK sends every form field as text; these are numbers in the JSON form of the request.
  static const std::set<std::string> kIntegers = {"num_inference_steps", "num_frames", "seed"};
  static const std::set<std::string> kNumbers = {"guidance_scale", "guidance_scale_2", "fps"};
  nlohmann::json body = nlohmann::json::object();
  for (const auto& [name, value] : fields) {
    check_utf8(name, "a field name");  // before any message quotes them
    check_utf8(value, name);
    if (body.contains(name)) bad_field(name, "one value", "the field twice");
    // {"image_url": ...} as the SDK's form flattening sends it: input_reference[image_url].
    if (const size_t open = name.find('['); open != std::string::npos && name.back() == ']' && is_reference_field(name.substr(0, open))) {
      nlohmann::json& object = body[name.substr(0, open)];
      if (!object.is_null() && !object.is_object()) bad_field(name.substr(0, open), "one value", "the field twice");
      object[name.substr(open + 1, name.size() - open - 2)] = value;
      continue;
    }
    if (kIntegers.count(name) || kNumbers.count(name)) {
      size_t end = 0;
      try {
        if (kIntegers.count(name)) {
          const long long number = std::stoll(value, &end);
          if (end == value.size()) body[name] = number;
        } else {
          const double number = std::stod(value, &end);
          if (end == value.size()) body[name] = number;
        }
      } catch (const std::logic_error&) {
        end = 0;
      }
      if (!body.contains(name)) bad_field(name, kIntegers.count(name) ? "an integer" : "a number", quoted_excerpt(value));
      continue;
    }
    body[name] = value;
  }
  return body;
}

nlohmann::json video_list(const std::vector<engine::RequestSnapshot>& oldest_first, const std::string& model_name,
                          const std::string& after, int64_t limit, bool newest_first) {
  std::vector<const engine::RequestSnapshot*> ordered;
  for (const engine::RequestSnapshot& snapshot : oldest_first) ordered.push_back(&snapshot);
  if (newest_first) std::reverse(ordered.begin(), ordered.end());
  size_t start = 0;
  if (!after.empty()) {
    const auto found = std::find_if(ordered.begin(), ordered.end(), [&](const auto* s) { return s->request.id == after; });
    if (found == ordered.end()) throw ApiError(404, "after", "after: no video " + quoted_excerpt(after));
    start = static_cast<size_t>(found - ordered.begin()) + 1;
  }
  nlohmann::json data = nlohmann::json::array();
  for (size_t i = start; i < ordered.size() && static_cast<int64_t>(data.size()) < limit; ++i)
    data.push_back(video_object(*ordered[i], model_name));
  const bool more = start + data.size() < ordered.size();
  return {{"object", "list"},
          {"data", data},
          {"first_id", data.empty() ? nlohmann::json() : data.front()["id"]},
          {"last_id", data.empty() ? nlohmann::json() : data.back()["id"]},
          {"has_more", more}};
}

nlohmann::json error_body(const std::string& message, const std::string& type, const std::string& param) {
  return {{"error", {{"message", message}, {"type", type}, {"param", param.empty() ? nlohmann::json() : nlohmann::json(param)}, {"code", nullptr}}}};
}

}  // namespace tessel::serve
