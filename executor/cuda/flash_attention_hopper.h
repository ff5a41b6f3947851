// The Hopper (sm_90a, wgmma) flash-attention kernels' launch interface, used by flash_attention_forward.cu
// and flash_attention_backward.cu (which own validation, workspaces, and the pre/post passes).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace megatune::executor::cuda::hopper {

struct ForwardArgs {
  const __nv_bfloat16* q;
  const __nv_bfloat16* k;
  const __nv_bfloat16* v;
  __nv_bfloat16* o;
  float* lse;                             // [b, n_q, s], natural log, scale included
  int64_t q_stride, kv_stride, o_stride;  // elements between tokens
  int batch, seq_len, num_heads, heads_per_group, head_dim;
  int head_dim_v;    // v and o: head_dim, or 128 with head dim 192 (MLA; warp-specialized kernel only)
  float scale_log2;  // softmax scale * log2(e)
  bool causal;
};
// O and lse; 64 query rows per warpgroup, warpgroups_per_block (1 or 2) per block, 128-row K/V tiles
// double-buffered.
void launch_forward(const ForwardArgs& args, int warpgroups_per_block, cudaStream_t stream);
// The tile width (the kernels' head dim) that runs a head dim: 64 -> 64; 80, 96, 128 -> 128 (the TMA unit
// zero-pads the tiles of 80 and 96; warp-specialized kernels with bulk dQ only); 0: no Hopper kernel.
__host__ __device__ inline int tile_head_dim(int head_dim) {
  return head_dim == 64 ? 64 : (head_dim == 80 || head_dim == 96 || head_dim == 128 ? 128 : 0);
}
// The warp-specialized kernels address tiles by 32-bit TMA coordinates over b * s token rows: they take
// a shape only while this holds (the callers run the cp.async kernels past it).
inline bool warp_specialized_takes(int64_t tokens) { return tokens < (int64_t(1) << 31); }
// The warp-specialized form (flash_attention_hopper_forward_ws.cu): a TMA producer warpgroup and
// consumer_warpgroups (2, or 3 for head dim 64) consumers of 64 query rows each; head dims 64, 80, 96, 128,
// 256 and 192 with v 128 (those two without the ping-pong). Needs warp_specialized_takes(b * s). ping_pong:
// the consumers take turns at the score product (named barriers).
void launch_forward_warp_specialized(const ForwardArgs& args, int consumer_warpgroups, bool ping_pong,
                                     cudaStream_t stream);

struct BackwardArgs {
  const __nv_bfloat16* q;
  const __nv_bfloat16* k;
  const __nv_bfloat16* v;
  const __nv_bfloat16* d_o;
  const float* lse;    // [b, n_q, s], base 2 (the forward's lse * log2(e))
  const float* delta;  // [b, n_q, s] = rowsum(dO o O)
  float* dq_accum;     // fp32, unscaled: [b, s, n_q, d] (atomics) or tiled (dq_tile_offset; bulk tiles)
  __nv_bfloat16* dk;
  __nv_bfloat16* dv;
  int64_t q_stride, kv_stride, o_stride;
  int batch, seq_len, num_heads, num_kv_heads, head_dim;
  float scale, scale_log2;
  bool causal;
};
// The main backward pass: a block of warpgroups_per_block (1 or 2) warpgroups owns 64 key rows per
// warpgroup of one (batch, kv head); dK, dV (scaled) written, dQ accumulated into dq_accum.
// dq_mode: kDqAtomics (8-byte atomics right after the dQ product) or, with two warpgroups, kDqBulkTiles
// (staged 64 x 64 panels added by bulk reductions into the tiled layout below).
enum BackwardDqMode : int { kDqAtomics = 0, kDqBulkTiles = 1 };
void launch_backward(const BackwardArgs& args, int warpgroups_per_block, int dq_mode, cudaStream_t stream);
// The warp-specialized form (flash_attention_hopper_backward_ws.cu): a producer warpgroup streams Q / dO
// through TMA and mbarriers, two consumer warpgroups compute as launch_backward's two-warpgroup kernel
// (dQ by atomics into the row layout, or with bulk_dq by staged bulk reductions into the tiled layout), with
// stages (2 or 3) Q / dO tiles in flight. Needs warp_specialized_takes(b * s).
void launch_backward_warp_specialized(const BackwardArgs& args, int stages, bool bulk_dq,
                                      cudaStream_t stream);

// Head dim 256 (flash_attention_hopper_backward_wide.cu): warp-specialized like the above with 64 key rows
// per block, its two consumer warpgroups splitting dK, dV and dQ by head-dim columns; dQ by atomics into the
// row layout. Needs warp_specialized_takes(b * s).
void launch_backward_wide(const BackwardArgs& args, cudaStream_t stream);

// The tiled dQ accumulator (kDqBulkTiles): tile (batch, head, row_block = position / 64, col_block = column /
// 64) holds 64 rows of 64 fp32 at dq_tile_offset() (head_dim: the tile width, tile_head_dim()); within a row
// the 16-byte chunk c is stored at c ^ (row & 7) (the staging tile's swizzle: conflict-free fragment stores,
// and the bulk copy moves the tile as it is).
__host__ __device__ inline int64_t dq_row_blocks(int64_t seq_len) { return (seq_len + 63) / 64; }
__host__ __device__ inline int64_t dq_tile_offset(int64_t batch, int64_t head, int64_t row_block,
                                                  int64_t col_block, int64_t num_heads, int64_t seq_len,
                                                  int64_t head_dim) {
  return (((batch * num_heads + head) * dq_row_blocks(seq_len) + row_block) * (head_dim / 64) + col_block) *
         (64 * 64);
}

}  // namespace megatune::executor::cuda::hopper
