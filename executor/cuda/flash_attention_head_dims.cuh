// The head dims the mma.sync flash-attention kernels are compiled for, and the dispatch from runtime head
// dims to a kernel instance: (q/k, v) = (64, 64), (80, 80), (96, 96), (128, 128), (192, 128) (MLA) and
// (256, 256). Also which shapes the Hopper wgmma kernels take.
#pragma once
#include <cstdint>

#include "executor/kernels/attention_shape.h"

namespace megatune::executor::cuda::flash {

template <int DQK, int DV>
struct HeadDims {
  static constexpr int qk = DQK;
  static constexpr int v = DV;
};

// Calls f(HeadDims<DQK, DV>{}) for the compiled instance matching (dqk, dv); false when there is none.
template <typename F>
bool with_head_dims(int64_t dqk, int64_t dv, F&& f) {
  if (dqk == 64 && dv == 64) return f(HeadDims<64, 64>{}), true;
  if (dqk == 80 && dv == 80) return f(HeadDims<80, 80>{}), true;
  if (dqk == 96 && dv == 96) return f(HeadDims<96, 96>{}), true;
  if (dqk == 128 && dv == 128) return f(HeadDims<128, 128>{}), true;
  if (dqk == 192 && dv == 128) return f(HeadDims<192, 128>{}), true;
  if (dqk == 256 && dv == 256) return f(HeadDims<256, 256>{}), true;
  return false;
}
constexpr const char* kHeadDimsInWords =
    "q/k and v head dims 64, 80, 96, 128 or 256 alike, or 192 with v 128";

inline bool head_dims_compiled(int64_t dqk, int64_t dv) {
  return with_head_dims(dqk, dv, [](auto) {});
}

// The Hopper wgmma kernels' shapes: head dim 64, 80, 96, 128 or 256 for q, k and v; self-attention (seq_kv
// == seq_q, no causal offset); k and v with one token stride, and (backward) dk, dv with the forward's. Head
// dims 80 and 96 (tiles zero-padded to 128 by the TMA unit) and 256 run only the warp-specialized kernels,
// whose 32-bit TMA coordinates need b * s < 2^31. The forward also takes MLA's q/k 192 with v 128 so.
inline bool hopper_pads(const AttentionShape& s) { return s.head_dim == 80 || s.head_dim == 96; }
inline bool hopper_warp_specialized_only(const AttentionShape& s) {
  return hopper_pads(s) || s.head_dim == 256 || s.v_dim() != s.head_dim;
}
inline bool hopper_geometry(const AttentionShape& s) {
  return s.kv_len() == s.seq_q && (!s.causal || s.causal_offset == 0) && s.k_stride() == s.v_stride() &&
         s.dk_stride() == s.k_stride() && s.dv_stride() == s.v_stride() &&
         (!hopper_warp_specialized_only(s) || s.batch * s.seq_q < (int64_t(1) << 31));
}
inline bool hopper_takes(const AttentionShape& s) {
  const bool head_dim =
      s.head_dim == 64 || s.head_dim == 80 || s.head_dim == 96 || s.head_dim == 128 || s.head_dim == 256;
  return head_dim && s.v_dim() == s.head_dim && hopper_geometry(s);
}
inline bool hopper_forward_takes(const AttentionShape& s) {
  return hopper_takes(s) || (s.head_dim == 192 && s.v_dim() == 128 && hopper_geometry(s));
}

// What the mma.sync kernels read of an AttentionShape besides pointers and scales.
struct KernelGeometry {
  int64_t q_stride, k_stride, v_stride, o_stride;  // elements between tokens (o: o and d_o)
  int seq_q, seq_kv, num_heads, heads_per_group;
  int causal_offset;  // causal: query i attends keys j <= i + causal_offset
  bool causal;
};
inline KernelGeometry geometry_of(const AttentionShape& s) {
  return {s.q_stride(),         s.k_stride(),    s.v_stride(),     s.o_stride(),
          int(s.seq_q),         int(s.kv_len()), int(s.num_heads), int(s.num_heads / s.num_kv_heads),
          int(s.causal_offset), s.causal};
}

}  // namespace megatune::executor::cuda::flash
