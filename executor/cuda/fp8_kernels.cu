// FP8 casts: the amax reduction, the delayed-scaling state update and the tiled cast + transpose.
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>

#include "executor/cuda/cuda_check.h"
#include "executor/cuda/fp8_kernels.h"
#include "layouts/fp8.h"

namespace megatune::executor::cuda {
namespace {

constexpr int kTile = 32;      // a block casts a kTile x kTile tile
constexpr int kBlockRows = 8;  // threads (kTile, kBlockRows)
constexpr int kAmaxThreads = 256;

__device__ float encoding_max(bool e5m2) { return e5m2 ? 57344.0f : 448.0f; }

// layouts::fp8_scale_for_amax, in the same (double) arithmetic.
__device__ float scale_for_amax(float amax, bool e5m2, int margin) {
  if (!(amax > 0.0f) || !isfinite(amax)) return 1.0f;
  return static_cast<float>(static_cast<double>(encoding_max(e5m2)) / static_cast<double>(amax) /
                            ldexp(1.0, margin));
}

// |x| of non-negative floats ordered as their bit patterns (NaN above infinity), for atomicMax.
__device__ void atomic_max_abs(float* target, float value) {
  atomicMax(reinterpret_cast<unsigned int*>(target), __float_as_uint(value));
}

// Delayed scaling's pending amax from one block (its thread 0): an atomic only where the block's maximum is
// above the value already recorded (maxima only grow, so a stale read costs an atomic, never a lost value),
// and the pending flag from the first block only: thousands of blocks updating one address serialise.
__device__ void record_block_amax(float* state, float block, bool first_block) {
  float* pending = state + layouts::kFp8PendingAmax;
  if (__float_as_uint(block) > __float_as_uint(__ldcg(pending))) atomic_max_abs(pending, block);
  if (first_block) state[layouts::kFp8Pending] = 1.0f;
}

__device__ float block_max(float v) {
  __shared__ float warp_max[32];
  for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  const int threads = blockDim.x * blockDim.y;
  const int linear = threadIdx.y * blockDim.x + threadIdx.x;
  if (linear % 32 == 0) warp_max[linear / 32] = v;
  __syncthreads();
  float m = 0.0f;
  if (linear == 0) {
    for (int w = 0; w < (threads + 31) / 32; ++w) m = fmaxf(m, warp_max[w]);
  }
  return m;  // valid in thread 0
}

__global__ void amax_kernel(const __nv_bfloat16* src, int64_t rows, int64_t cols, int64_t ld, float* amax) {
  float m = 0.0f;
  bool nan = false;
  const int64_t total = rows * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float v = __bfloat162float(src[(i / cols) * ld + i % cols]);
    if (isnan(v)) nan = true;
    m = fmaxf(m, fabsf(v));
  }
  const float block = block_max(m);
  if (nan) atomic_max_abs(amax, __uint_as_float(0x7fc00000u));
  if (threadIdx.x == 0 && threadIdx.y == 0) atomic_max_abs(amax, block);
}

// Delayed scaling's update before a cast (reference::fp8_prepare_scale): one thread.
__global__ void delayed_prepare_kernel(float* state, bool e5m2, int margin, int history_len, bool amax_max) {
  using namespace layouts;
  if (state[kFp8Pending] == 0.0f) return;
  float* history = state + kFp8History;
  const int length = history_len > 1 ? history_len : 1;
  for (int i = length - 1; i > 0; --i) history[i] = history[i - 1];
  history[0] = state[kFp8PendingAmax];
  float chosen = history[0];
  if (amax_max)
    for (int i = 1; i < length; ++i) chosen = fmaxf(chosen, history[i]);
  if (chosen > 0.0f && isfinite(chosen)) {
    state[kFp8Scale] = scale_for_amax(chosen, e5m2, margin);
    state[kFp8ScaleInv] = 1.0f / state[kFp8Scale];
  }
  state[kFp8PendingAmax] = 0.0f;
  state[kFp8Pending] = 0.0f;
}

__device__ unsigned char to_fp8(float v, bool e5m2) {
  return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, e5m2 ? __NV_E5M2 : __NV_E4M3);
}

