#include "bench_mask_export.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessel/core/error.h"

namespace tessel::cli {
namespace {

void write_int32(const std::filesystem::path& path, const std::vector<int32_t>& values) {
  std::ofstream file(path, std::ios::binary);
  file.write(reinterpret_cast<const char*>(values.data()), static_cast<std::streamsize>(values.size() * sizeof(int32_t)));
  if (!file) throw Error(detail::concat("--save-mask: could not write ", path.string()));
}

}  // namespace

void save_bench_mask(const BenchConfig& config, double requested_density, const BlockMask* mask) {
  const BlockMaskShape shape{config.batch,           config.heads,   config.seq,
                             config.effective_seq_kv(), config.block_q, config.block_kv};
  const BlockMask full = mask ? BlockMask{} : BlockMask::full(shape);
  const BlockMask& m = mask ? *mask : full;
  const std::filesystem::path dir(config.save_mask_dir);
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) throw Error(detail::concat("--save-mask: could not create ", dir.string(), ": ", error.message()));
  char name[128];
  std::snprintf(name, sizeof name, "s%lld_d%.3f_b%lldx%lld%s", static_cast<long long>(config.seq), requested_density,
                static_cast<long long>(config.block_q), static_cast<long long>(config.block_kv),
                config.causal ? "_causal" : "");
  const BlockMaskShape& s = m.shape();
  const FlexBlockMask flex = m.to_flex();
  write_int32(dir / (std::string(name) + ".kv_num_blocks.i32"), flex.kv_num_blocks);
  write_int32(dir / (std::string(name) + ".kv_indices.i32"), flex.kv_indices);
  const nlohmann::json meta = {{"seq_q", s.seq_q},         {"seq_kv", s.seq_kv},        {"block_q", s.block_q},
                               {"block_kv", s.block_kv},   {"mask_batch", s.mask_batch}, {"mask_heads", s.mask_heads},
                               {"q_blocks", s.q_blocks()}, {"kv_blocks", s.kv_blocks()}, {"density", m.density()},
                               {"causal", config.causal}};
  std::ofstream file(dir / (std::string(name) + ".json"));
  file << meta.dump(1) << "\n";
  if (!file) throw Error(detail::concat("--save-mask: could not write ", (dir / name).string(), ".json"));
}

}  // namespace tessel::cli
