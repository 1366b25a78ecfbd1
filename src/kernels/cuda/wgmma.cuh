// Hopper warpgroup MMA (wgmma, sm_90a only) with both operands read from shared memory.
//
// Operands are K-major tiles of 64 bf16/fp16 per row (128 bytes), 16-byte chunks XOR-swizzled by
// row & 7, tile base 1024-byte aligned: the layout load_tile() (flash_forward_kernel.cuh) writes
// with cp.async, which is wgmma's 128-byte swizzle, so the same tiles feed ldmatrix on sm_80 and
// wgmma here. The accumulator fragment of m64nNk16 is, per warp of the warpgroup, 16 rows x N
// columns laid out as N/8 mma.sync m16n8 C fragments: d[4j + 2h + e] is row 16w + lane/4 + 8h,
// column 8j + 2(lane%4) + e.
//
// Everything here exists only in the sm_90a device pass (TESSEL_WGMMA_AVAILABLE); kernels that use
// it compile to a trap elsewhere and the host selects them only on compute capability 9.0 devices
// of a build that includes sm_90a (TESSEL_CUDA_SM90A, set by CMake).
#pragma once

#include <cstdint>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TESSEL_WGMMA_AVAILABLE 1
#else
#define TESSEL_WGMMA_AVAILABLE 0
#endif

