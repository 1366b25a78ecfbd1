#include "wire_format.h"

#include <cstring>

#include "tessel/core/error.h"

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

nlohmann::json request_to_json(const GenerationRequest& r) {
  return {{"id", r.id},
          {"kind", output_kind_name(r.kind)},
          {"prompt", r.prompt},
          {"negative_prompt", r.negative_prompt},
          {"width", r.width},
          {"height", r.height},
          {"frames", r.frames},
          {"num_outputs", r.num_outputs},
          {"num_inference_steps", r.num_inference_steps},
          {"guidance_scale", r.guidance_scale},
          {"seed", r.seed},
          {"fps", r.fps},
          {"sparse_attention", r.sparse_attention},
          {"cache", r.cache}};
}

GenerationRequest request_from_json(const nlohmann::json& j) {
  GenerationRequest r;
  r.id = j.at("id").get<std::string>();
  r.kind = j.at("kind") == "video" ? OutputKind::kVideo : OutputKind::kImage;
  r.prompt = j.at("prompt").get<std::string>();
  r.negative_prompt = j.at("negative_prompt").get<std::string>();
  r.width = j.at("width").get<int64_t>();
  r.height = j.at("height").get<int64_t>();
  r.frames = j.at("frames").get<int64_t>();
  r.num_outputs = j.at("num_outputs").get<int64_t>();
  r.num_inference_steps = j.at("num_inference_steps").get<int64_t>();
  r.guidance_scale = j.at("guidance_scale").get<double>();
  r.seed = j.at("seed").get<uint64_t>();
  r.fps = j.at("fps").get<double>();
  r.sparse_attention = j.at("sparse_attention").get<std::string>();
  r.cache = j.at("cache").get<std::string>();
  return r;
}

nlohmann::json progress_to_json(const RequestProgress& p) {
  return {{"step", p.step},
          {"total_steps", p.total_steps},
          {"step_seconds", p.step_seconds},
          {"elapsed_seconds", p.elapsed_seconds},
          {"eta_seconds", p.eta_seconds},
          {"attention_density", p.attention_density},
          {"device_memory_used_bytes", p.device_memory_used_bytes}};
}

RequestProgress progress_from_json(const nlohmann::json& j) {
  RequestProgress p;
  p.step = j.at("step").get<int64_t>();
  p.total_steps = j.at("total_steps").get<int64_t>();
  p.step_seconds = j.at("step_seconds").get<double>();
  p.elapsed_seconds = j.at("elapsed_seconds").get<double>();
  p.eta_seconds = j.at("eta_seconds").get<double>();
  p.attention_density = j.at("attention_density").get<double>();
  p.device_memory_used_bytes = j.at("device_memory_used_bytes").get<int64_t>();
  return p;
}

nlohmann::json setup_to_json(const RunnerSetup& s) {
  return {{"model_dir", s.model_dir}, {"rank", s.rank}, {"world_size", s.world_size}, {"config_json", s.config_json}};
}

RunnerSetup setup_from_json(const nlohmann::json& j) {
  RunnerSetup s;
  s.model_dir = j.at("model_dir").get<std::string>();
  s.rank = j.at("rank").get<int>();
  s.world_size = j.at("world_size").get<int>();
  s.config_json = j.at("config_json").get<std::string>();
  return s;
}

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
