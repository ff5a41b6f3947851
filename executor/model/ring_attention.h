// RingAttention: one layer's core attention under context parallelism,
// cp_comm_type p2p (Megatron's default; the ring of TransformerEngine's
// AttnFuncWithCPAndKVP2P, layouts/context_parallel.h). The K,V blocks of the CP
// group pass around the ring by asynchronous send/recv, each transfer
// overlapping the attention of the block held; partial outputs are merged by
// their log-sum-exp. The backward runs the blocks in reverse, passing K,V and
// the blocks' dK,dV partial sums. Every op is recorded as
// layouts::build_step_program expands it.
#pragma once
#include <cstdint>

#include "executor/backend/backend.h"
#include "executor/parallel/communicator.h"
#include "layouts/context_parallel.h"

namespace megatune::executor {

struct RingAttentionShape {
  std::int64_t batch = 1, local_seq = 0;               // sequences and their local tokens
                                                       // (two chunks of seq / (2 cp))
  std::int64_t heads = 0, kv_heads = 0, head_dim = 0;  // on this TP rank
  float softmax_scale = 0.0f;
  std::int64_t tokens() const { return batch * local_seq; }
  std::int64_t q_width() const { return heads * head_dim; }
  std::int64_t kv_width() const { return 2 * kv_heads * head_dim; }  // [k | v] per token
};

// The kernels' view of the ring's attention calls for `block` (sizes and token strides, the backward's dQ,
// dK,dV into the ring's scratch): what a backend must run (Backend::attention_unsupported).
AttentionShape ring_kernel_shape(const RingAttentionShape& shape, layouts::RingBlock block);

class RingAttention {
 public:
  // Allocates the ring's scratch from the backend's arena (in sizing mode, only
  // counts).
  RingAttention(const RingAttentionShape& shape, DType dtype, Backend& backend, Communicator& communicator);

  // qkv (T, (heads + 2 kv_heads) d) packed, after RoPE; out (T, heads d) and
  // lse (batch * heads, local_seq) fp32 receive the attention over the whole
  // sequence's causal keys; kv_last (T, kv_width) keeps the last K,V block the
  // ring held (the backward starts from it).
  void forward(Tensor qkv, Tensor out, Tensor lse, Tensor kv_last, int layer, layouts::OpPhase phase);
  // d_qkv (T, qkv width) from d_out (T, heads d), with the forward's (merged)
  // out, lse and kv_last.
  void backward(Tensor qkv, Tensor out, Tensor lse, Tensor kv_last, Tensor d_out, Tensor d_qkv, int layer);

 private:
  void block_forward(Tensor qkv, Tensor kv, layouts::RingBlock block, int layer, layouts::OpPhase phase);
  void block_backward(Tensor qkv, Tensor kv, Tensor out, Tensor lse, Tensor d_out, layouts::RingBlock block,
                      int layer);
  CommHandle post(Tensor send, Tensor recv, bool backward, const char* send_label, const char* recv_label,
                  int layer, layouts::OpPhase phase);
  AttentionArgs block_args(Tensor q, Tensor kv, std::int64_t batch, std::int64_t queries, std::int64_t keys,
                           bool causal) const;
  Tensor rows(Tensor t, std::int64_t first, std::int64_t count) const;
  Tensor cols(Tensor t, std::int64_t first, std::int64_t count) const;

  RingAttentionShape shape_;
  Backend& backend_;
  Communicator& communicator_;
  int cp_ = 1, cp_rank_ = 0, next_rank_ = -1, prev_rank_ = -1;
  std::int64_t storage_ = 0;  // bytes per element of the compute dtype
  Tensor ring_[2];            // (2T, kv_width) each: a K,V block (rows [0, T)) and its
                              // dK,dV sum (rows [T, 2T))
  Tensor block_out_;          // (T, heads d) a block's partial output
  Tensor block_lse_;          // (1, batch * heads * local_seq) fp32 its log-sum-exp
  Tensor half_lse_;           // (heads, local_seq / 2) fp32 one sequence's second-half
                              // log-sum-exp
  Tensor dq_sum_, dq_block_;  // (T, heads d)
  Tensor dkv_block_;          // (T, kv_width)
};

}  // namespace megatune::executor
