// Fuzzes BlockMask (BSR) validation. Input layout: a flags byte; six shape fields (mask_batch,
// mask_heads, seq_q, seq_kv, block_q, block_kv), each one byte v meaning v - 1 or, when its flag
// bit (1 << field) is set, any int64; an indptr count byte and that many int16 entries; the rest
// int16 indices. Flag bit 6 sets indptr's last entry to the number of indices. Properties: validation either accepts or throws tessel::Error; an
// accepted mask converts to and from the dense, FlexAttention and FlashInfer forms unchanged, has
// a density in [0, 1], and passes the C ABI's validate_block_mask, which agrees with the C++ one.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "byte_reader.h"
#include "plugin/plugin_abi.h"
#include "tessel/core/error.h"
#include "tessel/sparse/block_mask.h"

namespace {

void check(bool condition, const char* what) {
  if (!condition) {
    std::fprintf(stderr, "block mask property violated: %s\n", what);
    std::abort();
  }
}

// Small values (masks that validate) or, when the field's flag is set, any int64 (overflow checks).
int64_t shape_value(tessel::fuzz::ByteReader& input, uint8_t flags, int field) {
  if (flags & (1u << field)) return input.read<int64_t>();
  return static_cast<int64_t>(input.read<uint8_t>()) - 1;
}

// Conversions a mask of up to this many (row, kv block) cells goes through.
constexpr int64_t kMaxDenseCells = 1 << 16;

void check_accepted_mask(const tessel::BlockMask& mask) {
  const tessel::BlockMaskShape& shape = mask.shape();
  const double density = mask.density();
  check(density >= 0.0 && density <= 1.0, "density in [0, 1]");
  const double token_density = mask.token_density();
  check(token_density >= 0.0 && token_density <= 1.0, "token density in [0, 1]");
  // The FlashInfer form holds one CSR per (batch, head) pair, so its size follows the pairs even when
  // the mask has no query rows (seq_q = 0): bound both.
  if (shape.num_rows() * shape.kv_blocks() <= kMaxDenseCells && shape.mask_batch * shape.mask_heads <= kMaxDenseCells) {
    const tessel::BlockMask from_dense = tessel::BlockMask::from_dense(shape, mask.to_dense());
    check(from_dense.indptr() == mask.indptr() && from_dense.indices() == mask.indices(), "dense round trip");
    const tessel::BlockMask from_flex = tessel::BlockMask::from_flex(shape, mask.to_flex());
    check(from_flex.indptr() == mask.indptr() && from_flex.indices() == mask.indices(), "FlexAttention round trip");
    const tessel::BlockMask from_flashinfer = tessel::BlockMask::from_flashinfer(shape, mask.to_flashinfer());
    check(from_flashinfer.indptr() == mask.indptr() && from_flashinfer.indices() == mask.indices(),
          "FlashInfer round trip");
  }
  const tessel::BlockMaskView view = mask.view();
  tessel_block_mask c_mask = tessel::plugin::to_c(view);
  tessel_error error{};
  check(tessel::plugin::host_api()->validate_block_mask(&c_mask, &error) == TESSEL_OK,
        "the C ABI accepts what BlockMask accepted");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tessel::fuzz::ByteReader input(data, size);
  const auto flags = input.read<uint8_t>();
  tessel::BlockMaskShape shape;
  shape.mask_batch = shape_value(input, flags, 0);
  shape.mask_heads = shape_value(input, flags, 1);
  shape.seq_q = shape_value(input, flags, 2);
  shape.seq_kv = shape_value(input, flags, 3);
  shape.block_q = shape_value(input, flags, 4);
  shape.block_kv = shape_value(input, flags, 5);
  std::vector<int32_t> indptr(input.read<uint8_t>());
  for (int32_t& entry : indptr) entry = input.read<int16_t>();
  std::vector<int32_t> indices;
  while (input.remaining() > 0 && indices.size() < 4096) indices.push_back(input.read<int16_t>());
  if ((flags & (1u << 6)) && !indptr.empty()) indptr.back() = static_cast<int32_t>(indices.size());
  tessel::BlockMask mask;
  try {
    mask = tessel::BlockMask::from_csr(shape, indptr, indices);
  } catch (const tessel::Error&) {
    return 0;
  }
  check_accepted_mask(mask);
  return 0;
}
