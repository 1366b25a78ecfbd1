#include "tessel/kv/offload_engine.h"

#include <algorithm>
#include <cstring>

#include "tessel/core/error.h"

namespace tessel::kv {

OffloadEngine::OffloadEngine(const OffloadConfig& config, Device device) : config_(config), device_(device) {
  if (config.num_layers <= 0) fail_argument("config.num_layers", "> 0", config.num_layers);
  if (config.num_host_blocks <= 0) fail_argument("config.num_host_blocks", "> 0", config.num_host_blocks);
  if (config.block_size <= 0) fail_argument("config.block_size", "> 0", config.block_size);
  if (config.num_kv_heads <= 0) fail_argument("config.num_kv_heads", "> 0", config.num_kv_heads);
  if (config.head_dim <= 0) fail_argument("config.head_dim", "> 0", config.head_dim);
  if (config.num_slots <= 0) fail_argument("config.num_slots", "> 0", config.num_slots);
  if (config.max_chunk_tokens <= 0) fail_argument("config.max_chunk_tokens", "> 0", config.max_chunk_tokens);
  if (!is_floating(config.dtype) || config.dtype == DType::kF64)
    fail_argument("config.dtype", "fp32, fp16 or bf16", dtype_name(config.dtype));
}

OffloadEngine::~OffloadEngine() = default;

void OffloadEngine::allocate_buffers(MemoryKind host_kind) {
  const OffloadConfig& c = config_;
  const Shape host_shape{c.num_layers, c.num_host_blocks, c.block_size, c.num_kv_heads, c.head_dim};
  host_k_ = Tensor::empty(host_shape, c.dtype, Device::cpu(), host_kind);
  host_v_ = Tensor::empty(host_shape, c.dtype, Device::cpu(), host_kind);
  const Shape slot_shape{c.num_slots, c.block_size, c.num_kv_heads, c.head_dim};
  slots_k_ = Tensor::empty(slot_shape, c.dtype, device_);
  slots_v_ = Tensor::empty(slot_shape, c.dtype, device_);
  const Shape prefill_shape{c.num_layers, c.max_chunk_tokens, c.num_kv_heads, c.head_dim};
  prefill_k_ = Tensor::empty(prefill_shape, c.dtype, device_);
  prefill_v_ = Tensor::empty(prefill_shape, c.dtype, device_);
  const Shape decode_shape{c.num_layers, c.block_size, c.num_kv_heads, c.head_dim};
  decode_k_ = Tensor::empty(decode_shape, c.dtype, device_);
  decode_v_ = Tensor::empty(decode_shape, c.dtype, device_);
}

namespace {
char* at(const Tensor& t, int64_t element_offset) {
  return static_cast<char*>(t.data()) + element_offset * static_cast<int64_t>(dtype_size(t.dtype()));
}
}  // namespace

char* OffloadEngine::host_k_ptr(int64_t layer, int64_t block) const {
  return at(host_k_, (layer * config_.num_host_blocks + block) * block_elements());
}
char* OffloadEngine::host_v_ptr(int64_t layer, int64_t block) const {
  return at(host_v_, (layer * config_.num_host_blocks + block) * block_elements());
}
char* OffloadEngine::slot_k_ptr(int64_t slot) const { return at(slots_k_, slot * block_elements()); }
char* OffloadEngine::slot_v_ptr(int64_t slot) const { return at(slots_v_, slot * block_elements()); }
char* OffloadEngine::prefill_k_ptr(int64_t layer, int64_t row) const {
  return at(prefill_k_, (layer * config_.max_chunk_tokens + row) * config_.num_kv_heads * config_.head_dim);
}
char* OffloadEngine::prefill_v_ptr(int64_t layer, int64_t row) const {
  return at(prefill_v_, (layer * config_.max_chunk_tokens + row) * config_.num_kv_heads * config_.head_dim);
}
char* OffloadEngine::decode_k_ptr(int64_t layer, int64_t row) const {
  return at(decode_k_, (layer * config_.block_size + row) * config_.num_kv_heads * config_.head_dim);
}
char* OffloadEngine::decode_v_ptr(int64_t layer, int64_t row) const {
  return at(decode_v_, (layer * config_.block_size + row) * config_.num_kv_heads * config_.head_dim);
}

void OffloadEngine::check_layer(int64_t layer) const {
  if (layer < 0 || layer >= config_.num_layers)
    fail_argument("layer", detail::concat("in [0, ", config_.num_layers, ")"), layer);
}
void OffloadEngine::check_slot(int64_t slot) const {
  if (slot < 0 || slot >= config_.num_slots)
    fail_argument("slot", detail::concat("in [0, ", config_.num_slots, ")"), slot);
}
void OffloadEngine::check_host_block(int64_t block) const {
  if (block < 0 || block >= config_.num_host_blocks)
    fail_argument("host_block", detail::concat("in [0, ", config_.num_host_blocks, ")"), block);
}

void OffloadEngine::check_kv_rows(const TensorView& t, const std::string& argument, int64_t max_rows) const {
  check_rank(t, 4, argument);
  check_dtype(t, config_.dtype, argument);
  check_contiguous(t, argument);
  if (!(t.device() == device_) && !t.device().is_cpu())
    fail_argument(argument + ".device", detail::concat(device_.str(), " or cpu"), t.device().str());
  if (t.size(0) != 1 || t.size(2) != config_.num_kv_heads || t.size(3) != config_.head_dim || t.size(1) < 1 ||
      t.size(1) > max_rows)
    fail_argument(argument + ".shape",
                  detail::concat("(1, 1..", max_rows, ", ", config_.num_kv_heads, ", ", config_.head_dim, ")"),
                  shape_str(t.shape()));
}

KvPair OffloadEngine::device_rows(const Tensor& k, const Tensor& v, int64_t offset_rows, int64_t rows) const {
  const int64_t row_elements = config_.num_kv_heads * config_.head_dim;
  const Shape shape{1, rows, config_.num_kv_heads, config_.head_dim};
  return {TensorView(at(k, offset_rows * row_elements), config_.dtype, device_, shape),
          TensorView(at(v, offset_rows * row_elements), config_.dtype, device_, shape)};
}

void OffloadEngine::load_to_slot_layer(int64_t slot, int64_t layer, int64_t host_block) {
  check_slot(slot);
  check_layer(layer);
  check_host_block(host_block);
  do_load(slot, layer, host_block);
  std::lock_guard lock(stats_mutex_);
  stats_.loads += 1;
  stats_.bytes_h2d += static_cast<int64_t>(2 * block_bytes());
}

void OffloadEngine::wait_slot_layer(int64_t slot) {
  check_slot(slot);
  do_wait_slot(slot);
}

KvPair OffloadEngine::get_kv_for_slot(int64_t slot, int64_t num_tokens) const {
  check_slot(slot);
  if (num_tokens == -1) num_tokens = config_.block_size;
  if (num_tokens < 1 || num_tokens > config_.block_size)
    fail_argument("num_tokens", detail::concat("-1 or in [1, ", config_.block_size, "]"), num_tokens);
  return device_rows(slots_k_, slots_v_, slot * config_.block_size, num_tokens);
}

void OffloadEngine::record_slot_compute_done(int64_t slot) {
  check_slot(slot);
  do_record_compute_done(slot);
}

void OffloadEngine::store_prefill_kv(int64_t layer, const TensorView& k, const TensorView& v) {
  check_layer(layer);
  check_kv_rows(k, "k", config_.max_chunk_tokens);
  check_kv_rows(v, "v", config_.max_chunk_tokens);
  if (k.size(1) != v.size(1)) fail_argument("v.shape", shape_str(k.shape()), shape_str(v.shape()));
  do_store(layer, false, prefill_k_ptr(layer, 0), prefill_v_ptr(layer, 0), k, v);
}

KvPair OffloadEngine::get_prefill_buffer_slice(int64_t layer, int64_t num_tokens) const {
  check_layer(layer);
  if (num_tokens < 1 || num_tokens > config_.max_chunk_tokens)
    fail_argument("num_tokens", detail::concat("in [1, ", config_.max_chunk_tokens, "]"), num_tokens);
  return device_rows(prefill_k_, prefill_v_, layer * config_.max_chunk_tokens, num_tokens);
}

void OffloadEngine::offload_prefill_blocks(int64_t layer, std::span<const int32_t> host_blocks, int64_t num_tokens) {
  check_layer(layer);
  if (num_tokens < 1 || num_tokens > config_.max_chunk_tokens)
    fail_argument("num_tokens", detail::concat("in [1, ", config_.max_chunk_tokens, "]"), num_tokens);
  const int64_t needed = (num_tokens + config_.block_size - 1) / config_.block_size;
  if (static_cast<int64_t>(host_blocks.size()) != needed)
    fail_argument("host_blocks.size()", detail::concat(needed, " (one per block of ", num_tokens, " tokens)"),
                  host_blocks.size());
  for (int32_t b : host_blocks) check_host_block(b);
  const size_t row_bytes = static_cast<size_t>(config_.num_kv_heads * config_.head_dim) * dtype_size(config_.dtype);
  std::vector<BlockCopy> copies;
  for (int64_t i = 0; i < needed; ++i) {
    const int64_t first = i * config_.block_size;
    const int64_t rows = std::min(config_.block_size, num_tokens - first);
    copies.push_back({prefill_k_ptr(layer, first), prefill_v_ptr(layer, first), host_k_ptr(layer, host_blocks[i]),
                      host_v_ptr(layer, host_blocks[i]), static_cast<size_t>(rows) * row_bytes});
  }
  do_offload(layer, false, copies);
  std::lock_guard lock(stats_mutex_);
  stats_.offloads += needed;
  for (const BlockCopy& c : copies) stats_.bytes_d2h += static_cast<int64_t>(2 * c.bytes);
}

void OffloadEngine::store_decode_kv(int64_t layer, int64_t position, const TensorView& k, const TensorView& v) {
  check_layer(layer);
  if (position < 0 || position >= config_.block_size)
    fail_argument("position", detail::concat("in [0, ", config_.block_size, ")"), position);
  check_kv_rows(k, "k", config_.block_size - position);
  check_kv_rows(v, "v", config_.block_size - position);
  if (k.size(1) != v.size(1)) fail_argument("v.shape", shape_str(k.shape()), shape_str(v.shape()));
  do_store(layer, true, decode_k_ptr(layer, position), decode_v_ptr(layer, position), k, v);
}

KvPair OffloadEngine::decode_buffer_slice(int64_t layer, int64_t start, int64_t end) const {
  check_layer(layer);
  if (start < 0 || end <= start || end > config_.block_size)
    fail_argument("[start, end)", detail::concat("0 <= start < end <= ", config_.block_size),
                  detail::concat("[", start, ", ", end, ")"));
  return device_rows(decode_k_, decode_v_, layer * config_.block_size + start, end - start);
}

void OffloadEngine::offload_decode_block(int64_t layer, int64_t host_block, int64_t num_tokens) {
  check_layer(layer);
  check_host_block(host_block);
  if (num_tokens < 1 || num_tokens > config_.block_size)
    fail_argument("num_tokens", detail::concat("in [1, ", config_.block_size, "]"), num_tokens);
  const size_t bytes =
      static_cast<size_t>(num_tokens * config_.num_kv_heads * config_.head_dim) * dtype_size(config_.dtype);
  const BlockCopy copy{decode_k_ptr(layer, 0), decode_v_ptr(layer, 0), host_k_ptr(layer, host_block),
                       host_v_ptr(layer, host_block), bytes};
  do_offload(layer, true, std::span<const BlockCopy>(&copy, 1));
  std::lock_guard lock(stats_mutex_);
  stats_.offloads += 1;
  stats_.bytes_d2h += static_cast<int64_t>(2 * bytes);
}

void OffloadEngine::load_keys(int64_t layer, std::span<const int32_t> host_blocks, const TensorView& dst) {
  check_layer(layer);
  for (int32_t b : host_blocks) check_host_block(b);
  const int64_t rows = static_cast<int64_t>(host_blocks.size()) * config_.block_size;
  check_rank(dst, 4, "dst");
  check_device(dst, device_, "dst");
  check_dtype(dst, config_.dtype, "dst");
  check_contiguous(dst, "dst");
  if (dst.size(0) != 1 || dst.size(1) < rows || dst.size(2) != config_.num_kv_heads || dst.size(3) != config_.head_dim)
    fail_argument("dst.shape",
                  detail::concat("(1, >= ", rows, ", ", config_.num_kv_heads, ", ", config_.head_dim, ")"),
                  shape_str(dst.shape()));
  if (host_blocks.empty()) return;
  do_load_keys(layer, host_blocks, static_cast<char*>(dst.data()));
  std::lock_guard lock(stats_mutex_);
  const int64_t bytes = static_cast<int64_t>(host_blocks.size() * block_bytes());
  stats_.key_loads += static_cast<int64_t>(host_blocks.size());
  stats_.bytes_h2d_keys += bytes;
  stats_.bytes_h2d += bytes;
}

void OffloadEngine::record_keys_consumed() { do_record_keys_consumed(); }

std::vector<OffloadEngine::KeyCopy> OffloadEngine::key_copies(
    int64_t layer, std::span<const int32_t> host_blocks, char* dst, const std::function<bool(size_t)>& include) const {
  std::vector<KeyCopy> copies;
  int64_t previous = -2;  // host block of the last included position, when it was the one just before
  for (size_t i = 0; i < host_blocks.size(); ++i) {
    if (!include(i)) {
      previous = -2;
      continue;
    }
    if (host_blocks[i] == previous + 1) {
      copies.back().bytes += block_bytes();
    } else {
      copies.push_back({host_k_ptr(layer, host_blocks[i]), dst + i * block_bytes(), block_bytes()});
    }
    previous = host_blocks[i];
  }
  return copies;
}

KvPair OffloadEngine::host_block(int64_t layer, int64_t block) const {
  check_layer(layer);
  check_host_block(block);
  const Shape shape{1, config_.block_size, config_.num_kv_heads, config_.head_dim};
  return {TensorView(host_k_ptr(layer, block), config_.dtype, Device::cpu(), shape),
          TensorView(host_v_ptr(layer, block), config_.dtype, Device::cpu(), shape)};
}

void OffloadEngine::write_host_block(int64_t layer, int64_t block, const TensorView& k, const TensorView& v) {
  check_layer(layer);
  check_host_block(block);
  check_kv_rows(k, "k", config_.block_size);
  check_kv_rows(v, "v", config_.block_size);
  if (k.size(1) != v.size(1)) fail_argument("v.shape", shape_str(k.shape()), shape_str(v.shape()));
  wait_offloads(layer);
  copy_bytes(host_k_ptr(layer, block), Device::cpu(), k.data(), k.device(), k.nbytes());
  copy_bytes(host_v_ptr(layer, block), Device::cpu(), v.data(), v.device(), v.nbytes());
}

TensorView OffloadEngine::scratch(int id, const Shape& shape, DType dtype) {
  if (id < 0 || id > 64) fail_argument("id", "in [0, 64]", id);
  if (static_cast<size_t>(id) >= scratch_.size()) scratch_.resize(static_cast<size_t>(id) + 1);
  ScratchEntry& entry = scratch_[static_cast<size_t>(id)];
  const size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  if (bytes > entry.bytes) {
    // The old buffer may still be read by queued device work; synchronize before freeing it.
    if (entry.bytes > 0) synchronize();
    entry.tensor = Tensor::empty({static_cast<int64_t>(bytes)}, DType::kU8, device_);
    entry.bytes = bytes;
  }
  return TensorView(entry.tensor.data(), dtype, device_, shape);
}

OffloadStats OffloadEngine::stats() const {
  std::lock_guard lock(stats_mutex_);
  return stats_;
}

void OffloadEngine::reset_stats() {
  std::lock_guard lock(stats_mutex_);
  stats_ = OffloadStats{};
}

std::unique_ptr<OffloadEngine> make_offload_engine(const ExecContext& ctx, const OffloadConfig& config,
                                                   CpuCopyOptions cpu_options) {
  if (ctx.device.is_cpu()) return make_cpu_offload_engine(config, cpu_options);
  return make_cuda_offload_engine(ctx, config);
}

#ifndef TESSEL_WITH_CUDA
// CPU-only build: the CUDA engine lives in offload_engine_cuda.cc, which is not compiled.
std::unique_ptr<OffloadEngine> make_cuda_offload_engine(const ExecContext& ctx, const OffloadConfig&) {
  fail_argument("device", "cpu (this tessel was built without CUDA)",
                ctx.device.is_cuda() ? ctx.device.str() : Device::cuda(0).str());
}
#endif

}  // namespace tessel::kv
