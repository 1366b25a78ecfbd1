#include "tessel/diffusion/clip_image_processor.h"

#include <algorithm>
#include <cmath>

#include "tessel/core/error.h"
#include "tessel/core/io/limited_json.h"
#include "tessel/diffusion/pil_resize.h"

namespace tessel {
namespace {

constexpr int64_t kMaxSide = int64_t{1} << 16;

}  // namespace

void ClipImageProcessing::validate() const {
  const std::pair<const char*, int64_t> sizes[] = {
      {"shortest_edge", shortest_edge}, {"crop_height", crop_height}, {"crop_width", crop_width}};
  for (const auto& [name, value] : sizes)
    if (value < 1 || value > kMaxSide) fail_argument(name, detail::concat("an integer in [1, ", kMaxSide, "]"), value);
  if (crop_height > shortest_edge) fail_argument("crop_height", detail::concat("at most shortest_edge ", shortest_edge), crop_height);
  if (crop_width > shortest_edge) fail_argument("crop_width", detail::concat("at most shortest_edge ", shortest_edge), crop_width);
  if (!(rescale_factor > 0.0)) fail_argument("rescale_factor", "a positive number", rescale_factor);
  for (float value : image_std)
    if (!(value > 0.0f)) fail_argument("image_std", "positive numbers", value);
}

namespace {

int64_t side(const nlohmann::json& value, const std::string& where) {
  if (!value.is_number_integer()) fail_argument(where, "an integer", json_excerpt(value));
  return value.get<int64_t>();  // validate() bounds it
}

}  // namespace

ClipImageProcessing parse_clip_image_processing(std::string_view json_text, const std::string& source) {
  const nlohmann::json json = parse_json_limited(json_text, JsonLimits{}, source);
  if (!json.is_object()) fail_argument(source, "a JSON object", json_excerpt(json));
  ClipImageProcessing p;
  for (const char* step : {"do_resize", "do_center_crop", "do_rescale", "do_normalize"}) {
    const auto flag = json.find(step);
    if (flag != json.end() && !(flag->is_boolean() && flag->get<bool>()))
      fail_argument(source + ": " + step, "true (tessel's CLIP preprocessing always runs this step)", json_excerpt(*flag));
  }
  if (const auto resample = json.find("resample"); resample != json.end() && !(resample->is_number_integer() && *resample == 3))
    fail_argument(source + ": resample", "3 (bicubic, the filter CLIP was trained with)", json_excerpt(*resample));
  if (const auto size = json.find("size"); size != json.end()) {
    if (size->is_object() && size->contains("shortest_edge"))
      p.shortest_edge = side((*size)["shortest_edge"], source + ": size.shortest_edge");
    else if (size->is_number_integer())
      p.shortest_edge = side(*size, source + ": size");
    else
      fail_argument(source + ": size", "{\"shortest_edge\": N} or N", json_excerpt(*size));
  }
  if (const auto crop = json.find("crop_size"); crop != json.end()) {
    if (crop->is_object() && crop->contains("height") && crop->contains("width")) {
      p.crop_height = side((*crop)["height"], source + ": crop_size.height");
      p.crop_width = side((*crop)["width"], source + ": crop_size.width");
    } else if (crop->is_number_integer()) {
      p.crop_height = p.crop_width = side(*crop, source + ": crop_size");
    } else {
      fail_argument(source + ": crop_size", "{\"height\": H, \"width\": W} or N", json_excerpt(*crop));
    }
  }
  if (const auto factor = json.find("rescale_factor"); factor != json.end()) {
    if (!factor->is_number()) fail_argument(source + ": rescale_factor", "a number", json_excerpt(*factor));
    p.rescale_factor = factor->get<double>();
  }
  for (const auto& [key, values] : {std::pair{"image_mean", &p.image_mean}, {"image_std", &p.image_std}}) {
    const auto list = json.find(key);
    if (list == json.end()) continue;
    if (!list->is_array() || list->size() != 3 || !std::all_of(list->begin(), list->end(), [](const auto& v) { return v.is_number(); }))
      fail_argument(source + ": " + key, "3 numbers (red, green, blue)", json_excerpt(*list));
    for (size_t i = 0; i < 3; ++i) (*values)[i] = (*list)[i].get<float>();
  }
  try {
    p.validate();
  } catch (const Error& e) {
    throw Error(source + ": " + e.what());
  }
  return p;
}

std::pair<int64_t, int64_t> clip_resized_size(int64_t height, int64_t width, int64_t shortest_edge) {
  const int64_t shorter = std::min(height, width), longer = std::max(height, width);
  const auto longer_out =
      static_cast<int64_t>(static_cast<double>(shortest_edge * longer) / static_cast<double>(shorter));
  return height <= width ? std::pair{shortest_edge, longer_out} : std::pair{longer_out, shortest_edge};
}

Tensor clip_preprocess(const VideoFrames& images, const ClipImageProcessing& processing) {
  try {
    images.validate();
  } catch (const std::exception& e) {
    throw Error(std::string("images: ") + e.what());
  }
  if (images.count < 1) fail_argument("images", "at least one image", images.count);
  if (images.height > kMaxSide || images.width > kMaxSide)
    fail_argument("images", detail::concat("sides of at most ", kMaxSide, " pixels"),
                  detail::concat(images.height, " x ", images.width));
  processing.validate();
  const auto [height, width] = clip_resized_size(images.height, images.width, processing.shortest_edge);
  const int64_t crop_h = processing.crop_height, crop_w = processing.crop_width;
  const int64_t top = (height - crop_h) / 2, left = (width - crop_w) / 2;
  Tensor out = Tensor::empty({images.count, 3, crop_h, crop_w}, DType::kF32);
  for (int64_t index = 0; index < images.count; ++index) {
    const std::vector<uint8_t> resized = resize_pil(images.frame(index), images.height, images.width, height, width, PilFilter::kBicubic);
    float* planes = out.data_as<float>() + index * 3 * crop_h * crop_w;
    for (int64_t channel = 0; channel < 3; ++channel)
      for (int64_t y = 0; y < crop_h; ++y)
        for (int64_t x = 0; x < crop_w; ++x) {
          // numpy's order and precision: the byte times the factor in double, stored as float;
          // then (x - mean) / std in float.
          const float value = static_cast<float>(resized[static_cast<size_t>(((top + y) * width + left + x) * 3 + channel)] *
                                                 processing.rescale_factor);
          planes[(channel * crop_h + y) * crop_w + x] =
              (value - processing.image_mean[static_cast<size_t>(channel)]) / processing.image_std[static_cast<size_t>(channel)];
        }
  }
  return out;
}

}  // namespace tessel