// One kTile x kTile tile per block: out (as stored) written row by row, out_t from the tile in shared
// memory, column by column, so both writes run along contiguous addresses.
__global__ void cast_kernel(Fp8CastLaunch p) {
  using namespace layouts;
  __shared__ unsigned char tile[kTile][kTile + 4];
  const int64_t row0 = int64_t(blockIdx.y) * kTile, col0 = int64_t(blockIdx.x) * kTile;
  float scale;
  if (p.current_scaling) {
    const float amax = p.state[kFp8PendingAmax];
    scale = scale_for_amax(amax, p.e5m2, p.margin);
    if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0 && threadIdx.y == 0) {
      p.state[kFp8Scale] = scale;
      p.state[kFp8ScaleInv] = 1.0f / scale;
    }
  } else {
    scale = p.state[kFp8Scale];
  }
  float m = 0.0f;
  bool nan = false;
  for (int r = threadIdx.y; r < kTile; r += kBlockRows) {
    const int64_t row = row0 + r, col = col0 + threadIdx.x;
    if (row < p.rows && col < p.cols) {
      const float v = __bfloat162float(p.src[row * p.ld + col]);
      if (isnan(v)) nan = true;
      m = fmaxf(m, fabsf(v));
      const unsigned char q = to_fp8(v * scale, p.e5m2);
      if (p.out != nullptr) p.out[row * p.cols + col] = q;
      tile[r][threadIdx.x] = q;
    }
  }
  if (!p.current_scaling) {
    const float block = block_max(m);
    if (nan) atomic_max_abs(p.state + kFp8PendingAmax, __uint_as_float(0x7fc00000u));
    if (threadIdx.x == 0 && threadIdx.y == 0)
      record_block_amax(p.state, block, blockIdx.x == 0 && blockIdx.y == 0);
  }
  if (p.out_t == nullptr) return;
  __syncthreads();
  for (int c = threadIdx.y; c < kTile; c += kBlockRows) {
    const int64_t col = col0 + c, row = row0 + threadIdx.x;
    if (row < p.rows && col < p.cols) p.out_t[col * p.rows + row] = tile[threadIdx.x][c];
  }
}

// The cast of aligned shapes (rows and cols multiples of kWide, rows of src 16-byte aligned): each block a
// kWide x kWide tile, each thread 8 consecutive values per load (one 16-byte load of bf16, one 8-byte store
// of FP8); the transposed copy leaves shared memory as 8 consecutive rows of one column per 8-byte store.
constexpr int kWide = 64;
constexpr int kWideThreads = 256;

__global__ void cast_wide_kernel(Fp8CastLaunch p) {
  using namespace layouts;
  __shared__ unsigned char tile[kWide][kWide + 8];
  const int64_t row0 = int64_t(blockIdx.y) * kWide, col0 = int64_t(blockIdx.x) * kWide;
  const float scale =
      p.current_scaling ? scale_for_amax(p.state[kFp8PendingAmax], p.e5m2, p.margin) : p.state[kFp8Scale];
  if (p.current_scaling && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) {
    p.state[kFp8Scale] = scale;
    p.state[kFp8ScaleInv] = 1.0f / scale;
  }
  const __nv_fp8_interpretation_t kind = p.e5m2 ? __NV_E5M2 : __NV_E4M3;
  float m = 0.0f;
  bool nan = false;
  constexpr int kVectorsPerRow = kWide / 8;
  for (int v = threadIdx.x; v < kWide * kVectorsPerRow; v += kWideThreads) {
    const int r = v / kVectorsPerRow, c = (v % kVectorsPerRow) * 8;
    const int64_t row = row0 + r, col = col0 + c;
    const uint4 raw = *reinterpret_cast<const uint4*>(p.src + row * p.ld + col);
    const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
    unsigned short q[4];
    for (int i = 0; i < 4; ++i) {
      const float2 f = __bfloat1622float2(pairs[i]);
      nan = nan || isnan(f.x) || isnan(f.y);
      m = fmaxf(m, fmaxf(fabsf(f.x), fabsf(f.y)));
      q[i] = __nv_cvt_float2_to_fp8x2(make_float2(f.x * scale, f.y * scale), __NV_SATFINITE, kind);
    }
    const unsigned long long packed = (unsigned long long)q[0] | ((unsigned long long)q[1] << 16) |
                                      ((unsigned long long)q[2] << 32) | ((unsigned long long)q[3] << 48);
    if (p.out != nullptr) *reinterpret_cast<unsigned long long*>(p.out + row * p.cols + col) = packed;
    *reinterpret_cast<unsigned long long*>(&tile[r][c]) = packed;
  }
  if (!p.current_scaling) {
    const float block = block_max(m);
    if (nan) atomic_max_abs(p.state + kFp8PendingAmax, __uint_as_float(0x7fc00000u));
    if (threadIdx.x == 0 && threadIdx.y == 0)
      record_block_amax(p.state, block, blockIdx.x == 0 && blockIdx.y == 0);
  }
  if (p.out_t == nullptr) return;
  __syncthreads();
  for (int v = threadIdx.x; v < kWide * kVectorsPerRow; v += kWideThreads) {
    const int c = v / kVectorsPerRow, r = (v % kVectorsPerRow) * 8;  // column c, rows r .. r + 7
    unsigned long long packed = 0;
    for (int i = 0; i < 8; ++i) packed |= (unsigned long long)tile[r + i][c] << (8 * i);
    *reinterpret_cast<unsigned long long*>(p.out_t + (col0 + c) * p.rows + row0 + r) = packed;
  }
}

