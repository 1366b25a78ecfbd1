// tessel::BlockMask for Python: construction from dense maps, CSR arrays, FlashInfer BSR and
// FlexAttention block tensors (all validated by the library), and the same layouts back as numpy
// arrays. The Python class tessel.BlockMask wraps this one and adds torch conversions.
#include <utility>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "host_arrays.h"
#include "tessel/core/error.h"
#include "tessel/sparse/block_mask.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace tessel::python {
namespace {

using HostArray = nb::ndarray<nb::ro>;

BlockMaskShape mask_shape(int64_t mask_batch, int64_t mask_heads, int64_t seq_q, int64_t seq_kv, int64_t block_q,
                          int64_t block_kv) {
  return BlockMaskShape{mask_batch, mask_heads, seq_q, seq_kv, block_q, block_kv};
}

// Extent `axis` of a (B_m, H_m, Qb[, KVb]) array, checked against what the shape implies.
void check_extent(const HostArray& array, size_t axis, int64_t expected, const char* argument, const char* what) {
  const auto actual = static_cast<int64_t>(array.shape(axis));
  if (actual != expected)
    fail_argument(argument, detail::concat(what, " = ", expected, " on axis ", axis), actual);
}

BlockMask from_dense(const HostArray& dense, int64_t seq_q, int64_t seq_kv, int64_t block_q, int64_t block_kv) {
  std::vector<uint8_t> values = host_vector<uint8_t>(dense, "dense", 4);
  const BlockMaskShape shape = mask_shape(static_cast<int64_t>(dense.shape(0)), static_cast<int64_t>(dense.shape(1)),
                                          seq_q, seq_kv, block_q, block_kv);
  if (block_q < 1) fail_argument("block_q", ">= 1", block_q);
  if (block_kv < 1) fail_argument("block_kv", ">= 1", block_kv);
  check_extent(dense, 2, shape.q_blocks(), "dense", "q_blocks (ceil(seq_q / block_q))");
  check_extent(dense, 3, shape.kv_blocks(), "dense", "kv_blocks (ceil(seq_kv / block_kv))");
  return BlockMask::from_dense(shape, values);
}

BlockMask from_flex(const HostArray& kv_num_blocks, const HostArray& kv_indices, int64_t seq_q, int64_t seq_kv,
                    int64_t block_q, int64_t block_kv) {
  FlexBlockMask flex{host_vector<int32_t>(kv_num_blocks, "kv_num_blocks", 3),
                     host_vector<int32_t>(kv_indices, "kv_indices", 4)};
  const BlockMaskShape shape = mask_shape(static_cast<int64_t>(kv_num_blocks.shape(0)),
                                          static_cast<int64_t>(kv_num_blocks.shape(1)), seq_q, seq_kv, block_q, block_kv);
  if (block_q < 1) fail_argument("block_q", ">= 1", block_q);
  if (block_kv < 1) fail_argument("block_kv", ">= 1", block_kv);
  check_extent(kv_num_blocks, 2, shape.q_blocks(), "kv_num_blocks", "q_blocks (ceil(seq_q / block_q))");
  for (size_t axis = 0; axis < 3; ++axis)
    check_extent(kv_indices, axis, static_cast<int64_t>(kv_num_blocks.shape(axis)), "kv_indices", "kv_num_blocks' extent");
  check_extent(kv_indices, 3, shape.kv_blocks(), "kv_indices", "kv_blocks (ceil(seq_kv / block_kv))");
  return BlockMask::from_flex(shape, flex);
}

BlockMask from_flashinfer(const std::vector<std::pair<HostArray, HostArray>>& per_batch_head, int64_t mask_batch,
                          int64_t mask_heads, int64_t seq_q, int64_t seq_kv, int64_t block_q, int64_t block_kv) {
  std::vector<FlashInferBsr> bsr;
  bsr.reserve(per_batch_head.size());
  for (size_t i = 0; i < per_batch_head.size(); ++i) {
    const std::string name = detail::concat("per_batch_head[", i, "]");
    bsr.push_back({host_vector<int32_t>(per_batch_head[i].first, name + ".indptr", 1),
                   host_vector<int32_t>(per_batch_head[i].second, name + ".indices", 1)});
  }
  return BlockMask::from_flashinfer(mask_shape(mask_batch, mask_heads, seq_q, seq_kv, block_q, block_kv), bsr);
}

nb::list to_flashinfer(const BlockMask& mask) {
  nb::list out;
  for (FlashInferBsr& bsr : mask.to_flashinfer()) {
    const Shape indptr_shape{static_cast<int64_t>(bsr.indptr.size())};
    const Shape indices_shape{static_cast<int64_t>(bsr.indices.size())};
    out.append(nb::make_tuple(numpy_array(std::move(bsr.indptr), indptr_shape),
                              numpy_array(std::move(bsr.indices), indices_shape)));
  }
  return out;
}

nb::tuple to_flex(const BlockMask& mask) {
  const BlockMaskShape& s = mask.shape();
  FlexBlockMask flex = mask.to_flex();
  return nb::make_tuple(numpy_array(std::move(flex.kv_num_blocks), {s.mask_batch, s.mask_heads, s.q_blocks()}),
                        numpy_array(std::move(flex.kv_indices), {s.mask_batch, s.mask_heads, s.q_blocks(), s.kv_blocks()}));
}

}  // namespace

