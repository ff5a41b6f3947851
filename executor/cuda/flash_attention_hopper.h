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
  float scale_log2;  // softmax scale * log2(e)
  bool causal;
};
// O and lse; 64 query rows per warpgroup, warpgroups_per_block (1 or 2) per block, 128-row K/V tiles
// double-buffered.
void launch_forward(const ForwardArgs& args, int warpgroups_per_block, cudaStream_t stream);

struct BackwardArgs {
  const __nv_bfloat16* q;
  const __nv_bfloat16* k;
  const __nv_bfloat16* v;
  const __nv_bfloat16* d_o;
  const float* lse;    // [b, n_q, s], base 2 (the forward's lse * log2(e))
  const float* delta;  // [b, n_q, s] = rowsum(dO o O)
  float* dq_accum;     // [b, s, n_q, d], fp32, unscaled; added to with atomics
  __nv_bfloat16* dk;
  __nv_bfloat16* dv;
  int64_t q_stride, kv_stride, o_stride;
  int batch, seq_len, num_heads, num_kv_heads, head_dim;
  float scale, scale_log2;
  bool causal;
};
// The main backward pass: a block of warpgroups_per_block (1 or 2) warpgroups owns 64 key rows per
// warpgroup of one (batch, kv head); dK, dV (scaled) written, dQ accumulated into dq_accum.
// deferred_dq (two warpgroups only): a tile's dQ atomics are issued after the next tile's first products.
void launch_backward(const BackwardArgs& args, int warpgroups_per_block, bool deferred_dq,
                     cudaStream_t stream);

}  // namespace megatune::executor::cuda::hopper