// The cast without a transposed copy (a forward input's): blocks of (32, 8) threads over 32 vectors of 8
// values by kRowsPerBlock rows, each thread loading its kRowsPerThread vectors before converting any, so
// four 16-byte loads per thread are in flight. Needs cols and ld multiples of 8, src 16-byte and out 8-byte
// aligned.
constexpr int kRowsPerThread = 4;
constexpr int kRowsPerBlock = 8 * kRowsPerThread;

__global__ void cast_rows_kernel(Fp8CastLaunch p) {
  using namespace layouts;
  const float scale =
      p.current_scaling ? scale_for_amax(p.state[kFp8PendingAmax], p.e5m2, p.margin) : p.state[kFp8Scale];
  if (p.current_scaling && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0 && threadIdx.y == 0) {
    p.state[kFp8Scale] = scale;
    p.state[kFp8ScaleInv] = 1.0f / scale;
  }
  const __nv_fp8_interpretation_t kind = p.e5m2 ? __NV_E5M2 : __NV_E4M3;
  const int64_t vectors_per_row = p.cols / 8;
  const int64_t vc = int64_t(blockIdx.x) * 32 + threadIdx.x;
  const int64_t row0 = int64_t(blockIdx.y) * kRowsPerBlock + threadIdx.y;
  uint4 raw[kRowsPerThread];
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    const int64_t row = row0 + 8 * i;
    raw[i] = vc < vectors_per_row && row < p.rows
                 ? *reinterpret_cast<const uint4*>(p.src + row * p.ld + vc * 8)
                 : make_uint4(0, 0, 0, 0);
  }
  float m = 0.0f;
  bool nan = false;
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw[i]);
    unsigned short q[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 f = __bfloat1622float2(pairs[k]);
      nan = nan || isnan(f.x) || isnan(f.y);
      m = fmaxf(m, fmaxf(fabsf(f.x), fabsf(f.y)));
      q[k] = __nv_cvt_float2_to_fp8x2(make_float2(f.x * scale, f.y * scale), __NV_SATFINITE, kind);
    }
    const int64_t row = row0 + 8 * i;
    if (p.out != nullptr && vc < vectors_per_row && row < p.rows)
      *reinterpret_cast<unsigned long long*>(p.out + row * p.cols + vc * 8) =
          (unsigned long long)q[0] | ((unsigned long long)q[1] << 16) | ((unsigned long long)q[2] << 32) |
          ((unsigned long long)q[3] << 48);
  }
  if (!p.current_scaling) {
    const float block = block_max(m);
    if (nan) atomic_max_abs(p.state + kFp8PendingAmax, __uint_as_float(0x7fc00000u));
    if (threadIdx.x == 0 && threadIdx.y == 0)
      record_block_amax(p.state, block, blockIdx.x == 0 && blockIdx.y == 0);
  }
}

// The cast with a transposed copy on tiles of 64 rows x 128 columns (256 threads). Loading: each thread four
// 16-byte vectors of one vector column, rows 16 apart, all in flight before any conversion; the FP8 bytes
// go to `out` (8-byte stores) and to a shared tile whose rows are 33 words apart. Transposing: each thread
// reads the 8 x 4-byte block of rows 8g .. 8g + 7 and columns 4c .. 4c + 3 (lanes spread over 8 column and 4
// row groups, so a warp's 32 reads fall in 32 banks), transposes it with byte permutes and writes four
// 8-byte runs of out_t, a warp covering 8 columns x 32 consecutive bytes each. Needs rows % 64, cols % 128,
// ld % 8, src 16-byte and both outputs 8-byte aligned.
constexpr int kTransposeRows = 64, kTransposeCols = 128, kTransposeThreads = 256;
constexpr int kTileWords = kTransposeCols / 4 + 1;  // odd: the transposing reads are conflict-free

