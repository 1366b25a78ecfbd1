// The messages between the engine and its workers: a JSON header (the message type and its
// fields) followed by a binary payload (raw tensor bytes), as
// [4-byte little-endian header length][header JSON][payload].
//
// Engine -> workers (broadcast): {"type":"init", "setup":{...}}, {"type":"generate",
// "requests":[{"seq":N, "lane":L, "request":{...}, "image":[offset, size]}, ...]} with the requests'
// reference images (PNG/JPEG bytes) as the payload (the requests that join the batch at the
// next step boundary), {"type":"shutdown"}. Rank 0 -> engine: {"type":"progress", "seq":N, ...},
// {"type":"step", "batch":B, "seconds":S} after each step of the batch, {"type":"result", "seq":N,
// "status":..., "error":..., "tensors":[{"dtype","shape"}...]} with the tensors' bytes in order as
// the payload.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessel/core/tensor.h"
#include "tessel/engine/pipeline_runner.h"
#include "tessel/engine/request.h"

namespace tessel::engine::wire {

std::string encode(const nlohmann::json& header, std::string_view payload = {});

struct Message {
  nlohmann::json header;
  std::string payload;
  std::string type() const;
};
// Throws Error when the bytes are not a message.
Message decode(std::string_view bytes);

// A request's fields but its images (whose bytes are not JSON text: see below).
nlohmann::json request_to_json(const GenerationRequest& request);
GenerationRequest request_from_json(const nlohmann::json& json);
// A request's reference images as bytes appended to `payload`, with their place recorded in
// `entry` ({"image": [offset, size], "last_image": [...]}, only those present); and back.
void images_to_payload(const GenerationRequest& request, nlohmann::json& entry, std::string& payload);
void images_from_payload(const nlohmann::json& entry, std::string_view payload, GenerationRequest& request);
nlohmann::json progress_to_json(const RequestProgress& progress);
RequestProgress progress_from_json(const nlohmann::json& json);
nlohmann::json setup_to_json(const RunnerSetup& setup);
RunnerSetup setup_from_json(const nlohmann::json& json);

// Appends the tensors' descriptions to header["tensors"] and returns their bytes (CPU tensors,
// any dtype; non-contiguous ones are copied).
std::string tensors_to_payload(const std::vector<Tensor>& tensors, nlohmann::json& header);
std::vector<Tensor> tensors_from_payload(const nlohmann::json& header, std::string_view payload);

}  // namespace tessel::engine::wire
