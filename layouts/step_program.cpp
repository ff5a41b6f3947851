// Step program expansion: schedule items -> the GEMMs, attention, memory-bound kernels and collectives
// of each layer (conventions in step_program.h).
#include "layouts/step_program.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "layouts/context_parallel.h"
#include "layouts/mla_ops.h"
#include "layouts/op_sink.h"
#include "layouts/rank_grid.h"
#include "layouts/schedule_walker.h"

namespace megatune::layouts {
namespace {

constexpr std::int64_t kAct = 2;  // bf16 activation bytes

// One ring transfer (a kSend to send_peer and a kRecv from recv_peer, global ranks) over the CP group.
void ring_transfer(OpSink& o, const RankShape& s, RingPayload payload, bool backward) {
  if (payload == RingPayload::kNone) return;
  const std::int64_t kv_bytes = context_parallel_kv_bytes(s.tokens, s.attention().kv_heads, s.head_dim, kAct);
  const bool both = payload == RingPayload::kKvAndDkv;
  const char* send = payload == RingPayload::kKv ? "cp_kv_send" : both ? "cp_kv_dkv_send" : "cp_dkv_send";
  const char* recv = payload == RingPayload::kKv ? "cp_kv_recv" : both ? "cp_kv_dkv_recv" : "cp_dkv_recv";
  for (const bool is_send : {true, false}) {
    Op& op = o.add(is_send ? OpKind::kSend : OpKind::kRecv, is_send ? send : recv);
    op.role = OpRole::kContextParallelRing;
    op.bytes = both ? 2 * kv_bytes : kv_bytes;
    op.group = CommGroup::kContext;
    op.group_size = s.cp;
    // Forward: K,V towards the next CP rank; backward the other way round.
    op.peer_rank = is_send == backward ? s.cp_ring.prev_rank : s.cp_ring.next_rank;
  }
}

// The kernels of one ring block: the diagonal over the whole micro-batch, a half block per sequence (its
// queries or keys are every sequence's half: no single batch stride covers them).
void ring_block_kernels(OpSink& o, const RankShape& s, OpKind kind, RingBlock block) {
  const RingBlockSpan span = ring_block_span(block, s.seq_local);
  AttentionShape a = s.attention();
  a.seq_q = span.queries;
  a.seq_kv = span.keys;
  a.causal = span.causal;
  const std::int64_t calls = block == RingBlock::kDiagonal ? 1 : s.micro_batch;
  if (block != RingBlock::kDiagonal) a.batch = 1;
  for (std::int64_t c = 0; c < calls; ++c) o.attention(kind, "attn", a);
}

// Core attention of one layer, forward. cp == 1 or all-gathered K,V: one kernel over (s/cp, s). Ring (p2p,
// layouts/context_parallel.h): the rank's K,V packed into one buffer, then cp steps, each posting the
// transfer of the next block before the kernels of the block it holds (which it overlaps); every block
// after the first is merged into the output by its log-sum-exp.
void context_attention_forward(OpSink& o, const RankShape& s, const StepProgramOptions& options) {
  AttentionShape a = s.attention();
  if (s.cp == 1 || options.cp_comm == ContextParallelComm::kAllGather) {
    o.attention(OpKind::kAttentionForward, "attn", a);
    return;
  }
  const std::int64_t kv_bytes = context_parallel_kv_bytes(s.tokens, a.kv_heads, s.head_dim, kAct);
  o.memory(OpKind::kElementwise, "cp_kv_pack", 2 * kv_bytes);
  for (int step = 0; step < s.cp; ++step) {
    ring_transfer(o, s, ring_forward_payload(s.cp, step), false);
    const RingBlock block =
        ring_block(s.cp_ring.cp_rank, ring_forward_key_rank(s.cp, s.cp_ring.cp_rank, step));
    ring_block_kernels(o, s, OpKind::kAttentionForward, block);
    if (step == 0) continue;
    const std::int64_t rows = s.micro_batch * ring_block_span(block, s.seq_local).queries;
    o.memory(OpKind::kElementwise, "cp_attn_merge", attention_merge_bytes(rows, a.heads, s.head_dim, kAct));
  }
}

// Backward of the ring: cp steps over the blocks in reverse order, each posting the transfer of the next K,V
// block with the dK,dV partial sum of the held one before its kernels, then adding the block's dQ into the
// rank's and its dK,dV into the partial sum that arrived; the complete dQ and own dK,dV are unpacked into the
// qkv gradient at the end.
void context_attention_backward(OpSink& o, const RankShape& s, const StepProgramOptions& options) {
  AttentionShape a = s.attention();
  if (s.cp == 1 || options.cp_comm == ContextParallelComm::kAllGather) {
    o.attention(OpKind::kAttentionBackward, "attn", a);
    return;
  }
  const std::int64_t q_width = a.heads * s.head_dim, kv_width = 2 * a.kv_heads * s.head_dim;
  for (int step = 0; step < s.cp; ++step) {
    ring_transfer(o, s, ring_backward_payload(s.cp, step), true);
    const RingBlock block =
        ring_block(s.cp_ring.cp_rank, ring_backward_key_rank(s.cp, s.cp_ring.cp_rank, step));
    ring_block_kernels(o, s, OpKind::kAttentionBackward, block);
    const RingBlockSpan span = ring_block_span(block, s.seq_local);
    o.memory(OpKind::kElementwise, "cp_dq_add", 3 * s.micro_batch * span.queries * q_width * kAct);
    o.memory(OpKind::kElementwise, "cp_dkv_add", 3 * s.micro_batch * span.keys * kv_width * kAct);
  }
  o.memory(OpKind::kElementwise, "cp_dq_unpack", 2 * s.tokens * q_width * kAct);
  o.memory(OpKind::kElementwise, "cp_dkv_unpack", 2 * s.tokens * kv_width * kAct);
}

std::int64_t norm_bytes(const RankShape& s) { return 2 * s.tokens_sp * s.hidden * kAct; }
// The pre-MLP norm also adds the attention block's residual: reads the projection output and the layer
// input, writes their sum (the MLP's residual) and the norm output.
std::int64_t norm_residual_bytes(const RankShape& s) { return 4 * s.tokens_sp * s.hidden * kAct; }

// TP collective that ends a row-parallel block in forward (AR without SP, RS with SP).
void tp_reduce(OpSink& o, const RankShape& s, const char* ar_label, const char* rs_label) {
  if (s.sp)
    o.comm(OpKind::kReduceScatter, rs_label, s.tokens * s.hidden * kAct, CommGroup::kTensor, s.tp);
  else
    o.comm(OpKind::kAllReduce, ar_label, s.tokens * s.hidden * kAct, CommGroup::kTensor, s.tp);
}

// A linear layer's forward GEMM (T, out) = (T, in) x (in, out). Under FP8 (layouts/fp8.h) its casts come
// first: the weight (to FP8 and transposed) at the first forward of the iteration (micro-batch 0, not a
// re-run), then the input; the GEMM's operands are FP8. A cast is a kElementwise op of dtype kFP8 (what it
// writes), so that its price and its measurements are told apart from the bf16 element-wise kernels'.
void linear_gemm(OpSink& o, const Fp8Settings& fp8, const std::string& label, std::int64_t tokens,
                 std::int64_t out, std::int64_t in, bool accumulate = false) {
  if (fp8.enabled()) {
    const bool current = fp8.recipe == Fp8Recipe::kTensorwise;
    if (o.phase() == OpPhase::kForward && o.microbatch() == 0) {
      o.memory(OpKind::kElementwise, (label + "_weight_fp8").c_str(), fp8_cast_bytes(out * in, 2, current));
      o.last().dtype = DType::kFP8;
    }
    o.memory(OpKind::kElementwise, (label + "_input_fp8").c_str(), fp8_cast_bytes(tokens * in, 1, current));
    o.last().dtype = DType::kFP8;
  }
  o.gemm(label.c_str(), tokens, out, in, accumulate);
  if (fp8.enabled()) o.last().dtype = DType::kFP8;
}

// Its backward GEMMs (OpSink::gemm_backward). Under FP8 the output gradient is cast (as stored and
// transposed, the bias gradient read in the same pass) before the data gradient, and the input again
// (transposed, always from its own amax) before the weight gradient; without the data gradient the weight
// gradient's cast of the output gradient comes from the data gradient issued before it.
void linear_gemm_backward(OpSink& o, const Fp8Settings& fp8, const std::string& label, std::int64_t tokens,
                          std::int64_t out, std::int64_t in, bool need_dgrad = true, bool need_wgrad = true) {
  if (!fp8.enabled()) {
    o.gemm_backward(label, tokens, out, in, need_dgrad, need_wgrad);
    return;
  }
  if (need_dgrad) {
    o.memory(OpKind::kElementwise, (label + "_grad_fp8").c_str(),
             fp8_cast_bytes(tokens * out, 2, fp8.recipe == Fp8Recipe::kTensorwise));
    o.last().dtype = DType::kFP8;
    o.gemm_backward(label, tokens, out, in, true, false);
    o.last().dtype = DType::kFP8;
  }
  if (need_wgrad) {
    o.memory(OpKind::kElementwise, (label + "_input_fp8t").c_str(), fp8_cast_bytes(tokens * in, 1, true));
    o.last().dtype = DType::kFP8;
    o.gemm_backward(label, tokens, out, in, false, true);
    o.last().dtype = DType::kFP8;
  }
}

// --qk-layernorm's head norms on this rank's heads, q then k (rows of head_dim: T * heads and T * groups):
// the forward reads and writes each (2 tensors), the backward reads the input and the output gradient and
// writes the input gradient (3).
void qk_norms(OpSink& o, const RankShape& s, OpKind kind, std::int64_t tensors) {
  const AttentionShape a = s.attention();
  o.memory(kind, "q_norm", tensors * s.tokens * a.heads * s.head_dim * kAct);
  o.memory(kind, "k_norm", tensors * s.tokens * a.kv_heads * s.head_dim * kAct);
}

void attention_block_forward(OpSink& o, const ModelSpec& model, const RankShape& s,
                             const StepProgramOptions& options, bool recompute_core_only) {
  const AttentionShape a = s.attention();
  if (!recompute_core_only) {
    o.memory(OpKind::kNorm, "input_norm", norm_bytes(s));
    if (s.mla) {
      mla_projections_forward(o, model, s);
    } else {
      if (s.sp)
        o.comm(OpKind::kAllGather, "qkv_input_ag", s.tokens * s.hidden * kAct, CommGroup::kTensor, s.tp);
      linear_gemm(o, options.fp8, "qkv", s.tokens, s.qkv_width(), s.hidden);
      if (s.qk_norm) qk_norms(o, s, OpKind::kNorm, 2);
      if (s.rope) o.memory(OpKind::kRope, "rope", 2 * s.tokens * (a.heads + a.kv_heads) * s.head_dim * kAct);
    }
    if (s.cp > 1 && options.cp_comm == ContextParallelComm::kAllGather) {
      const std::int64_t kv_bytes = context_parallel_kv_bytes(s.tokens, a.kv_heads, s.head_dim, kAct);
      o.comm(OpKind::kAllGather, "cp_kv_ag", kv_bytes * s.cp, CommGroup::kContext, s.cp);
    }
  }
  context_attention_forward(o, s, options);
  if (recompute_core_only) return;
  const std::int64_t proj_in = s.attention_width();
  linear_gemm(o, options.fp8, "proj", s.tokens, s.hidden, proj_in);
  tp_reduce(o, s, "proj_ar", "proj_rs");
  // The residual add follows in the pre-MLP norm (norm_residual_bytes).
}

// norms_fresh: a full-recompute re-run has just produced this layer's norm outputs (see layer_backward).
void attention_block_backward(OpSink& o, const ModelSpec& model, const RankShape& s,
                              const StepProgramOptions& options, bool norms_fresh) {
  const AttentionShape a = s.attention();
  const std::int64_t proj_in = s.attention_width();
  if (s.sp) o.comm(OpKind::kAllGather, "proj_grad_ag", s.tokens * s.hidden * kAct, CommGroup::kTensor, s.tp);
  linear_gemm_backward(o, options.fp8, "proj", s.tokens, s.hidden, proj_in);
  if (s.mla) {
    // The input norm's output (gathered without --q-lora-rank under SP) first, then the attention core and
    // the projections' backward (MlaAttention's order).
    if (!norms_fresh) o.with_phase(OpPhase::kRecompute).memory(OpKind::kNorm, "input_norm", norm_bytes(s));
    if (s.sp && model.q_lora_rank == 0)
      o.comm(OpKind::kAllGather, "qkv_input_ag", s.tokens * s.hidden * kAct, CommGroup::kTensor, s.tp);
    context_attention_backward(o, s, options);
    mla_projections_backward(o, model, s);
    o.memory(OpKind::kNormBackward, "input_norm", 3 * s.tokens_sp * s.hidden * kAct);
    return;
  }
  const std::int64_t kv_bytes = context_parallel_kv_bytes(s.tokens, a.kv_heads, s.head_dim, kAct);
  context_attention_backward(o, s, options);
  if (s.cp > 1 && options.cp_comm == ContextParallelComm::kAllGather) {
    o.comm(OpKind::kReduceScatter, "cp_dkv_rs", kv_bytes * s.cp, CommGroup::kContext, s.cp);
  }
  if (s.rope)
    o.memory(OpKind::kRopeBackward, "rope", 2 * s.tokens * (a.heads + a.kv_heads) * s.head_dim * kAct);
  if (s.qk_norm) qk_norms(o, s, OpKind::kNormBackward, 3);
  // The input norm's output is not saved: recomputed (from the layer input and its statistics) for the
  // weight gradients, unless a full-recompute re-run just produced it.
  if (!norms_fresh) o.with_phase(OpPhase::kRecompute).memory(OpKind::kNorm, "input_norm", norm_bytes(s));
  if (s.sp) o.comm(OpKind::kAllGather, "qkv_input_ag", s.tokens * s.hidden * kAct, CommGroup::kTensor, s.tp);
  linear_gemm_backward(o, options.fp8, "qkv", s.tokens, s.qkv_width(), s.hidden);
  if (s.sp)
    o.comm(OpKind::kReduceScatter, "qkv_dgrad_rs", s.tokens * s.hidden * kAct, CommGroup::kTensor, s.tp);
  else
    o.comm(OpKind::kAllReduce, "qkv_dgrad_ar", s.tokens * s.hidden * kAct, CommGroup::kTensor, s.tp);
  o.memory(OpKind::kNormBackward, "input_norm", 3 * s.tokens_sp * s.hidden * kAct);
}

// GELU runs in fc1's GEMM epilogue (cuBLASLt GELU_AUX_BIAS), so only SwiGLU issues an activation kernel.
void dense_mlp_forward(OpSink& o, const RankShape& s, const Fp8Settings& fp8, std::int64_t ffn,
                       const char* fc1, const char* fc2, bool with_norm) {
  if (with_norm) {
    o.memory(OpKind::kNorm, "pre_mlp_norm", norm_residual_bytes(s));
    if (s.sp)
      o.comm(OpKind::kAllGather, "fc1_input_ag", s.tokens * s.hidden * kAct, CommGroup::kTensor, s.tp);
  }
  linear_gemm(o, fp8, fc1, s.tokens, s.glu_factor() * ffn, s.hidden);
  if (s.swiglu) o.memory(OpKind::kActivation, "act", s.tokens * (s.glu_factor() + 1) * ffn * kAct);
  linear_gemm(o, fp8, fc2, s.tokens, s.hidden, ffn);
}

// The activation output is not saved: fc2's data gradient comes first, then one activation-backward pass
// turns it into fc1's output gradient and recomputes the activation output for fc2's weight gradient, which
// follows (bytes: read fc1 output and its gradient input, write both). recompute_norm: the pre-MLP norm
// output is not saved either, but recomputed before fc1's backward GEMMs (unless a full-recompute re-run just
// produced it).
void dense_mlp_backward(OpSink& o, const RankShape& s, const Fp8Settings& fp8, std::int64_t ffn,
                        const std::string& fc1, const std::string& fc2, bool recompute_norm,
                        bool norms_fresh) {
  linear_gemm_backward(o, fp8, fc2, s.tokens, s.hidden, ffn, true, /*need_wgrad=*/false);
  o.memory(OpKind::kActivationBackward, "act", s.tokens * (2 * s.glu_factor() + 2) * ffn * kAct);
  linear_gemm_backward(o, fp8, fc2, s.tokens, s.hidden, ffn, /*need_dgrad=*/false);
  if (recompute_norm && !norms_fresh)
    o.with_phase(OpPhase::kRecompute).memory(OpKind::kNorm, "pre_mlp_norm", norm_bytes(s));
  // Sequence parallelism: the norm output is re-gathered for fc1's weight gradient (before its GEMMs).
  if (recompute_norm && s.sp)
    o.comm(OpKind::kAllGather, "fc1_input_ag", s.tokens * s.hidden * kAct, CommGroup::kTensor, s.tp);
  linear_gemm_backward(o, fp8, fc1, s.tokens, s.glu_factor() * ffn, s.hidden);
}

// Rows one rank's experts process per microbatch under uniform routing.
std::int64_t expert_rows(const RankShape& s) {
  const std::int64_t local_tokens = s.tokens / s.tp;  // SP-sharded tokens entering the MoE layer
  if (s.moe_dispatcher == MoeDispatcher::kAllGather) {
    // Every rank sees all tokens of the tp-ep group; its E/ep experts get topk/E of them each.
    return local_tokens * s.etp * s.ep * s.topk / s.ep;
  }
  return local_tokens * s.topk * s.etp;
}

// The shared expert: the dense MLP on the MoE block's input, its output added to the routed experts', its
// input gradient to theirs. At TP 1 fc2 accumulates into the routed output and fc1's data gradient into
// theirs; at TP > 1 (sequence parallel) the MoE block holds T / tp rows: the block input is gathered for
// fc1 (forward, and again for its weight gradient), fc2's partial sums are reduce-scattered and added to
// the routed output ("shared_add"), and fc1's data gradient likewise ("shared_dgrad_add").
void shared_expert_forward(OpSink& o, const RankShape& s) {
  const bool split = s.tp > 1;
  if (s.sp)
    o.comm(OpKind::kAllGather, "shared_input_ag", s.tokens * s.hidden * kAct, CommGroup::kTensor, s.tp);
  o.gemm("shared_fc1", s.tokens, s.glu_factor() * s.shared_ffn_per_rank(), s.hidden);
  if (s.swiglu)
    o.memory(OpKind::kActivation, "act", s.tokens * (s.glu_factor() + 1) * s.shared_ffn_per_rank() * kAct);
  o.gemm("shared_fc2", s.tokens, s.hidden, s.shared_ffn_per_rank(), /*accumulate=*/!split);
  tp_reduce(o, s, "shared_fc2_ar", "shared_fc2_rs");
  if (split) o.memory(OpKind::kElementwise, "shared_add", 3 * s.tokens_sp * s.hidden * kAct);
}

void shared_expert_backward(OpSink& o, const RankShape& s) {
  const std::int64_t ffn = s.shared_ffn_per_rank();
  const bool split = s.tp > 1;
  if (s.sp)
    o.comm(OpKind::kAllGather, "shared_grad_ag", s.tokens * s.hidden * kAct, CommGroup::kTensor, s.tp);
  o.gemm_backward("shared_fc2", s.tokens, s.hidden, ffn, true, /*need_wgrad=*/false);
  o.memory(OpKind::kActivationBackward, "act", s.tokens * (2 * s.glu_factor() + 2) * ffn * kAct);
  o.gemm_backward("shared_fc2", s.tokens, s.hidden, ffn, /*need_dgrad=*/false);
  o.gemm("shared_fc1_dgrad", s.tokens, s.hidden, s.glu_factor() * ffn, /*accumulate=*/!split);
  if (s.sp)
    o.comm(OpKind::kAllGather, "shared_input_ag", s.tokens * s.hidden * kAct, CommGroup::kTensor, s.tp);
  o.gemm_backward("shared_fc1", s.tokens, s.glu_factor() * ffn, s.hidden, /*need_dgrad=*/false);
  if (s.sp)
    o.comm(OpKind::kReduceScatter, "shared_dgrad_rs", s.tokens * s.hidden * kAct, CommGroup::kTensor, s.tp);
  else
    o.comm(OpKind::kAllReduce, "shared_dgrad_ar", s.tokens * s.hidden * kAct, CommGroup::kTensor, s.tp);
  if (split) o.memory(OpKind::kElementwise, "shared_dgrad_add", 3 * s.tokens_sp * s.hidden * kAct);
}

// The experts' GEMMs over all local rows, each one grouped GEMM (their activation as one pass).
void experts_forward(OpSink& o, const RankShape& s, std::int64_t rows) {
  o.gemm("expert_fc1", rows, s.glu_factor() * s.moe_ffn_per_rank(), s.hidden);
  o.memory(OpKind::kActivation, "expert_act", rows * (s.glu_factor() + 1) * s.moe_ffn_per_rank() * kAct);
  o.gemm("expert_fc2", rows, s.hidden, s.moe_ffn_per_rank());
}

// As the dense MLP's backward: fc2's data gradient, the activation pass that recomputes its output, fc2's
// weight gradient, then fc1's.
void experts_backward(OpSink& o, const RankShape& s, std::int64_t rows) {
  const std::int64_t ffn = s.moe_ffn_per_rank();
  o.gemm_backward("expert_fc2", rows, s.hidden, ffn, true, /*need_wgrad=*/false);
  o.memory(OpKind::kActivationBackward, "expert_act", rows * (2 * s.glu_factor() + 2) * ffn * kAct);
  o.gemm_backward("expert_fc2", rows, s.hidden, ffn, /*need_dgrad=*/false);
  o.gemm_backward("expert_fc1", rows, s.glu_factor() * ffn, s.hidden);
}

// Permute reads the block input's rows once per routed copy and writes the copies; unpermute reads the
// copies and writes the combined rows (its backward reads the gradient and the copies, writes the copies'
// gradient); the permutation's backward reads the copies' gradient and writes the input's.
// alltoall: permute the T/tp rows, exchange the counts over tp-ep, all-to-all over EP, all-gather over ETP
// (every ETP rank's experts then see the rows of the whole ETP group; fc2's partial sums are
// reduce-scattered back over ETP); experts; the way back. allgather (Megatron's order): all-gather over tp-ep
// of the routing (one fp32 (T/tp, E) tensor: the probabilities with the routing map folded in, where Megatron
// gathers a bool map and the probabilities) and of the rows, permute the gathered rows routed to the local
// experts, experts, unpermute into the gathered rows, reduce-scatter back; its backward reduce-scatters the
// probabilities' gradient to the ranks that routed them.
void moe_mlp_forward(OpSink& o, const RankShape& s) {
  const std::int64_t local_tokens = s.tokens / s.tp, copies = local_tokens * s.topk;
  const std::int64_t rows = expert_rows(s);
  const int tp_ep = s.etp * s.ep;
  o.memory(OpKind::kNorm, "pre_mlp_norm", norm_residual_bytes(s));
  o.gemm("router", local_tokens, s.experts, s.hidden);
  if (s.moe_dispatcher == MoeDispatcher::kAllGather && tp_ep > 1) {
    const std::int64_t gathered = local_tokens * tp_ep;
    o.comm(OpKind::kAllGather, "dispatch_probs_ag", gathered * s.experts * 4, CommGroup::kTensorExpert, tp_ep,
           DType::kFP32);
    o.comm(OpKind::kAllGather, "dispatch_ag", gathered * s.hidden * kAct, CommGroup::kTensorExpert, tp_ep);
    o.memory(OpKind::kRouter, "permute", 2 * rows * s.hidden * kAct);
    experts_forward(o, s, rows);
    o.memory(OpKind::kRouter, "unpermute", (rows + gathered) * s.hidden * kAct);
    o.comm(OpKind::kReduceScatter, "combine_rs", gathered * s.hidden * kAct, CommGroup::kTensorExpert, tp_ep);
  } else {
    o.memory(OpKind::kRouter, "permute", 2 * copies * s.hidden * kAct);
    // Megatron's alltoall dispatcher first gathers every tp-ep rank's tokens per expert (the all-to-all
    // splits and, under expert TP, the all-gather's), over the tp-ep group as it does.
    o.comm(OpKind::kAllGather, "dispatch_counts_ag", tp_ep * s.experts * 4, CommGroup::kTensorExpert, tp_ep,
           DType::kFP32);
    o.comm(OpKind::kAllToAll, "dispatch_a2a", copies * s.hidden * kAct, CommGroup::kExpert, s.ep);
    o.comm(OpKind::kAllGather, "dispatch_ag", rows * s.hidden * kAct, CommGroup::kExpertTensor, s.etp);
    experts_forward(o, s, rows);
    o.comm(OpKind::kReduceScatter, "combine_rs", rows * s.hidden * kAct, CommGroup::kExpertTensor, s.etp);
    o.comm(OpKind::kAllToAll, "combine_a2a", copies * s.hidden * kAct, CommGroup::kExpert, s.ep);
    o.memory(OpKind::kRouter, "unpermute", (copies + local_tokens) * s.hidden * kAct);
  }
  if (s.shared_ffn > 0) shared_expert_forward(o, s);
}

// The routed experts' backward, the recomputed pre-MLP norm (the shared expert's and the router's weight
// gradients read the block input), the shared expert's, then the router's (its data gradient accumulates).
void moe_mlp_backward(OpSink& o, const RankShape& s, bool norms_fresh) {
  const std::int64_t local_tokens = s.tokens / s.tp, copies = local_tokens * s.topk;
  const std::int64_t rows = expert_rows(s);
  const int tp_ep = s.etp * s.ep;
  if (s.moe_dispatcher == MoeDispatcher::kAllGather && tp_ep > 1) {
    const std::int64_t gathered = local_tokens * tp_ep;
    o.comm(OpKind::kAllGather, "combine_grad_ag", gathered * s.hidden * kAct, CommGroup::kTensorExpert,
           tp_ep);
    o.memory(OpKind::kRouter, "unpermute", (gathered + 2 * rows) * s.hidden * kAct);
    experts_backward(o, s, rows);
    o.memory(OpKind::kRouter, "permute", (rows + gathered) * s.hidden * kAct);
    o.comm(OpKind::kReduceScatter, "dispatch_grad_rs", gathered * s.hidden * kAct, CommGroup::kTensorExpert,
           tp_ep);
    o.comm(OpKind::kReduceScatter, "dispatch_probs_grad_rs", gathered * s.experts * 4,
           CommGroup::kTensorExpert, tp_ep, DType::kFP32);
  } else {
    o.memory(OpKind::kRouter, "unpermute", (local_tokens + 2 * copies) * s.hidden * kAct);
    o.comm(OpKind::kAllToAll, "combine_grad_a2a", copies * s.hidden * kAct, CommGroup::kExpert, s.ep);
    o.comm(OpKind::kAllGather, "combine_grad_ag", rows * s.hidden * kAct, CommGroup::kExpertTensor, s.etp);
    experts_backward(o, s, rows);
    o.comm(OpKind::kReduceScatter, "dispatch_grad_rs", rows * s.hidden * kAct, CommGroup::kExpertTensor,
           s.etp);
    o.comm(OpKind::kAllToAll, "dispatch_grad_a2a", copies * s.hidden * kAct, CommGroup::kExpert, s.ep);
    o.memory(OpKind::kRouter, "permute", (copies + local_tokens) * s.hidden * kAct);
  }
  if (!norms_fresh) o.with_phase(OpPhase::kRecompute).memory(OpKind::kNorm, "pre_mlp_norm", norm_bytes(s));
  if (s.shared_ffn > 0) shared_expert_backward(o, s);
  o.gemm("router_dgrad", local_tokens, s.hidden, s.experts, /*accumulate=*/true);
  o.gemm_backward("router", local_tokens, s.experts, s.hidden, /*need_dgrad=*/false);
}

// One decoder layer's forward (full: norm -> attention -> residual -> norm -> MLP -> residual).
void layer_forward(OpSink& o, const ModelSpec& model, const RankShape& s, bool moe,
                   const StepProgramOptions& options) {
  attention_block_forward(o, model, s, options, false);
  if (moe) {
    moe_mlp_forward(o, s);
  } else {
    dense_mlp_forward(o, s, options.fp8, s.ffn_per_rank(), "fc1", "fc2", true);
    tp_reduce(o, s, "fc2_ar", "fc2_rs");
  }
  o.memory(OpKind::kElementwise, "residual2", 3 * s.tokens_sp * s.hidden * kAct);
}

bool symbol_layer_is_moe(const ModelSpec& model, int layer) {
  return layer >= 0 ? model.is_moe_layer(layer) : model.mtp_layer_is_moe();
}

// A layer's backward under its chunk's recompute plan: a unit ending at this layer first re-runs the forward
// of all its layers (one kRecompute span, forward order), which leaves this layer's norm outputs fresh.
void layer_backward(std::vector<Op>& ops, const ModelSpec& model, const RankShape& s, bool moe, int layer,
                    int microbatch, int chunk, const StepProgramOptions& options, const RecomputePlan& plan) {
  if (const RecomputeUnit* unit = plan.unit_ending_at(layer)) {
    for (int l : unit->layers) {
      OpSink r(ops, OpPhase::kRecompute, l, microbatch, chunk);
      layer_forward(r, model, s, symbol_layer_is_moe(model, l), options);
    }
  }
  const bool fresh = plan.at(layer) == LayerRecompute::kUnitLast;
  OpSink o(ops, OpPhase::kBackward, layer, microbatch, chunk);
  if (moe) {
    moe_mlp_backward(o, s, fresh);
  } else {
    if (s.sp) o.comm(OpKind::kAllGather, "fc2_grad_ag", s.tokens * s.hidden * kAct, CommGroup::kTensor, s.tp);
    dense_mlp_backward(o, s, options.fp8, s.ffn_per_rank(), "fc1", "fc2", true, fresh);
    if (s.sp)
      o.comm(OpKind::kReduceScatter, "fc1_dgrad_rs", s.tokens * s.hidden * kAct, CommGroup::kTensor, s.tp);
    else
      o.comm(OpKind::kAllReduce, "fc1_dgrad_ar", s.tokens * s.hidden * kAct, CommGroup::kTensor, s.tp);
  }
  o.memory(OpKind::kNormBackward, "pre_mlp_norm", 3 * s.tokens_sp * s.hidden * kAct);
  if (s.recompute == RecomputeGranularity::kSelective) {
    OpSink r(ops, OpPhase::kRecompute, layer, microbatch, chunk);
    attention_block_forward(r, model, s, options, true);
  }
  attention_block_backward(o, model, s, options, fresh);
}

void embedding_forward(OpSink& o, const RankShape& s) {
  o.memory(OpKind::kEmbedding, "embedding", s.tokens * s.hidden * kAct + s.tokens * 8);
  if (s.sp)
    o.comm(OpKind::kReduceScatter, "embedding_rs", s.tokens * s.hidden * kAct, CommGroup::kTensor, s.tp);
  else
    o.comm(OpKind::kAllReduce, "embedding_ar", s.tokens * s.hidden * kAct, CommGroup::kTensor, s.tp);
}

void embedding_backward(OpSink& o, const RankShape& s) {
  if (s.sp)
    o.comm(OpKind::kAllGather, "embedding_grad_ag", s.tokens * s.hidden * kAct, CommGroup::kTensor, s.tp);
  o.memory(OpKind::kEmbeddingBackward, "embedding",
           s.tokens * s.hidden * kAct + s.tokens * 8 + s.tokens * s.hidden * 4);
}

// The LM head and the loss run over chunks of loss_chunk_rows() tokens, so that one chunk of logits exists
// at a time: per chunk the logits GEMM, the fused vocab-parallel cross entropy (reads the bf16 logits, writes
// their gradient in place) and the head's data and weight gradients (OpPhase::kBackward, issued during the
// forward pass, as the gradient is known there).
// With MTP the main head reads the final norm's output that the last decoder layer's stage computed
// (with_norm false), and the head's weight gradient was first written by an MTP layer (head_written).
void loss_forward(OpSink& o, const RankShape& s, const char* label, const StepProgramOptions& options,
                  bool with_norm = true, bool head_written = false) {
  if (with_norm) o.memory(OpKind::kNorm, "final_norm", norm_bytes(s));
  if (s.sp)
    o.comm(OpKind::kAllGather, "logits_input_ag", s.tokens * s.hidden * kAct, CommGroup::kTensor, s.tp);
  const std::int64_t vocab = s.vocab_per_rank(),
                     chunk = loss_chunk_rows(s.tokens, vocab, options.loss_chunk_logits_bytes);
  OpSink backward = o.with_phase(OpPhase::kBackward);
  for (std::int64_t first = 0; first < s.tokens; first += chunk) {
    const std::int64_t rows = std::min(chunk, s.tokens - first);
    o.gemm(label, rows, vocab, s.hidden);
    o.memory(OpKind::kCrossEntropy, "cross_entropy", 2 * rows * vocab * kAct, DType::kBF16);
    for (const char* l : {"ce_max_ar", "ce_target_ar", "ce_sum_exp_ar"})
      o.comm(OpKind::kAllReduce, l, rows * 4, CommGroup::kTensor, s.tp, DType::kFP32);
    backward.gemm_backward(label, rows, vocab, s.hidden, true, true,
                           /*first_chunk=*/first == 0 && !head_written);
  }
}

// The head's GEMMs ran in loss_forward; what is left: the tensor-parallel reduction of the final norm's
// output gradient and (with_norm) the final norm's backward.
void loss_backward(OpSink& o, const RankShape& s, bool with_norm = true) {
  if (s.sp)
    o.comm(OpKind::kReduceScatter, "logits_dgrad_rs", s.tokens * s.hidden * kAct, CommGroup::kTensor, s.tp);
  else
    o.comm(OpKind::kAllReduce, "logits_dgrad_ar", s.tokens * s.hidden * kAct, CommGroup::kTensor, s.tp);
  if (with_norm) o.memory(OpKind::kNormBackward, "final_norm", 3 * s.tokens_sp * s.hidden * kAct);
}

// One MTP layer (Megatron's MultiTokenPredictionLayer): the shared embedding of the tokens shifted left by
// the layer's depth, enorm and hnorm (of the previous depth's output: the main model's final norm output
// first), eh_proj (column-parallel [embedding | hidden] 2h -> h; its output all-gathered over TP along the
// hidden dimension, then this rank's sequence shard under SP), one transformer layer of the last decoder
// layer's kind, its final norm and the shared LM head and loss.
void mtp_forward(OpSink& o, const ModelSpec& model, const RankShape& s, bool head_written,
                 const StepProgramOptions& options) {
  const std::int64_t th = s.tokens * s.hidden * kAct;
  embedding_forward(o, s);
  o.memory(OpKind::kNorm, "mtp_enorm", norm_bytes(s));
  o.memory(OpKind::kNorm, "mtp_hnorm", norm_bytes(s));
  if (s.sp) o.comm(OpKind::kAllGather, "mtp_eh_proj_input_ag", 2 * th, CommGroup::kTensor, s.tp);
  o.gemm("mtp_eh_proj", s.tokens, s.hidden / s.tp, 2 * s.hidden);
  o.comm(OpKind::kAllGather, "mtp_eh_proj_output_ag", th, CommGroup::kTensor, s.tp);
  layer_forward(o, model, s, model.mtp_layer_is_moe(), options);
  loss_forward(o, s, "mtp_logits", options, true, head_written);
}

// Its backward: the head's gradient reduced (plus, below the last depth, the next depth's hnorm gradient),
// the final norm, the transformer layer, eh_proj (the scatter's backward all-gathers the output gradient
// under SP, and the saved input shard is gathered again for the weight gradient), hnorm (the first depth's
// adds the main head's gradient as its residual), enorm and the embedding.
void mtp_backward(std::vector<Op>& ops, const ModelSpec& model, const RankShape& s, int layer, int microbatch,
                  int chunk, const StepProgramOptions& options, const RecomputePlan& plan) {
  const std::int64_t th = s.tokens * s.hidden * kAct, norm_backward_bytes = 3 * s.tokens_sp * s.hidden * kAct;
  OpSink o(ops, OpPhase::kBackward, layer, microbatch, chunk);
  loss_backward(o, s, false);
  if (-3 - layer < model.mtp_num_layers - 1)
    o.memory(OpKind::kElementwise, "mtp_grad_add", norm_backward_bytes);
  o.memory(OpKind::kNormBackward, "final_norm", norm_backward_bytes);
  layer_backward(ops, model, s, model.mtp_layer_is_moe(), layer, microbatch, chunk, options, plan);
  if (s.sp) {
    o.comm(OpKind::kAllGather, "mtp_eh_proj_grad_ag", th, CommGroup::kTensor, s.tp);
    o.comm(OpKind::kAllGather, "mtp_eh_proj_input_ag", 2 * th, CommGroup::kTensor, s.tp);
  }
  o.gemm_backward("mtp_eh_proj", s.tokens, s.hidden / s.tp, 2 * s.hidden);
  if (s.sp)
    o.comm(OpKind::kReduceScatter, "mtp_eh_proj_dgrad_rs", 2 * th, CommGroup::kTensor, s.tp);
  else
    o.comm(OpKind::kAllReduce, "mtp_eh_proj_dgrad_ar", 2 * th, CommGroup::kTensor, s.tp);
  o.memory(OpKind::kNormBackward, "mtp_hnorm", norm_backward_bytes);
  o.memory(OpKind::kNormBackward, "mtp_enorm", norm_backward_bytes);
  embedding_backward(o, s);
}

}  // namespace

std::vector<int> stage_symbol_layers(const PipelineStage& stage) {
  std::vector<int> layers;
  int next_t = stage.first_decoder_layer;
  int next_m = stage.first_mtp_layer;
  for (LayerSymbol sym : stage.symbols) {
    if (sym == LayerSymbol::kDecoder)
      layers.push_back(next_t++);
    else if (sym == LayerSymbol::kMtp)
      layers.push_back(-3 - next_m++);  // -3, -4, ...: MTP layer 0, 1, ...
    else
      layers.push_back(sym == LayerSymbol::kEmbedding ? -1 : -2);
  }
  return layers;
}

std::int64_t loss_chunk_rows(std::int64_t tokens, std::int64_t vocab_per_rank,
                             std::int64_t max_logits_bytes) {
  const std::int64_t logits_bytes = tokens * vocab_per_rank * kAct;
  const std::int64_t budget = std::max<std::int64_t>(1, max_logits_bytes);
  const std::int64_t chunks = std::max<std::int64_t>(1, (logits_bytes + budget - 1) / budget);
  std::int64_t rows = (tokens + chunks - 1) / chunks;
  if (rows > 64) rows = (rows + 63) / 64 * 64;  // aligned chunk starts, GEMM-friendly m
  return std::max<std::int64_t>(1, std::min(rows, tokens));
}

std::vector<Op> stage_forward_ops(const ModelSpec& model, const RankShape& shape, const PipelineStage& stage,
                                  int microbatch, const StepProgramOptions& options,
                                  std::vector<std::size_t>* segment_starts) {
  std::vector<Op> ops;
  const std::vector<int> layers = stage_symbol_layers(stage);
  for (std::size_t i = 0; i < stage.symbols.size(); ++i) {
    const LayerSymbol sym = stage.symbols[i];
    if (segment_starts != nullptr &&
        (i == 0 || forward_segment_group_of(layers[i]) != forward_segment_group_of(layers[i - 1])))
      segment_starts->push_back(ops.size());
    OpSink o(ops, OpPhase::kForward, layers[i] >= 0 || layers[i] <= -3 ? layers[i] : -1, microbatch,
             stage.vpp_rank);
    const bool mtp = shape.mtp_num_layers > 0;
    switch (sym) {
      case LayerSymbol::kEmbedding:
        embedding_forward(o, shape);
        break;
      case LayerSymbol::kDecoder:
        layer_forward(o, model, shape, model.is_moe_layer(layers[i]), options);
        if (mtp && layers[i] == shape.num_layers - 1)  // Megatron's final norm with the last layer under MTP
          OpSink(ops, OpPhase::kForward, -1, microbatch, stage.vpp_rank)
              .memory(OpKind::kNorm, "final_norm", norm_bytes(shape));
        break;
      case LayerSymbol::kMtp:
        mtp_forward(o, model, shape, -3 - layers[i] != stage.first_mtp_layer, options);
        break;
      case LayerSymbol::kLoss:
        loss_forward(o, shape, "logits", options, !mtp, stage.num_mtp_layers > 0);
        break;
    }
  }
  return ops;
}

std::vector<Op> stage_backward_segment_ops(const ModelSpec& model, const RankShape& shape,
                                           const PipelineStage& stage, int microbatch, int entry_begin,
                                           int entry_end, const StepProgramOptions& options) {
  std::vector<Op> ops;
  const std::vector<int> layers = stage_symbol_layers(stage);
  const int n = static_cast<int>(stage.symbols.size());
  const RecomputePlan plan = plan_recompute(shape.recompute_settings(), stage);
  for (int e = std::max(0, entry_begin); e < std::min(n, entry_end); ++e) {
    const int j = n - 1 - e;  // entries run in reverse symbol order
    OpSink o(ops, OpPhase::kBackward, layers[j] >= 0 ? layers[j] : -1, microbatch, stage.vpp_rank);
    const bool mtp = shape.mtp_num_layers > 0;
    switch (stage.symbols[j]) {
      case LayerSymbol::kEmbedding:
        embedding_backward(o, shape);
        break;
      case LayerSymbol::kDecoder:
        if (mtp && layers[j] == shape.num_layers - 1)
          OpSink(ops, OpPhase::kBackward, -1, microbatch, stage.vpp_rank)
              .memory(OpKind::kNormBackward, "final_norm", 3 * shape.tokens_sp * shape.hidden * kAct);
        layer_backward(ops, model, shape, model.is_moe_layer(layers[j]), layers[j], microbatch,
                       stage.vpp_rank, options, plan);
        break;
      case LayerSymbol::kMtp:
        mtp_backward(ops, model, shape, layers[j], microbatch, stage.vpp_rank, options, plan);
        break;
      case LayerSymbol::kLoss:
        loss_backward(o, shape, !mtp);
        break;
    }
  }
  return ops;
}

std::vector<std::vector<Op>> stage_backward_ops_by_entry(const ModelSpec& model, const RankShape& shape,
                                                         const PipelineStage& stage, int microbatch,
                                                         const StepProgramOptions& options) {
  std::vector<std::vector<Op>> entries;
  for (int e = 0; e < static_cast<int>(stage.symbols.size()); ++e)
    entries.push_back(stage_backward_segment_ops(model, shape, stage, microbatch, e, e + 1, options));
  return entries;
}

std::vector<Op> stage_backward_ops(const ModelSpec& model, const RankShape& shape, const PipelineStage& stage,
                                   int microbatch, const StepProgramOptions& options) {
  return stage_backward_segment_ops(model, shape, stage, microbatch, 0,
                                    static_cast<int>(stage.symbols.size()), options);
}

namespace {

Op p2p_transfer_op(const RankShape& shape, const StepTransfer& transfer) {
  Op op;
  const bool activation = transfer.tensor == P2pTensor::kActivation;
  op.kind = transfer.direction == P2pDirection::kSend ? OpKind::kSend : OpKind::kRecv;
  op.phase = activation ? OpPhase::kForward : OpPhase::kBackward;
  op.role = activation ? OpRole::kP2pActivation : OpRole::kP2pGradient;
  op.label = activation ? "p2p_activation" : "p2p_gradient";
  op.bytes = shape.p2p_bytes;
  op.group = CommGroup::kPipeline;
  op.group_size = shape.pp;
  op.peer_rank = transfer.peer_rank;
  op.microbatch = transfer.microbatch;
  op.chunk = transfer.chunk;
  return op;
}

}  // namespace

namespace {

// FSDP optim_grads_params: the buckets' parameter codes (StageParameters::layer_reverse) of a chunk, by
// bucket.
std::vector<int> bucket_layer_codes(const RankStep& step, int chunk) {
  const std::vector<int> layers = stage_symbol_layers(step.stages.at(chunk));
  std::vector<int> codes;
  for (const GradBucket& b : step.buckets.at(chunk))
    codes.push_back(layers.at(layers.size() - 1 - static_cast<std::size_t>(b.ready_after_entry)));
  return codes;
}

// A forward pass with each segment preceded by the gathers of its buckets (forward order: the reverse of
// the buckets').
std::vector<Op> fsdp_forward_ops(const ModelSpec& model, const RankStep& step, const StepItem& item,
                                 const StepProgramOptions& options) {
  std::vector<std::size_t> starts;
  const std::vector<Op> body =
      stage_forward_ops(model, step.shape, step.stages.at(item.chunk), item.microbatch, options, &starts);
  const std::vector<GradBucket>& buckets = step.buckets.at(item.chunk);
  const std::vector<int> codes = bucket_layer_codes(step, item.chunk);
  std::vector<Op> ops;
  for (std::size_t s = 0; s < starts.size(); ++s) {
    const int group = item.forward_groups.at(s);
    for (std::size_t b = buckets.size(); b-- > 0;)
      if (forward_segment_group_of(codes[b]) == group)
        ops.push_back(fsdp_param_gather_op(buckets[b], OpPhase::kForward, item.microbatch));
    const std::size_t end = s + 1 < starts.size() ? starts[s + 1] : body.size();
    ops.insert(ops.end(), body.begin() + static_cast<std::ptrdiff_t>(starts[s]),
               body.begin() + static_cast<std::ptrdiff_t>(end));
  }
  if (starts.empty()) return body;
  return ops;
}

// A backward (segment) entry by entry: under optim_grads_params each entry preceded by the gathers of its
// buckets (an entry that starts with its recompute unit's re-run also gathers the unit's other layers, as
// before their forward segments: the executor's Trainer::run_backward calls
// DataParallelStrategy::before_forward for them); with sharded gradients each followed by the reduce-scatter
// of the buckets it completes.
std::vector<Op> fsdp_backward_ops(const ModelSpec& model, const ParallelConfig& config, const RankStep& step,
                                  const StepItem& item, const StepProgramOptions& options) {
  const std::vector<GradBucket>& buckets = step.buckets.at(item.chunk);
  const PipelineStage& stage = step.stages.at(item.chunk);
  const std::vector<int> layers = stage_symbol_layers(stage);
  const std::vector<int> codes = bucket_layer_codes(step, item.chunk);
  const RecomputePlan plan = plan_recompute(step.shape.recompute_settings(), stage);
  std::vector<Op> ops;
  const bool gathers = config.shards_parameters();
  const bool reduces = chunk_shards_gradients(config, stage);
  for (int e = item.entry_begin; e < item.entry_end; ++e) {
    for (const GradBucket& b : buckets)
      if (gathers && b.ready_after_entry == e)
        ops.push_back(fsdp_param_gather_op(b, OpPhase::kBackward, item.microbatch));
    const int code = layers.at(layers.size() - 1 - static_cast<std::size_t>(e));
    if (const RecomputeUnit* unit = gathers ? plan.unit_ending_at(code) : nullptr)
      for (int layer : unit->layers) {
        if (layer == code) continue;
        for (std::size_t b = buckets.size(); b-- > 0;)
          if (forward_segment_group_of(codes[b]) == forward_segment_group_of(layer))
            ops.push_back(fsdp_param_gather_op(buckets[b], OpPhase::kForward, item.microbatch));
      }
    for (Op& op : stage_backward_segment_ops(model, step.shape, step.stages.at(item.chunk), item.microbatch,
                                             e, e + 1, options))
      ops.push_back(std::move(op));
    for (const GradBucket& b : buckets)
      if (reduces && b.ready_after_entry == e)
        for (Op& op : fsdp_grad_reduce_ops(b, item.microbatch)) ops.push_back(std::move(op));
  }
  return ops;
}

// The rank's index in its dp x cp group.
int data_context_rank(const ParallelConfig& config, int rank) {
  const std::vector<int> group = RankGrid::from_config(config).group_of(rank, GroupKind::kDpCp);
  return static_cast<int>(std::find(group.begin(), group.end(), rank) - group.begin());
}

// Sharded gradients: each micro-batch's weight gradients land in a zeroed bucket slot, so a weight's first
// weight-gradient GEMM of the pass overwrites (the LM head's later token chunks accumulate).
std::vector<Op> fresh_weight_gradients(std::vector<Op> ops) {
  std::vector<std::pair<std::string, int>> written;
  for (Op& op : ops) {
    if (op.kind != OpKind::kGemm || !op.label.ends_with("_wgrad")) continue;
    const std::pair<std::string, int> weight{op.label, op.layer};
    op.accumulate = std::find(written.begin(), written.end(), weight) != written.end();
    if (!op.accumulate) written.push_back(weight);
  }
  return ops;
}

std::vector<Op> item_ops(const ModelSpec& model, const ParallelConfig& config, const RankStep& step,
                         const StepItem& item, const StepProgramOptions& options) {
  // The chunk's gradients sharded: written afresh in each micro-batch and reduced in its backward.
  const bool fresh = item.chunk >= 0 && chunk_shards_gradients(config, step.stages.at(item.chunk));
  switch (item.kind) {
    case StepItemKind::kForward: {
      std::vector<Op> ops =
          config.shards_parameters()
              ? fsdp_forward_ops(model, step, item, options)
              : stage_forward_ops(model, step.shape, step.stages.at(item.chunk), item.microbatch, options);
      return fresh ? fresh_weight_gradients(std::move(ops)) : ops;
    }
    case StepItemKind::kBackward:
      if (config.shards_parameters() || fresh) {
        std::vector<Op> ops = fsdp_backward_ops(model, config, step, item, options);
        return fresh ? fresh_weight_gradients(std::move(ops)) : ops;
      }
      return stage_backward_segment_ops(model, step.shape, step.stages.at(item.chunk), item.microbatch,
                                        item.entry_begin, item.entry_end, options);
    case StepItemKind::kP2p: {
      std::vector<Op> ops;
      for (const StepTransfer& t : item.transfers) ops.push_back(p2p_transfer_op(step.shape, t));
      return ops;
    }
    case StepItemKind::kGradBucket:  // sharded gradients: reduced in each backward instead
      if (fresh) return {};
      return {step.buckets.at(item.chunk).at(item.bucket).op};
    case StepItemKind::kParamGather:
      return {param_gather_op(step.buckets.at(item.chunk).at(item.bucket))};
    case StepItemKind::kOptimizer:
      return optimizer_step_ops(model, step.shape, config, step.stages, item.optimizer_step,
                                data_context_rank(config, step.rank), options);
  }
  return {};
}

}  // namespace

std::vector<Op> step_item_ops(const ModelSpec& model, const ParallelConfig& config, const RankStep& step,
                              const StepItem& item, const StepProgramOptions& options) {
  std::vector<Op> ops = item_ops(model, config, step, item, options);
  for (Op& op : ops)
    if (op.is_communication()) op.stream = step.streams[static_cast<int>(op.group)];
  return ops;
}

StepProgram build_step_program(const ModelSpec& model, const ParallelConfig& config, int rank,
                               const StepProgramOptions& options) {
  const RankStep step = walk_rank_step(model, config, rank, options);
  StepProgram program;
  program.rank = rank;
  program.coordinates = step.coordinates;
  for (const StepItem& item : step.items) {
    for (Op& op : step_item_ops(model, config, step, item, options)) {
      program.ops.push_back(std::move(op));
      program.schedule_item.push_back(item.schedule_item);
    }
  }
  return program;
}

}  // namespace megatune::layouts