__global__ void __launch_bounds__(kTransposeThreads) cast_transpose_kernel(Fp8CastLaunch p) {
  using namespace layouts;
  __shared__ unsigned int tile[kTransposeRows * kTileWords];
  const int64_t row0 = int64_t(blockIdx.y) * kTransposeRows, col0 = int64_t(blockIdx.x) * kTransposeCols;
  const float scale =
      p.current_scaling ? scale_for_amax(p.state[kFp8PendingAmax], p.e5m2, p.margin) : p.state[kFp8Scale];
  if (p.current_scaling && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) {
    p.state[kFp8Scale] = scale;
    p.state[kFp8ScaleInv] = 1.0f / scale;
  }
  const __nv_fp8_interpretation_t kind = p.e5m2 ? __NV_E5M2 : __NV_E4M3;
  const int t = threadIdx.x;
  const int vc = t % 16, rr = t / 16;  // vector column (8 values), first row
  uint4 raw[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    raw[i] = *reinterpret_cast<const uint4*>(p.src + (row0 + rr + 16 * i) * p.ld + col0 + vc * 8);
  float m = 0.0f;
  bool nan = false;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw[i]);
    unsigned int q[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 f = __bfloat1622float2(pairs[k]);
      nan = nan || isnan(f.x) || isnan(f.y);
      m = fmaxf(m, fmaxf(fabsf(f.x), fabsf(f.y)));
      q[k] = __nv_cvt_float2_to_fp8x2(make_float2(f.x * scale, f.y * scale), __NV_SATFINITE, kind);
    }
    const unsigned int lo = q[0] | (q[1] << 16), hi = q[2] | (q[3] << 16);
    const int r = rr + 16 * i;
    if (p.out != nullptr)
      *reinterpret_cast<uint2*>(p.out + (row0 + r) * p.cols + col0 + vc * 8) = make_uint2(lo, hi);
    tile[r * kTileWords + 2 * vc] = lo;
    tile[r * kTileWords + 2 * vc + 1] = hi;
  }
  if (!p.current_scaling) {
    const float block = block_max(m);  // synchronizes the block
    if (nan) atomic_max_abs(p.state + kFp8PendingAmax, __uint_as_float(0x7fc00000u));
    if (threadIdx.x == 0 && threadIdx.y == 0)
      record_block_amax(p.state, block, blockIdx.x == 0 && blockIdx.y == 0);
  } else {
    __syncthreads();
  }
  if (p.out_t == nullptr) return;
  const int warp = t / 32, lane = t % 32;
  const int cg = (warp % 4) * 8 + lane % 8;  // columns 4cg .. 4cg + 3 of the tile
  const int rg = (warp / 4) * 4 + lane / 8;  // rows 8rg .. 8rg + 7
  unsigned int w[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) w[k] = tile[(8 * rg + k) * kTileWords + cg];
  unsigned int lo[4], hi[4];  // lo[q]: column 4cg + q at rows 8rg .. 8rg + 3, hi[q] at rows 8rg + 4 .. + 7
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const unsigned int* x = w + 4 * half;
    const unsigned int t0 = __byte_perm(x[0], x[1], 0x5140), t1 = __byte_perm(x[0], x[1], 0x7362);
    const unsigned int t2 = __byte_perm(x[2], x[3], 0x5140), t3 = __byte_perm(x[2], x[3], 0x7362);
    unsigned int* dst = half == 0 ? lo : hi;
    dst[0] = __byte_perm(t0, t2, 0x5410);
    dst[1] = __byte_perm(t0, t2, 0x7632);
    dst[2] = __byte_perm(t1, t3, 0x5410);
    dst[3] = __byte_perm(t1, t3, 0x7632);
  }
#pragma unroll
  for (int q = 0; q < 4; ++q)
    *reinterpret_cast<uint2*>(p.out_t + (col0 + 4 * cg + q) * p.rows + row0 + 8 * rg) =
        make_uint2(lo[q], hi[q]);
}

// amax of src (current scaling's first pass) when its rows are 16-byte aligned runs of multiples of 8
// values: a grid sized to fill the GPU once, each thread four 16-byte loads in flight per round, one atomic
// per block.
__global__ void amax_vectors_kernel(const __nv_bfloat16* src, int64_t rows, int64_t cols, int64_t ld,
                                    float* amax) {
  const int64_t vectors_per_row = cols / 8, total = rows * vectors_per_row;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  float m = 0.0f;
  bool nan = false;
  for (int64_t base = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; base < total; base += 4 * stride) {
    uint4 raw[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int64_t i = base + k * stride;
      if (i < total) {
        const int64_t row = ld == cols ? 0 : i / vectors_per_row;
        const int64_t offset = ld == cols ? i * 8 : row * ld + (i - row * vectors_per_row) * 8;
        raw[k] = *reinterpret_cast<const uint4*>(src + offset);
      } else {
        raw[k] = make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw[k]);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 f = __bfloat1622float2(pairs[j]);
        nan = nan || isnan(f.x) || isnan(f.y);
        m = fmaxf(m, fmaxf(fabsf(f.x), fabsf(f.y)));
      }
    }
  }
  const float block = block_max(m);
  if (nan) atomic_max_abs(amax, __uint_as_float(0x7fc00000u));
  if (threadIdx.x == 0 && __float_as_uint(block) > __float_as_uint(__ldcg(amax))) atomic_max_abs(amax, block);
}

