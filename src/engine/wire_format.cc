#include "wire_format.h"

#include <cstring>

#include "tessel/core/error.h"

namespace tessel::engine {

// The messages between the engine and its workers carry these types as JSON objects with a key per
// field; every key is required when reading (a message missing one is malformed).
NLOHMANN_JSON_SERIALIZE_ENUM(OutputKind, {{OutputKind::kImage, "image"}, {OutputKind::kVideo, "video"}})
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(GenerationRequest, id, kind, prompt, negative_prompt, width, height, frames, num_outputs,
                                   num_inference_steps, guidance_scale, guidance_scale_2, seed, fps, sparse_attention, cache, lora)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(RequestProgress, phase, step_finished, step, total_steps, step_seconds, elapsed_seconds, eta_seconds,
                                   attention_density, device_memory_used_bytes)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(RunnerSetup, model_dir, rank, world_size, config_json, group_world)

}  // namespace tessel::engine

namespace tessel::engine::wire {

std::string encode(const nlohmann::json& header, std::string_view payload) {
  const std::string text = header.dump();
  const uint32_t length = static_cast<uint32_t>(text.size());
  std::string bytes(4, '\0');
  for (int i = 0; i < 4; ++i) bytes[i] = static_cast<char>((length >> (8 * i)) & 0xff);
  bytes += text;
  bytes.append(payload.data(), payload.size());
  return bytes;
}

Message decode(std::string_view bytes) {
  TESSEL_CHECK(bytes.size() >= 4, "engine message: expected at least 4 bytes, got ", bytes.size());
  uint32_t length = 0;
  for (int i = 0; i < 4; ++i) length |= static_cast<uint32_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  TESSEL_CHECK(length <= bytes.size() - 4, "engine message: header of ", length, " bytes in a message of ", bytes.size());
  Message message;
  message.header = nlohmann::json::parse(bytes.substr(4, length), nullptr, false);
  TESSEL_CHECK(message.header.is_object() && message.header.contains("type") && message.header["type"].is_string(),
               "engine message: the header is not a JSON object with a string \"type\"");
  message.payload = std::string(bytes.substr(4 + length));
  return message;
}

std::string Message::type() const { return header.at("type").get<std::string>(); }

nlohmann::json request_to_json(const GenerationRequest& r) { return r; }
GenerationRequest request_from_json(const nlohmann::json& j) { return j.get<GenerationRequest>(); }

void images_to_payload(const GenerationRequest& request, nlohmann::json& entry, std::string& payload) {
  for (const auto& [key, image] : {std::pair{"image", &request.image}, std::pair{"last_image", &request.last_image}}) {
    if (!*image) continue;
    entry[key] = {payload.size(), (*image)->size()};
    payload += **image;
  }
}

void images_from_payload(const nlohmann::json& entry, std::string_view payload, GenerationRequest& request) {
  for (const auto& [key, image] : {std::pair{"image", &request.image}, std::pair{"last_image", &request.last_image}}) {
    const auto place = entry.find(key);
    if (place == entry.end()) continue;
    const size_t offset = place->at(0).get<size_t>(), size = place->at(1).get<size_t>();
    TESSEL_CHECK(offset <= payload.size() && size <= payload.size() - offset, "engine message: ", key, " at ", offset, " + ", size,
                 " outside a payload of ", payload.size(), " bytes");
    *image = std::make_shared<const std::string>(payload.substr(offset, size));
  }
}

nlohmann::json progress_to_json(const RequestProgress& p) { return p; }
RequestProgress progress_from_json(const nlohmann::json& j) { return j.get<RequestProgress>(); }
nlohmann::json setup_to_json(const RunnerSetup& s) { return s; }
RunnerSetup setup_from_json(const nlohmann::json& j) { return j.get<RunnerSetup>(); }

std::string tensors_to_payload(const std::vector<Tensor>& tensors, nlohmann::json& header) {
  std::string payload;
  nlohmann::json list = nlohmann::json::array();
  for (const Tensor& tensor : tensors) {
    TESSEL_CHECK(tensor.device().is_cpu(), "engine result: expected CPU tensors, got ", tensor.view().describe());
    const Tensor contiguous = tensor.view().is_contiguous() ? tensor : tensor.clone();
    list.push_back({{"dtype", dtype_name(contiguous.dtype())}, {"shape", contiguous.shape()}});
    payload.append(static_cast<const char*>(contiguous.data()), contiguous.nbytes());
  }
  header["tensors"] = std::move(list);
  return payload;
}

std::vector<Tensor> tensors_from_payload(const nlohmann::json& header, std::string_view payload) {
  std::vector<Tensor> tensors;
  size_t offset = 0;
  for (const nlohmann::json& entry : header.at("tensors")) {
    Tensor tensor = Tensor::empty(entry.at("shape").get<Shape>(), parse_dtype(entry.at("dtype").get<std::string>()));
    TESSEL_CHECK(offset + tensor.nbytes() <= payload.size(), "engine result: payload of ", payload.size(),
                 " bytes is shorter than its tensors");
    std::memcpy(tensor.data(), payload.data() + offset, tensor.nbytes());
    offset += tensor.nbytes();
    tensors.push_back(std::move(tensor));
  }
  return tensors;
}

}  // namespace tessel::engine::wire
