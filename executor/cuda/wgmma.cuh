// Hopper (sm_90a) warpgroup matrix multiply building blocks for the flash-attention kernels: shared-memory
// matrix descriptors for 128-byte-swizzled bf16 tiles, wgmma.mma_async wrappers (A from shared memory or
// from registers, fp32 accumulators), the wgmma fence/commit/wait, and tile loads into the swizzled layout.
//
// Tile layout ("sw128"): a ROWS x D bf16 tile is stored as D/64 column panels of ROWS x 64; panel p holds
// row r's 16-byte chunk c (elements 64p + 8c ..) at byte p*ROWS*128 + r*128 + ((c ^ (r & 7)) * 16). Each
// panel starts 1024-byte aligned, which is the hardware's 128-byte swizzle (address bits 4-6 ^= bits 7-9).
// The same tile serves as a K-major operand (K = the 64-wide columns: rows are M or N) and as an MN-major
// operand (K = rows, MN = columns; panels are the 64-element MN atoms).
//
// Accumulator layout of wgmma m64nN (fp32): warp w of the warpgroup owns rows 16w..16w+15; with g = lane/4,
// t = lane%4, register 4i + 2r + c holds row 16w + g + 8r, column 8i + 2t + c -- mma.sync's C layout per
// 8-column slab. An A operand in registers (m64k16) uses mma.sync m16n8k16's A fragment per warp.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "executor/cuda/flash_attention_common.cuh"