bool vectors_aligned(const Fp8CastLaunch& p) {
  return p.cols % 8 == 0 && p.ld % 8 == 0 && reinterpret_cast<uintptr_t>(p.src) % 16 == 0 &&
         (p.out == nullptr || reinterpret_cast<uintptr_t>(p.out) % 8 == 0) &&
         (p.out_t == nullptr || reinterpret_cast<uintptr_t>(p.out_t) % 8 == 0);
}

bool transpose_tiles(const Fp8CastLaunch& p) {
  return vectors_aligned(p) && p.rows % kTransposeRows == 0 && p.cols % kTransposeCols == 0;
}

int multiprocessors() {
  static const int count = [] {
    int device = 0, sms = 0;
    MEGATUNE_CUDA_CHECK(cudaGetDevice(&device));
    MEGATUNE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    return sms;
  }();
  return count;
}

bool wide(const Fp8CastLaunch& p) {
  return p.rows % kWide == 0 && p.cols % kWide == 0 && p.ld % 8 == 0 &&
         reinterpret_cast<uintptr_t>(p.src) % 16 == 0 &&
         (p.out == nullptr || reinterpret_cast<uintptr_t>(p.out) % 8 == 0) &&
         (p.out_t == nullptr || reinterpret_cast<uintptr_t>(p.out_t) % 8 == 0);
}

}  // namespace

void fp8_cast(const Fp8CastLaunch& p, cudaStream_t stream) {
  if (p.rows <= 0 || p.cols <= 0) return;
  float* pending_amax = p.state + layouts::kFp8PendingAmax;
  const bool vectors = vectors_aligned(p);
  if (p.current_scaling) {
    MEGATUNE_CUDA_CHECK(cudaMemsetAsync(pending_amax, 0, sizeof(float), stream));
    const int64_t total = p.rows * p.cols;
    if (vectors) {
      const int64_t rounds = (total / 8 + 4 * kAmaxThreads - 1) / (4 * kAmaxThreads);
      const int blocks =
          static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(rounds, 8 * multiprocessors())));
      amax_vectors_kernel<<<blocks, kAmaxThreads, 0, stream>>>(p.src, p.rows, p.cols, p.ld, pending_amax);
    } else {
      const int blocks = static_cast<int>(std::min<int64_t>((total + kAmaxThreads - 1) / kAmaxThreads, 1024));
      amax_kernel<<<blocks, kAmaxThreads, 0, stream>>>(p.src, p.rows, p.cols, p.ld, pending_amax);
    }
  } else {
    delayed_prepare_kernel<<<1, 1, 0, stream>>>(p.state, p.e5m2, p.margin, p.history_len, p.amax_max);
  }
  MEGATUNE_CUDA_CHECK(cudaGetLastError());
  if (vectors && p.out_t == nullptr) {
    const dim3 grid(static_cast<unsigned>((p.cols / 8 + 31) / 32),
                    static_cast<unsigned>((p.rows + kRowsPerBlock - 1) / kRowsPerBlock));
    cast_rows_kernel<<<grid, dim3(32, 8), 0, stream>>>(p);
  } else if (transpose_tiles(p)) {
    const dim3 grid(static_cast<unsigned>(p.cols / kTransposeCols),
                    static_cast<unsigned>(p.rows / kTransposeRows));
    cast_transpose_kernel<<<grid, kTransposeThreads, 0, stream>>>(p);
  } else if (wide(p)) {
    const dim3 grid(static_cast<unsigned>(p.cols / kWide), static_cast<unsigned>(p.rows / kWide));
    cast_wide_kernel<<<grid, kWideThreads, 0, stream>>>(p);
  } else {
    const dim3 grid(static_cast<unsigned>((p.cols + kTile - 1) / kTile),
                    static_cast<unsigned>((p.rows + kTile - 1) / kTile));
    cast_kernel<<<grid, dim3(kTile, kBlockRows), 0, stream>>>(p);
  }
  MEGATUNE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace megatune::executor::cuda