namespace tessel::cuda::detail {

// Operand types, as tags that pick the instruction.
struct Bf16Operands {};
struct F16Operands {};

#if TESSEL_WGMMA_AVAILABLE

// Shared-memory matrix descriptor of a K-major tile with the 128-byte swizzle: 8-row groups 1024
// bytes apart (stride byte offset), the leading byte offset unused for this swizzle (1 by
// convention). Adding 2 (32 bytes >> 4) to the result steps to the next k16 slice of the rows.
__device__ __forceinline__ uint64_t wgmma_desc_k_major_sw128(uint32_t smem_addr) {
  return static_cast<uint64_t>((smem_addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(1) << 16) |
         (static_cast<uint64_t>(1024 >> 4) << 32) | (static_cast<uint64_t>(1) << 62);
}

// Descriptor of an MN-major tile with the 128-byte swizzle, as the bulk tensor copy writes a
// (rows = K, 64 columns = MN) box: each K row is 128 bytes (64 MN elements), 8-row groups 1024
// bytes apart (stride byte offset), and the next 64 MN columns `mn_block_bytes` further (leading
// byte offset). Adding 128 (2048 bytes >> 4) steps to the next k16 slice.
__device__ __forceinline__ uint64_t wgmma_desc_mn_major_sw128(uint32_t smem_addr, uint32_t mn_block_bytes) {
  return static_cast<uint64_t>((smem_addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>((mn_block_bytes >> 4) & 0x3FFF) << 16) |
         (static_cast<uint64_t>(1024 >> 4) << 32) | (static_cast<uint64_t>(1) << 62);
}

// Orders this thread's earlier register accesses to the accumulators before the next wgmma.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accesses of accumulator registers across a wgmma issue or wait.
template <int R>
__device__ __forceinline__ void wgmma_fence_operands(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// The same for registers a wgmma reads asynchronously (A fragments): kept live and unchanged
// until the wait that follows the instruction.
template <int R>
__device__ __forceinline__ void wgmma_fence_operands(uint32_t (&a)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+r"(a[i])::"memory");
}
// Makes this thread's generic-proxy writes to shared memory (cp.async, st.shared) visible to the
// async proxy wgmma reads through; each writing thread runs it before the barrier.
__device__ __forceinline__ void fence_proxy_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// The 64 accumulator operands of an N = 128 instruction: their asm text (%0..%63) and constraints.
#define TESSEL_WGMMA_D64_TEXT \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define TESSEL_WGMMA_D64_OUTPUTS(d) \
        "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

// D (+)= A x B^T for one k16 slice: A 64 x 16 (rows of the warpgroup), B N x 16, both K-major.
// accumulate = 0 overwrites D. One asm text per N; the operand type is spliced into the opcode.
// The m64n128k16 instruction for operand type TYPE ("bf16" or "f16") on float d[64].
#define TESSEL_WGMMA_M64N128K16(TYPE, d, desc_a, desc_b, accumulate) \
  asm volatile( \
      "{\n" \
      ".reg .pred accumulate;\n" \
      "setp.ne.b32 accumulate, %66, 0;\n" \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE " " \
      "{" \
      TESSEL_WGMMA_D64_TEXT \
      "}, %64, %65, accumulate, 1, 1, 0, 0;\n" \
      "}\n" \
      : TESSEL_WGMMA_D64_OUTPUTS(d) \
      : "l"(desc_a), "l"(desc_b), "r"(accumulate))

// The m64n64k16 instruction for operand type TYPE ("bf16" or "f16") on float d[32].
#define TESSEL_WGMMA_M64N64K16(TYPE, d, desc_a, desc_b, accumulate) \
  asm volatile( \
      "{\n" \
      ".reg .pred accumulate;\n" \
      "setp.ne.b32 accumulate, %34, 0;\n" \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPE "." TYPE " " \
      "{" \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31" \
      "}, %32, %33, accumulate, 1, 1, 0, 0;\n" \
      "}\n" \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]) \
      : "l"(desc_a), "l"(desc_b), "r"(accumulate))

// The m64n256k16 instruction for operand type TYPE ("bf16" or "f16") on float d[128].
#define TESSEL_WGMMA_M64N256K16(TYPE, d, desc_a, desc_b, accumulate) \
  asm volatile( \
      "{\n" \
      ".reg .pred accumulate;\n" \
      "setp.ne.b32 accumulate, %130, 0;\n" \
      "wgmma.mma_async.sync.aligned.m64n256k16.f32." TYPE "." TYPE " " \
      "{" \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127" \
      "}, %128, %129, accumulate, 1, 1, 0, 0;\n" \
      "}\n" \
      : TESSEL_WGMMA_D64_OUTPUTS(d), \
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), \
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127]) \
      : "l"(desc_a), "l"(desc_b), "r"(accumulate))

// D += A x B for one k16 slice with A (64 x 16) in registers, in the m16n8k16 A-fragment layout
// per warp (a[0..3]), and B (16 x N) an MN-major shared tile (transposed read, imm-trans-b = 1).
// The same with N = 64 (float d[32]).
#define TESSEL_WGMMA_M64N64K16_RS_TRANS_B(TYPE, d, a, desc_b) \
  asm volatile( \
      "{\n" \
      ".reg .pred accumulate;\n" \
      "setp.ne.b32 accumulate, %37, 0;\n" \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPE "." TYPE " " \
      "{" \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31" \
      "}, {%32, %33, %34, %35}, %36, accumulate, 1, 1, 1;\n" \
      "}\n" \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]) \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "n"(1))

#define TESSEL_WGMMA_M64N128K16_RS_TRANS_B(TYPE, d, a, desc_b) \
  asm volatile( \
      "{\n" \
      ".reg .pred accumulate;\n" \
      "setp.ne.b32 accumulate, %69, 0;\n" \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE " " \
      "{" \
      TESSEL_WGMMA_D64_TEXT \
      "}, {%64, %65, %66, %67}, %68, accumulate, 1, 1, 1;\n" \
      "}\n" \
      : TESSEL_WGMMA_D64_OUTPUTS(d) \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "n"(1))

// wgmma_rs_trans_b: the N = 128 or N = 64 instruction, picked by the accumulator's size.
__device__ __forceinline__ void wgmma_rs_trans_b(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b, Bf16Operands) {
  TESSEL_WGMMA_M64N128K16_RS_TRANS_B("bf16", d, a, desc_b);
}
__device__ __forceinline__ void wgmma_rs_trans_b(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b, F16Operands) {
  TESSEL_WGMMA_M64N128K16_RS_TRANS_B("f16", d, a, desc_b);
}
__device__ __forceinline__ void wgmma_rs_trans_b(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b, Bf16Operands) {
  TESSEL_WGMMA_M64N64K16_RS_TRANS_B("bf16", d, a, desc_b);
}
__device__ __forceinline__ void wgmma_rs_trans_b(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b, F16Operands) {
  TESSEL_WGMMA_M64N64K16_RS_TRANS_B("f16", d, a, desc_b);
}

// wgmma_ss: D (+)= A x B^T with both operands in shared memory, N = 64, 128 or 256 picked by the
// accumulator's size.
__device__ __forceinline__ void wgmma_ss(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int accumulate, Bf16Operands) {
  TESSEL_WGMMA_M64N64K16("bf16", d, desc_a, desc_b, accumulate);
}
__device__ __forceinline__ void wgmma_ss(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int accumulate, F16Operands) {
  TESSEL_WGMMA_M64N64K16("f16", d, desc_a, desc_b, accumulate);
}
__device__ __forceinline__ void wgmma_ss(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int accumulate, Bf16Operands) {
  TESSEL_WGMMA_M64N128K16("bf16", d, desc_a, desc_b, accumulate);
}
__device__ __forceinline__ void wgmma_ss(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int accumulate, F16Operands) {
  TESSEL_WGMMA_M64N128K16("f16", d, desc_a, desc_b, accumulate);
}
__device__ __forceinline__ void wgmma_ss(float (&d)[128], uint64_t desc_a, uint64_t desc_b, int accumulate, Bf16Operands) {
  TESSEL_WGMMA_M64N256K16("bf16", d, desc_a, desc_b, accumulate);
}
__device__ __forceinline__ void wgmma_ss(float (&d)[128], uint64_t desc_a, uint64_t desc_b, int accumulate, F16Operands) {
  TESSEL_WGMMA_M64N256K16("f16", d, desc_a, desc_b, accumulate);
}

// FP8 (e4m3 x e4m3, fp32 accumulate), m64n128k32: FP8 wgmma reads both operands K-major (it has
// no transposed reads). A comes from shared memory, or from registers in the m16n8k32 A-fragment
// layout per warp: a[0] row lane/4, k 4(lane%4)..+3; a[1] the same k, row + 8; a[2] and a[3] the
// same at k + 16 (lower k in the lower byte).
#define TESSEL_WGMMA_M64N128K32_E4M3(d, desc_a, desc_b, accumulate) \
  asm volatile( \
      "{\n" \
      ".reg .pred accumulate;\n" \
      "setp.ne.b32 accumulate, %66, 0;\n" \
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " \
      "{" \
      TESSEL_WGMMA_D64_TEXT \
      "}, %64, %65, accumulate, 1, 1;\n" \
      "}\n" \
      : TESSEL_WGMMA_D64_OUTPUTS(d) \
      : "l"(desc_a), "l"(desc_b), "r"(accumulate))
#define TESSEL_WGMMA_M64N128K32_E4M3_RS(d, a, desc_b) \
  asm volatile( \
      "{\n" \
      ".reg .pred accumulate;\n" \
      "setp.ne.b32 accumulate, %69, 0;\n" \
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " \
      "{" \
      TESSEL_WGMMA_D64_TEXT \
      "}, {%64, %65, %66, %67}, %68, accumulate, 1, 1;\n" \
      "}\n" \
      : TESSEL_WGMMA_D64_OUTPUTS(d) \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "n"(1))

__device__ __forceinline__ void wgmma_ss_e4m3(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  TESSEL_WGMMA_M64N128K32_E4M3(d, desc_a, desc_b, accumulate);
}
// D += A x B^T, A from registers, accumulating.
__device__ __forceinline__ void wgmma_rs_e4m3(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b) {
  TESSEL_WGMMA_M64N128K32_E4M3_RS(d, a, desc_b);
}

// Descriptor of a K-major tile with the 64-byte swizzle, as the bulk tensor copy writes a box of
// 64-byte rows: 8-row groups 512 bytes apart (stride byte offset); adding 2 (32 bytes >> 4) steps
// to the next 32 one-byte k elements of the rows. The base must be 512-byte aligned.
__device__ __forceinline__ uint64_t wgmma_desc_k_major_sw64(uint32_t smem_addr) {
  return static_cast<uint64_t>((smem_addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(1) << 16) |
         (static_cast<uint64_t>(512 >> 4) << 32) | (static_cast<uint64_t>(2) << 62);
}

#undef TESSEL_WGMMA_M64N128K32_E4M3
#undef TESSEL_WGMMA_M64N128K32_E4M3_RS
#undef TESSEL_WGMMA_M64N64K16
#undef TESSEL_WGMMA_M64N128K16
#undef TESSEL_WGMMA_M64N256K16
#undef TESSEL_WGMMA_M64N128K16_RS_TRANS_B
#undef TESSEL_WGMMA_M64N64K16_RS_TRANS_B
#undef TESSEL_WGMMA_D64_TEXT
#undef TESSEL_WGMMA_D64_OUTPUTS

#endif  // TESSEL_WGMMA_AVAILABLE

}  // namespace tessel::cuda::detail
