#include "transformers_files.h"

#include <algorithm>
#include <fstream>

#include "tessel/core/error.h"
#include "tessel/core/io/bounded_read.h"
#include "tessel/core/io/limited_json.h"

namespace tessel::diffusion {

std::vector<std::string> transformers_weight_files(const std::string& directory, const std::string& what) {
  const std::string index_path = directory + "/model.safetensors.index.json";
  if (!std::ifstream(index_path).good()) return {"model.safetensors"};
  const nlohmann::json index = parse_json_limited(
      read_file_bounded(index_path, kMaxTransformersJsonBytes, what + " index"), JsonLimits{}, index_path);
  const auto map = index.find("weight_map");
  if (!index.is_object() || map == index.end() || !map->is_object())
    fail_argument(index_path, "a JSON object with a weight_map object", json_excerpt(index));
  std::vector<std::string> files;
  for (const auto& [name, file] : map->items()) {
    if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos)
      fail_argument(index_path + ": weight_map[" + name + "]", "a file name in the directory", json_excerpt(file));
    if (std::find(files.begin(), files.end(), file.get<std::string>()) == files.end()) files.push_back(file.get<std::string>());
  }
  return files;
}

}  // namespace tessel::diffusion
