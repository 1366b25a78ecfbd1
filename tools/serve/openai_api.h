// The JSON of the server's API, apart from the HTTP plumbing so tests can call it: request bodies
// of the OpenAI images API and of the video API (as vLLM-Omni serves it) mapped onto
// GenerationRequest, and the response objects. A body that does not fit is an ApiError naming the
// field (HTTP 400).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessel/core/error.h"
#include "tessel/engine/request.h"
#include "tessel/engine/request_scheduler.h"

namespace tessel::serve {

// A client error: `status` is the HTTP status, `field` the request field at fault (may be empty).
class ApiError : public Error {
 public:
  ApiError(int status, std::string field, const std::string& message)
      : Error(message), status_(status), field_(std::move(field)) {}
  int status() const { return status_; }
  const std::string& field() const { return field_; }

 private:
  int status_;
  std::string field_;
};

// What a request may ask for beyond the model type's own checks (the engine's pre-processing).
struct ApiDefaults {
  std::string model_name;            // the id /v1/models lists; a request's "model" must match it
  int64_t default_steps = 50;
  double default_guidance = 5.0;
  int64_t default_width = 832;
  int64_t default_height = 480;
  int64_t default_frames = 81;
  double default_fps = 16.0;
  // The most bytes of reference images (input_reference and last_frame together, as PNG/JPEG) a
  // video request may bring: two 1280x720 PNGs of incompressible pixels fit. The engine's
  // max_reference_bytes is the same bound.
  size_t max_reference_bytes = 8 << 20;
};

// POST /v1/images/generations: prompt (required), n, size "WxH", response_format ("b64_json"),
// model, and the extras negative_prompt, num_inference_steps, guidance_scale, seed,
// sparse_attention. Unknown fields are refused (a typo must not pass silently), except OpenAI's
// quality, style and user, which change nothing here.
engine::GenerationRequest parse_image_request(const std::string& body, const ApiDefaults& defaults);
// POST /v1/videos: prompt (required), model, size "WxH", seconds or num_frames, fps, the same
// extras, and image to video's input_reference (the first frame) and last_frame (FLF2V, Wan 2.2
// I2V-A14B): each a multipart file part (`file_parts`, by field name: PNG or JPEG bytes), or in the
// body a data URL ("data:image/png;base64,..."), a bare base64 string, or {"image_url": a data
// URL} (OpenAI's ImageInputReferenceParam). Remote URLs and file_id are refused naming the field;
// each image is decoded here once (corrupt, another format, too many pixels: a 400 naming the
// field) and sent on as its bytes. Whether the model takes it is the engine's check.
engine::GenerationRequest parse_video_request(const std::string& body, const ApiDefaults& defaults);
engine::GenerationRequest parse_video_request(const nlohmann::json& body, const ApiDefaults& defaults,
                                              const std::map<std::string, std::string>& file_parts = {});
// The body fields that hold reference images (input_reference, last_frame).
bool is_reference_field(const std::string& name);
// A multipart/form-data video request (as the OpenAI SDK's videos.create sends it) as the JSON
// body it stands for: the numeric fields (num_inference_steps, num_frames, seed, guidance_scale,
// guidance_scale_2, fps) parsed from their text, an unparsable one or a repeated field an ApiError;
// "input_reference[image_url]" (how the SDK sends {"image_url": ...} in a form) as that object.
nlohmann::json video_form_to_json(const std::vector<std::pair<std::string, std::string>>& fields);
// GET /v1/videos: {"object": "list", "data": [video objects], "first_id", "last_id", "has_more"},
// newest first unless `newest_first` is false, the page after the video `after` (404 when unknown),
// at most `limit` entries.
nlohmann::json video_list(const std::vector<engine::RequestSnapshot>& oldest_first, const std::string& model_name,
                          const std::string& after, int64_t limit, bool newest_first);

// {"created": unix time, "data": [{"b64_json": ...}, ...]}
nlohmann::json image_response(const engine::GenerationOutput& output);
// The video job object: id, object "video", model, status (queued, in_progress, completed,
// failed, cancelled), progress (0..100), created_at, completed_at, run_seconds (once final: the
// run and the encoding), size, seconds, num_frames, the step counts and ETA, and error when failed.
nlohmann::json video_object(const engine::RequestSnapshot& snapshot, const std::string& model_name);
// {"error": {"message", "type", "param", "code"}}, OpenAI's error shape.
nlohmann::json error_body(const std::string& message, const std::string& type, const std::string& param = "");

}  // namespace tessel::serve
