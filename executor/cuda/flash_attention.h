// Flash attention (FlashAttention-2 algorithm, bf16 tensor cores, fp32 softmax/accumulation) forward and
// backward on the layout of executor/kernels/attention_shape.h: causal (with an offset) or not, GQA, seq_q !=
// seq_kv, (q/k, v) head dims 64, 80, 96, 128, 256 alike and 192 with v 128, any sequence length.
// Self-attention with the forward's strides runs the Hopper wgmma kernels: head dims 64 and 128, 80 and 96 on
// the 128 kernels (tiles zero-padded by the TMA unit), 256 (forward with 64-row K / V tiles, backward with
// the head-dim columns split between the consumer warpgroups), and 192 / 128's forward; every other shape
// (and 192 / 128's backward) the templated mma.sync kernels. Extra memory is O(s): lse [b, n_q, seq_q] and
// the backward workspace; never s^2.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "executor/kernels/attention_shape.h"

namespace megatune::executor::cuda {

using bf16 = __nv_bfloat16;

// True when these kernels take the shape: compiled head dims (above), all token strides multiples of 8
// elements (16-byte rows), sequences and causal offset below 2^30. Pointers must be 16-byte aligned (checked
// at launch).
bool flash_attention_supports(const AttentionShape& shape);
// Empty when flash_attention_supports(shape) (for a valid shape), else why not in one phrase for a user.
std::string flash_attention_unsupported(const AttentionShape& shape);

// o [b, seq_q, n_q, d_v] (o_stride) and lse [b, n_q, seq_q] fp32 (natural log, scale included; -inf for a
// query that attends no key, whose o is 0) from q, k, v (for a packed qkv: q = qkv, k = qkv +
// shape.packed_k_offset(), v = qkv + shape.packed_v_offset()). Throws std::invalid_argument for unsupported
// shapes.
void flash_attention_forward(const AttentionShape& shape, const bf16* q, const bf16* k, const bf16* v,
                             bf16* o, float* lse, cudaStream_t stream);

// The same with the forward kernel's variant chosen explicitly (benchmarks and tests): rows_per_warp 16
// (mma.sync, 8 warps, Q fragments in registers up to head dim 128), 32 (mma.sync, 4 warps, Q re-read from
// shared memory, FlashAttention-2's shape; the default for shapes the wgmma kernels do not take, 16 past head
// dim 128) or 64 (Hopper wgmma, the self-attention shapes above only, one warpgroup per 64 query rows, with
// wgmma_warpgroups 1 or 2 warpgroups per block (head dims 64 and 128 only); 0: 1 for head dim 64 and 2 for
// 128). wgmma_warp_specialized: a TMA producer warpgroup plus wgmma_warpgroups consumer warpgroups, 2 or 3
// (head dim 64 only); 0: 3 for head dim 64, else 2; wgmma_ping_pong: its consumers take turns at Q K^T (not
// at head dims 192 and 256). flash_attention_forward runs
// the warp-specialized kernel without the ping-pong (H200: 1.10x the one-warpgroup kernel at head dim 64,
// 1.26-1.36x the two-warpgroup kernel at 128; the ping-pong is +-5%: bench/RESULTS.md "attention"), and
// the two-warpgroup / one-warpgroup kernel past 2^31 tokens (its TMA coordinates are 32-bit).
constexpr int kDefaultForwardRowsPerWarp = 64;
void flash_attention_forward_variant(const AttentionShape& shape, const bf16* q, const bf16* k, const bf16* v,
                                     bf16* o, float* lse, cudaStream_t stream, int rows_per_warp,
                                     int wgmma_warpgroups = 0, bool wgmma_warp_specialized = false,
                                     bool wgmma_ping_pong = false);

// Workspace of the backward pass: fp32 dq accumulator (b * n_q * seq_q * d, seq_q rounded up to 64) + delta =
// rowsum(dO o o) [b, n_q, seq_q] + lse in base 2.
size_t flash_attention_backward_workspace_bytes(const AttentionShape& shape);

// dq (dq_stride), dk (dk_stride), dv (dv_stride; GQA: dk, dv summed over the heads of each group) from d_o
// (o_stride), and q, k, v, o, lse of the forward, or o and lse merged over several key blocks (each call then
// yields this block's share; the caller sums the shares). Overwrites dq, dk, dv (in a packed dqkv buffer pass
// dq = dqkv, dk = dqkv + packed_k_offset(), dv = dqkv + packed_v_offset()). Three launches: delta
// (preprocess), the main kv-block-parallel pass (dk, dv in registers, dq by fp32 bulk tile reductions into
// the workspace), and the dq conversion to bf16. dk and dv are bitwise deterministic; dq is not (the order of
// the fp32 reductions varies between runs; differences are at fp32 rounding level before the bf16 cast).
// workspace: flash_attention_backward_workspace_bytes(shape).
void flash_attention_backward(const AttentionShape& shape, const bf16* q, const bf16* k, const bf16* v,
                              const bf16* o, const float* lse, const bf16* d_o, bf16* dq, bf16* dk, bf16* dv,
                              void* workspace, size_t workspace_bytes, cudaStream_t stream);

// How the wgmma backward (two warpgroups per block, or warp-specialized) adds a tile's dQ panels to the
// fp32 accumulator.
enum class WgmmaDq {
  // 8-byte atomics from the wgmma fragment, right after the dQ product.
  kAtomics,
  // Each panel (64 x 64 fp32) to a shared staging tile, then one 16 KiB bulk reduction
  // (cp.reduce.async.bulk .add.f32, issued by one thread) into an accumulator laid out in 64 x 64 tiles; the
  // conversion to bf16 reads that layout. The default: in the warp-specialized kernel 1.09-1.22x the
  // atomics (the consumers no longer wait on them); in the two-warpgroup kernel 0.96-1.01x
  // (bench/RESULTS.md "attention").
  kBulkTiles,
};

// The same with the main pass's variant chosen explicitly (benchmarks and tests); the defaults are
// flash_attention_backward's.
struct BackwardVariant {
  // 64 (4 warps, 2 blocks per SM) or 128 (8 warps, 1 block per SM: half the Q/dO loads and dq atomics per
  // key row, but 0-9% slower on H200: bench/RESULTS.md "attention").
  int key_rows_per_block = 64;
  // Launch order: every head's first key block (the longest under a causal mask) before any second one,
  // so the short blocks fill the tail (+1-20% on H200); false: the key blocks of one head consecutively.
  bool longest_first = true;
  // The Hopper wgmma kernel (the default for head dim 64, 80, 96, 128, 256 self-attention with the forward's
  // strides, the only shapes it takes; longest first under a causal mask, the key blocks of one head
  // consecutively without; 80 and 96 take only the warp-specialized kernel with bulk dQ, 256 only the
  // warp-specialized one with dQ atomics, both with 2 stages); false: the mma.sync kernel shaped by the two
  // fields above (128 key rows: head dim 64 / 128 only).
  bool wgmma = true;
  // wgmma kernel: warpgroups per block, 64 key rows each: 1 (two blocks per SM) or 2 (one block per SM,
  // shared Q/dO tiles, half the dQ atomics per key row); 0: the default for the head dim.
  int wgmma_warpgroups = 0;
  // wgmma kernel with two warpgroups, or warp-specialized: how a tile's dQ panels reach the fp32 accumulator
  // (one warpgroup per block always adds them with atomics).
  WgmmaDq wgmma_dq = WgmmaDq::kBulkTiles;
  // wgmma kernel: the warp-specialized form (the default: a TMA producer warpgroup and two consumer
  // warpgroups; 1.05-1.17x the two-warpgroup kernel, bench/RESULTS.md "attention"); wgmma_warpgroups applies
  // only without it, wgmma_dq to both.
  bool wgmma_warp_specialized = true;
  // Warp-specialized kernel: Q / dO tiles in flight, 2 or 3.
  int wgmma_ws_stages = 2;
};
void flash_attention_backward_variant(const AttentionShape& shape, const bf16* q, const bf16* k,
                                      const bf16* v, const bf16* o, const float* lse, const bf16* d_o,
                                      bf16* dq, bf16* dk, bf16* dv, void* workspace, size_t workspace_bytes,
                                      cudaStream_t stream, BackwardVariant variant);

}  // namespace megatune::executor::cuda
