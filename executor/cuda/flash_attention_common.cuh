// Device building blocks of the flash-attention kernels: cp.async tile loads into XOR-swizzled shared
// memory, ldmatrix, mma.sync m16n8k16 (bf16 in, fp32 accumulate), and fragment conversions.
//
// Fragment layouts of mma.m16n8k16 (g = lane / 4, t = lane % 4):
//   A 16x16: r0 = (g, 2t..2t+1), r1 = (g+8, 2t..), r2 = (g, 2t+8..), r3 = (g+8, 2t+8..)
//   B 16x8 : r0 = (k 2t..2t+1, n g), r1 = (k 2t+8.., n g)
//   C 16x8 : c0,c1 = (g, 2t..2t+1), c2,c3 = (g+8, 2t..2t+1)
// Shared-memory tiles hold rows of D bf16 as D/8 16-byte chunks; chunk c of row r lives at chunk slot
// c ^ (r & 7), so the 8 rows an ldmatrix reads hit 8 different bank groups.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "executor/cuda/kernel_utils.cuh"

namespace megatune::executor::cuda::flash {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// 2^x with the SFU's approximation (relative error ~2^-22; -inf -> 0); the softmax needs no more.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

template <int D>
__device__ __forceinline__ int swizzled(int row, int chunk) {
  return row * D + ((chunk ^ (row & 7)) << 3);
}

// Shared-memory addresses and the cp.async copies: kernel_utils.cuh (shared with the non-attention kernels).
using detail::cp_async_16;
using detail::cp_async_commit;
using detail::cp_async_wait;
using detail::smem_address;

// Row width in shared memory of a tile D columns wide: a multiple of 64 columns, so that the swizzle's
// chunk slots (c ^ (r & 7)) stay inside the row (head dims 80, 96: 128; the padding is never read).
constexpr int padded_width(int d) { return (d + 63) / 64 * 64; }

// Loads a ROWS x D tile (rows row0.. of a strided global tensor) into swizzled shared memory rows of DP
// (>= D, a multiple of 64 unless DP == D is) columns; rows at or beyond row_limit are zero-filled. All
// THREADS threads of the block take part.
template <int ROWS, int D, int THREADS, int DP = D>
__device__ __forceinline__ void load_tile(__nv_bfloat16* smem, const __nv_bfloat16* gmem, int64_t row_stride,
                                          int row0, int row_limit) {
  constexpr int kChunks = ROWS * D / 8;
#pragma unroll
  for (int i = threadIdx.x; i < kChunks; i += THREADS) {
    const int row = i / (D / 8), chunk = i % (D / 8);
    const bool valid = row0 + row < row_limit;
    const __nv_bfloat16* src = gmem + int64_t(valid ? row0 + row : 0) * row_stride + chunk * 8;
    cp_async_16(smem + swizzled<DP>(row, chunk), src, valid);
  }
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(p)));
}

// c += a . b  (m16n8k16, bf16 inputs, fp32 accumulators)
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// A fragment (16 rows x 16 k) of a row-major [row][k] swizzled tile: rows row0.., k columns k0.. (k0 % 16 ==
// 0).
template <int D>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const __nv_bfloat16* tile, int row0, int k0) {
  const int lane = threadIdx.x & 31;
  const int row = row0 + (lane & 15), chunk = (k0 >> 3) + (lane >> 4);
  ldmatrix_x4(a, tile + swizzled<D>(row, chunk));
}

// B fragments of two n-tiles (n0.., n0+8..) for k columns k0.. from a tile stored [n][k] (B = tile^T):
// b[0], b[1] for n-tile 0, b[2], b[3] for n-tile 1.
template <int D>
__device__ __forceinline__ void load_b_nk(uint32_t (&b)[4], const __nv_bfloat16* tile, int n0, int k0) {
  const int lane = threadIdx.x & 31;
  const int row = n0 + (lane & 7) + ((lane >> 4) << 3), chunk = (k0 >> 3) + ((lane >> 3) & 1);
  ldmatrix_x4(b, tile + swizzled<D>(row, chunk));
}

// B fragments of two n-tiles (n0.., n0+8..) for k rows k0.. from a tile stored [k][n] (B = tile):
// b[0], b[1] for n-tile 0, b[2], b[3] for n-tile 1.
template <int D>
__device__ __forceinline__ void load_b_kn(uint32_t (&b)[4], const __nv_bfloat16* tile, int k0, int n0) {
  const int lane = threadIdx.x & 31;
  const int row = k0 + (lane & 7) + (((lane >> 3) & 1) << 3), chunk = (n0 >> 3) + (lane >> 4);
  ldmatrix_x4_trans(b, tile + swizzled<D>(row, chunk));
}

// acc (16 rows x N columns: N / 8 n-tiles) += A B^T over K columns, A the 16 rows row0.. of a [row][k] tile
// and B an [n][k] tile (shared-memory row widths KP).
template <int K, int KP, int N>
__device__ __forceinline__ void strip_times_tile_t(float (&acc)[N / 8][4], const __nv_bfloat16* a_tile,
                                                   int row0, const __nv_bfloat16* b_tile) {
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    uint32_t a[4];
    load_a<KP>(a, a_tile, row0, kk * 16);
#pragma unroll
    for (int np = 0; np < N / 16; ++np) {
      uint32_t b[4];
      load_b_nk<KP>(b, b_tile, np * 16, kk * 16);
      mma(acc[2 * np], a, b[0], b[1]);
      mma(acc[2 * np + 1], a, b[2], b[3]);
    }
  }
}

// acc (16 rows x D columns) += a (a 16 x 16 fragment) times rows k0..k0+15 of a [k][n] tile (row width DP).
template <int D, int DP>
__device__ __forceinline__ void fragment_times_rows(float (&acc)[D / 8][4], const uint32_t (&a)[4],
                                                    const __nv_bfloat16* tile, int k0) {
#pragma unroll
  for (int dpair = 0; dpair < D / 16; ++dpair) {
    uint32_t b[4];
    load_b_kn<DP>(b, tile, k0, dpair * 16);
    mma(acc[2 * dpair], a, b[0], b[1]);
    mma(acc[2 * dpair + 1], a, b[2], b[3]);
  }
}

// The A fragment (16 x 16) of two accumulator n-tiles side by side (columns 0-7 and 8-15), as bf16.
__device__ __forceinline__ void accumulators_as_a(uint32_t (&a)[4], const float (&left)[4],
                                                  const float (&right)[4]) {
  a[0] = pack_bf16(left[0], left[1]);
  a[1] = pack_bf16(left[2], left[3]);
  a[2] = pack_bf16(right[0], right[1]);
  a[3] = pack_bf16(right[2], right[3]);
}

}  // namespace megatune::executor::cuda::flash
