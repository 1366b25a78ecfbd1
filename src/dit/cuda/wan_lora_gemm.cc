// Per-request LoRA through cuBLASLt (see wan_lora_gemm.h). Each run is one shrink and one expand on
// its own rows: a run covers consecutive batch entries, whose rows are one contiguous block of x and
// of y, so each GEMM is as large as the run and no per-entry pointer table is needed. The scale
// stays in the expand's alpha (fp32), so the factors stay as loaded and one bank serves any scale.
#include "cuda/wan_lora_gemm.h"

#include <cstddef>

#include "cuda/wan_kernels.h"
#include "tessel/core/error.h"
#include "tessel/kernels/cuda/launch_check.h"

namespace tessel::dit::cuda {

using tessel::cuda::CublasLtGemm;
using tessel::cuda::GemmEpilogue;
using tessel::cuda::GemmShape;
using bf16 = __nv_bfloat16;

void add_lora_segments(const CublasLtGemm& gemm, const std::vector<LoraSegment>& segments, const LoraLayer& layer,
                       const LoraScratch& scratch, cudaStream_t stream) {
  if (layer.x_type != DType::kBF16 && layer.x_type != DType::kF32)
    fail_argument("LoRA layer input type", "bf16 or fp32", dtype_name(layer.x_type));
  const bool x_f32 = layer.x_type == DType::kF32;
  const size_t y_size = dtype_size(layer.y_type);
  for (const LoraSegment& segment : segments) {
    if (segment.rows <= 0 || segment.rank <= 0) continue;
    if (segment.rank > scratch.shrunk_stride)
      fail_argument("LoRA scratch stride", detail::concat("at least the rank ", segment.rank), scratch.shrunk_stride);
    const int64_t first = segment.row_begin * layer.in;
    const bf16* x = x_f32 ? scratch.x_bf16 + first : static_cast<const bf16*>(layer.x) + first;
    if (x_f32) {
      launch_convert_to_bf16(static_cast<const float*>(layer.x) + first, scratch.x_bf16 + first, segment.rows * layer.in, stream);
      tessel::cuda::check_launch("LoRA input to bf16");
    }
    bf16* shrunk = scratch.shrunk + segment.row_begin * scratch.shrunk_stride;
    void* y = static_cast<std::byte*>(layer.y) + static_cast<size_t>(segment.row_begin * layer.out) * y_size;
    GemmShape shrink{segment.rows, segment.rank, layer.in, DType::kBF16, DType::kBF16, GemmEpilogue::kNone};
    shrink.alignment = CublasLtGemm::alignment_of({x, segment.down, shrunk});
    gemm.linear(shrink, x, segment.down, nullptr, shrunk, scratch.gemm_workspace, stream);
    GemmShape expand{segment.rows, layer.out, segment.rank, DType::kBF16, layer.y_type, GemmEpilogue::kNone};
    expand.alignment = CublasLtGemm::alignment_of({shrunk, segment.up, y});
    gemm.accumulate(expand, shrunk, segment.up, segment.scale, y, scratch.gemm_workspace, stream);
  }
}

}  // namespace tessel::dit::cuda