void bind_block_mask(nb::module_& m) {
  nb::class_<BlockMask>(m, "BlockMask")
      .def_static("from_dense", &from_dense, "dense"_a, "seq_q"_a, "seq_kv"_a, "block_q"_a, "block_kv"_a)
      .def_static(
          "from_csr",
          [](const HostArray& indptr, const HostArray& indices, int64_t mask_batch, int64_t mask_heads, int64_t seq_q,
             int64_t seq_kv, int64_t block_q, int64_t block_kv) {
            return BlockMask::from_csr(mask_shape(mask_batch, mask_heads, seq_q, seq_kv, block_q, block_kv),
                                       host_vector<int32_t>(indptr, "indptr", 1),
                                       host_vector<int32_t>(indices, "indices", 1));
          },
          "indptr"_a, "indices"_a, "mask_batch"_a, "mask_heads"_a, "seq_q"_a, "seq_kv"_a, "block_q"_a, "block_kv"_a)
      .def_static("from_flex", &from_flex, "kv_num_blocks"_a, "kv_indices"_a, "seq_q"_a, "seq_kv"_a, "block_q"_a,
                  "block_kv"_a)
      .def_static("from_flashinfer", &from_flashinfer, "per_batch_head"_a, "mask_batch"_a, "mask_heads"_a, "seq_q"_a,
                  "seq_kv"_a, "block_q"_a, "block_kv"_a)
      .def_static(
          "full",
          [](int64_t mask_batch, int64_t mask_heads, int64_t seq_q, int64_t seq_kv, int64_t block_q, int64_t block_kv) {
            return BlockMask::full(mask_shape(mask_batch, mask_heads, seq_q, seq_kv, block_q, block_kv));
          },
          "mask_batch"_a, "mask_heads"_a, "seq_q"_a, "seq_kv"_a, "block_q"_a, "block_kv"_a)
      .def_static(
          "random",
          [](int64_t mask_batch, int64_t mask_heads, int64_t seq_q, int64_t seq_kv, int64_t block_q, int64_t block_kv,
             double density, uint64_t seed) {
            return BlockMask::random(mask_shape(mask_batch, mask_heads, seq_q, seq_kv, block_q, block_kv), density, seed);
          },
          "mask_batch"_a, "mask_heads"_a, "seq_q"_a, "seq_kv"_a, "block_q"_a, "block_kv"_a, "density"_a, "seed"_a)
      .def("to_dense",
           [](const BlockMask& mask) {
             const BlockMaskShape& s = mask.shape();
             return numpy_array(mask.to_dense(), {s.mask_batch, s.mask_heads, s.q_blocks(), s.kv_blocks()});
           })
      .def("to_flashinfer", &to_flashinfer)
      .def("to_flex", &to_flex)
      .def_prop_ro("indptr",
                   [](const BlockMask& mask) {
                     return numpy_array(mask.indptr(), {static_cast<int64_t>(mask.indptr().size())});
                   })
      .def_prop_ro("indices", [](const BlockMask& mask) { return numpy_array(mask.indices(), {mask.nnz()}); })
      .def_prop_ro("mask_batch", [](const BlockMask& mask) { return mask.shape().mask_batch; })
      .def_prop_ro("mask_heads", [](const BlockMask& mask) { return mask.shape().mask_heads; })
      .def_prop_ro("seq_q", [](const BlockMask& mask) { return mask.shape().seq_q; })
      .def_prop_ro("seq_kv", [](const BlockMask& mask) { return mask.shape().seq_kv; })
      .def_prop_ro("block_q", [](const BlockMask& mask) { return mask.shape().block_q; })
      .def_prop_ro("block_kv", [](const BlockMask& mask) { return mask.shape().block_kv; })
      .def_prop_ro("q_blocks", [](const BlockMask& mask) { return mask.shape().q_blocks(); })
      .def_prop_ro("kv_blocks", [](const BlockMask& mask) { return mask.shape().kv_blocks(); })
      .def_prop_ro("nnz", &BlockMask::nnz)
      .def("density", &BlockMask::density)
      .def("token_density", &BlockMask::token_density);
}

}  // namespace tessel::python