namespace megatune::executor::cuda::hopper {

__device__ __forceinline__ uint32_t shared_address(const void* p) { return detail::smem_address(p); }

// The first 1024-byte-aligned address at or after p in shared memory (128-byte-swizzled tiles start there);
// dynamic shared memory is sized with 1024 bytes to spare for it.
__device__ __forceinline__ unsigned char* align_1024(unsigned char* p) {
  const uint32_t address = shared_address(p);
  return p + ((1024 - (address & 1023)) & 1023);
}

// Matrix descriptor of a 128-byte-swizzled operand. K-major: rows of 64 K-elements, 8-row groups 1024 bytes
// apart (lbo unused). MN-major: K rows of 64 MN-elements, 8-K-row groups 1024 bytes apart, the next 64
// MN-elements (panel) mn_panel_bytes further.
__device__ __forceinline__ uint64_t descriptor(uint32_t address, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  uint64_t desc = uint64_t((address & 0x3FFFF) >> 4);
  desc |= uint64_t((lbo_bytes >> 4) & 0x3FFF) << 16;
  desc |= uint64_t((sbo_bytes >> 4) & 0x3FFF) << 32;
  desc |= uint64_t(1) << 62;  // 128-byte swizzle
  return desc;
}
__device__ __forceinline__ uint64_t k_major_descriptor(uint32_t address) {
  return descriptor(address, 16, 1024);
}
__device__ __forceinline__ uint64_t mn_major_descriptor(uint32_t address, uint32_t mn_panel_bytes) {
  return descriptor(address, mn_panel_bytes, 1024);
}
// The descriptor of the same operand offset_bytes (a multiple of 16) further: the start-address field holds
// address / 16 in 14 bits, which every shared-memory address fits (< 256 KiB), so the offset is one add
// (compile-time offsets fold into the instruction) instead of rebuilding the descriptor.
__device__ __forceinline__ uint64_t advance(uint64_t desc, uint32_t offset_bytes) {
  return desc + (offset_bytes >> 4);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Shared memory written by ordinary stores or cp.async, read next by wgmma: each writer fences, then barrier.
__device__ __forceinline__ void fence_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Keeps the compiler from moving reads or writes of registers across an asynchronous wgmma boundary.
template <int N>
__device__ __forceinline__ void fence_registers(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void fence_registers(uint32_t (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
  }
}

// Element offset of (row, column) in a ROWS-row sw128 tile.
template <int ROWS>
__device__ __forceinline__ int sw128_offset(int row, int col) {
  return (col >> 6) * ROWS * 64 + row * 64 + ((((col >> 3) & 7) ^ (row & 7)) << 3) + (col & 7);
}
// sw128_offset for one row and many compile-time 8-column groups: row_base = sw128_row_base(row, c) once,
// then sw128_at<ROWS>(row_base, group) = sw128_offset<ROWS>(row, 8 * group + c) (0 <= c < 8) with one xor,
// as the row's bits never meet the swizzled chunk bits 3-5.
__device__ __forceinline__ int sw128_row_base(int row, int col_in_group) {
  return row * 64 + ((row & 7) << 3) + col_in_group;
}
template <int ROWS>
__device__ __forceinline__ int sw128_at(int row_base, int group) {
  return (row_base ^ ((group & 7) << 3)) + (group >> 3) * ROWS * 64;
}

// cp.async of a ROWS x D tile (rows row0.. of a strided global tensor) into an sw128 tile; rows at or beyond
// row_limit are zero-filled. All THREADS threads take part.
template <int ROWS, int D, int THREADS>
__device__ __forceinline__ void load_tile_sw128(__nv_bfloat16* smem, const __nv_bfloat16* gmem,
                                                int64_t row_stride, int row0, int row_limit) {
  // Each thread copies the same 16-byte column chunk of rows row, row + kRowsPerPass, ...: with
  // kRowsPerPass a multiple of 8 those rows share the swizzle phase, so shared and global addresses
  // advance by constants.
  constexpr int kChunksPerRow = D / 8, kRowsPerPass = THREADS / kChunksPerRow;
  static_assert(THREADS % kChunksPerRow == 0 && kRowsPerPass % 8 == 0 && ROWS % kRowsPerPass == 0,
                "load_tile_sw128: tile shape and thread count do not tile evenly");
  const int tid = threadIdx.x % THREADS;
  const int row = tid / kChunksPerRow, col = (tid % kChunksPerRow) * 8;
  const uint32_t dst0 = shared_address(smem + sw128_offset<ROWS>(row, col));
  const __nv_bfloat16* src0 = gmem + int64_t(row0 + row) * row_stride + col;
#pragma unroll
  for (int j = 0; j < ROWS / kRowsPerPass; ++j) {
    const bool valid = row0 + row + j * kRowsPerPass < row_limit;
    const __nv_bfloat16* src = valid ? src0 + int64_t(j * kRowsPerPass) * row_stride : gmem;
    const uint32_t dst = dst0 + j * kRowsPerPass * 64 * int(sizeof(__nv_bfloat16));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
  }
}

template <int TRANS_A, int TRANS_B>
__device__ __forceinline__ void wgmma_ss_m64n64(float (&d)[32], uint64_t desc_a, uint64_t desc_b,
                                                int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
      "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, %35, %36;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TRANS_A), "n"(TRANS_B));
}

template <int TRANS_B>
__device__ __forceinline__ void wgmma_rs_m64n64(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b,
                                                int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
      "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TRANS_B));
}

template <int TRANS_A, int TRANS_B>
__device__ __forceinline__ void wgmma_ss_m64n128(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                                 int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
      "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, "
      "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, "
      "%62, %63}, %64, %65, p, 1, 1, %67, %68;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),
        "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
        "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]),
        "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]),
        "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TRANS_A), "n"(TRANS_B));
}

template <int TRANS_B>
__device__ __forceinline__ void wgmma_rs_m64n128(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b,
                                                 int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
      "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, "
      "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, "
      "%62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),
        "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
        "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]),
        "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]),
        "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TRANS_B));
}

// The m64k16 A fragment (bf16) of columns 16 kk.. of an fp32 accumulator whose registers first.. hold
// them (first = 8 kk): an accumulator becomes the A operand of the next wgmma without shared memory.
template <int N>
__device__ __forceinline__ void pack_a_fragment(uint32_t (&a)[4], const float (&acc)[N], int first) {
#pragma unroll
  for (int i = 0; i < 4; ++i) a[i] = flash::pack_bf16(acc[first + 2 * i], acc[first + 2 * i + 1]);
}

// acc (64 x N) = A B^T over K = D (16-wide steps, 4 per 64-wide panel), both operands K-major sw128 tiles:
// A = the 64 rows at a_address of a tile with a_rows rows per panel, B = an N-row tile at b_address.
template <int D, int N>
__device__ __forceinline__ void gemm_k_major(float (&acc)[N / 2], uint32_t a_address, int a_rows,
                                             uint32_t b_address) {
  const uint64_t a0 = k_major_descriptor(a_address), b0 = k_major_descriptor(b_address);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const uint32_t panel = kk >> 2, within = (kk & 3) * 32;
    const uint64_t a = advance(a0, panel * a_rows * 128 + within);
    const uint64_t b = advance(b0, panel * N * 128 + within);
    if constexpr (N == 128)
      wgmma_ss_m64n128<0, 0>(acc, a, b, kk > 0 ? 1 : 0);
    else
      wgmma_ss_m64n64<0, 0>(acc, a, b, kk > 0 ? 1 : 0);
  }
}

}  // namespace megatune::executor::cuda::hopper
