// The preprocessing of the CLIP vision encoder's input, as transformers' CLIPImageProcessor does it
// with its PIL backend (the one diffusers' WanImageToVideoPipeline runs when torchvision is absent;
// its torchvision backend resizes differently): resize the shortest edge with PIL's bicubic filter
// on 8-bit pixels, center crop, rescale by 1/255, normalize with CLIP's mean and std.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tessel/core/tensor.h"
#include "tessel/diffusion/video_frames.h"

namespace tessel {

// CLIPImageProcessor's settings; the defaults are Wan 2.1's (image_encoder 224 x 224).
struct ClipImageProcessing {
  int64_t shortest_edge = 224;  // size["shortest_edge"]
  int64_t crop_height = 224;    // crop_size["height"]
  int64_t crop_width = 224;     // crop_size["width"]
  double rescale_factor = 1.0 / 255.0;
  std::array<float, 3> image_mean = {0.48145466f, 0.4578275f, 0.40821073f};
  std::array<float, 3> image_std = {0.26862954f, 0.26130258f, 0.27577711f};
  // Throws Error naming the field when a size is out of range, a crop is larger than
  // shortest_edge (transformers would pad it with zeros; that never happens for CLIP's settings),
  // or a std is not positive.
  void validate() const;
};

// transformers' preprocessor_config.json of a CLIPImageProcessor (a diffusers I2V directory's
// image_processor/): size ({"shortest_edge": N} or N), crop_size ({"height", "width"} or N),
// rescale_factor, image_mean, image_std. The steps tessel always runs must be on (do_resize,
// do_center_crop, do_rescale, do_normalize true or absent) and resample 3 (bicubic); other keys
// are transformers' bookkeeping and are ignored. Throws Error naming `source` and the key.
ClipImageProcessing parse_clip_image_processing(std::string_view json_text, const std::string& source = "preprocessor_config.json");

// The (height, width) the resize makes of an image: the shorter edge becomes `shortest_edge`, the
// longer one int(shortest_edge * long / short), as transformers' get_resize_output_image_size.
std::pair<int64_t, int64_t> clip_resized_size(int64_t height, int64_t width, int64_t shortest_edge);

// CLIPImageProcessor on each frame of `images` (RGB, video_frames.h's layout, as read_png returns
// them): (count, 3, crop_height, crop_width) fp32. Throws Error naming `images` when they are
// empty or malformed, or a field of `processing`.
Tensor clip_preprocess(const VideoFrames& images, const ClipImageProcessing& processing = {});

}  // namespace tessel
