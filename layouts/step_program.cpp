// Step program expansion: schedule items -> the GEMMs, attention, memory-bound kernels and collectives
// of each layer (conventions in step_program.h).
#include "layouts/step_program.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "layouts/parameter_table.h"

namespace megatune::layouts {
namespace {

constexpr std::int64_t kAct = 2;  // bf16 activation bytes

// Appends ops with shared bookkeeping (phase, layer, microbatch, chunk).
class OpSink {
 public:
  OpSink(std::vector<Op>& ops, OpPhase phase, int layer, int microbatch, int chunk)
      : ops_(ops), phase_(phase), layer_(layer), microbatch_(microbatch), chunk_(chunk) {}

  Op& add(OpKind kind, const char* label) {
    Op op;
    op.kind = kind;
    op.phase = phase_;
    op.label = label;
    op.layer = layer_;
    op.microbatch = microbatch_;
    op.chunk = chunk_;
    ops_.push_back(std::move(op));
    return ops_.back();
  }
  void gemm(const char* label, std::int64_t m, std::int64_t n, std::int64_t k, bool accumulate = false) {
    Op& op = add(OpKind::kGemm, label);
    op.m = m;
    op.n = n;
    op.k = k;
    op.accumulate = accumulate;
  }
  // Backward of a forward GEMM (T, out) = (T, in) x (in, out): dgrad then wgrad (either may be left out).
  // The wgrad accumulates into the fp32 main gradient, except the first write of the iteration (micro-batch
  // 0; first_chunk false for the LM head's later token chunks), which overwrites it: the executor does not
  // zero GEMM weights' gradients, and the GEMM then never reads them.
  void gemm_backward(const std::string& label, std::int64_t tokens, std::int64_t out, std::int64_t in,
                     bool need_dgrad = true, bool need_wgrad = true, bool first_chunk = true) {
    if (need_dgrad) {
      Op& d = add(OpKind::kGemm, "");
      d.label = label + "_dgrad";
      d.m = tokens;
      d.n = in;
      d.k = out;
    }
    if (!need_wgrad) return;
    Op& w = add(OpKind::kGemm, "");
    w.label = label + "_wgrad";
    w.m = out;
    w.n = in;
    w.k = tokens;
    w.accumulate = microbatch_ > 0 || !first_chunk;
  }
  void memory(OpKind kind, const char* label, std::int64_t bytes, DType dtype = DType::kBF16) {
    Op& op = add(kind, label);
    op.bytes = bytes;
    op.dtype = dtype;
  }
  void comm(OpKind kind, const char* label, std::int64_t bytes, CommGroup group, int group_size,
            DType dtype = DType::kBF16) {
    if (group_size <= 1) return;
    Op& op = add(kind, label);
    op.bytes = bytes;
    op.group = group;
    op.group_size = group_size;
    op.dtype = dtype;
  }
  void attention(OpKind kind, const char* label, const AttentionShape& shape) {
    Op& op = add(kind, label);
    op.attention = shape;
  }
  OpPhase phase() const { return phase_; }
  // A sink appending to the same list with the same bookkeeping but another phase.
  OpSink with_phase(OpPhase phase) const { return OpSink(ops_, phase, layer_, microbatch_, chunk_); }

 private:
  std::vector<Op>& ops_;
  OpPhase phase_;
  int layer_, microbatch_, chunk_;
};

AttentionShape attention_shape(const StepShape& s) {
  AttentionShape a;
  a.batch = s.micro_batch;
  a.heads = s.heads / s.tp;
  a.kv_heads = std::max<std::int64_t>(1, s.groups / s.tp);
  a.seq_q = s.seq_local;
  a.seq_kv = s.seq;
  a.head_dim = s.mla ? s.head_dim : s.head_dim;
  a.causal = true;
  return a;
}

// Core attention of one layer. cp == 1 or all-gathered K,V: one kernel over (s/cp, s). Ring (p2p): step 0
// over the rank's own two chunks (s/cp x s/cp, causal), then cp - 1 steps each over half the keys of a peer
// (s/cp x s/(2cp), no mask), each preceded by the ring transfer it overlaps (K,V forward; K,V + dK,dV
// backward). The causal work adds up to 1/cp of the full sequence's.
void attention_with_context(OpSink& o, const StepShape& s, const StepProgramOptions& options, OpKind kind) {
  AttentionShape a = attention_shape(s);
  if (s.cp == 1 || options.cp_comm == ContextParallelComm::kAllGather) {
    o.attention(kind, "attn", a);
    return;
  }
  const bool backward = kind == OpKind::kAttentionBackward;
  const std::int64_t kv_bytes = 2 * s.tokens * a.kv_heads * s.head_dim * kAct * (backward ? 2 : 1);
  a.seq_kv = s.seq_local;
  o.attention(kind, "attn", a);
  AttentionShape half = a;
  half.seq_kv = s.seq_local / 2;
  half.causal = false;
  for (int step = 1; step < s.cp; ++step) {
    o.comm(OpKind::kSend, backward ? "cp_kv_dkv_send" : "cp_kv_send", kv_bytes, CommGroup::kContext, s.cp);
    o.comm(OpKind::kRecv, backward ? "cp_kv_dkv_recv" : "cp_kv_recv", kv_bytes, CommGroup::kContext, s.cp);
    o.attention(kind, "attn", half);
  }
}

std::int64_t norm_bytes(const StepShape& s) { return 2 * s.tokens_sp * s.hidden * kAct; }
// The pre-MLP norm also adds the attention block's residual: reads the projection output and the layer
// input, writes their sum (the MLP's residual) and the norm output.
std::int64_t norm_residual_bytes(const StepShape& s) { return 4 * s.tokens_sp * s.hidden * kAct; }

// Out-features of the fused QKV projection on one rank (MHA/GQA).
std::int64_t qkv_out(const StepShape& s) { return (s.heads + 2 * s.groups) * s.head_dim / s.tp; }

// TP collective that ends a row-parallel block in forward (AR without SP, RS with SP).
void tp_reduce(OpSink& o, const StepShape& s, const char* ar_label, const char* rs_label) {
  if (s.sp)
    o.comm(OpKind::kReduceScatter, rs_label, s.tokens * s.hidden * kAct, CommGroup::kTensor, s.tp);
  else
    o.comm(OpKind::kAllReduce, ar_label, s.tokens * s.hidden * kAct, CommGroup::kTensor, s.tp);
}

void attention_block_forward(OpSink& o, const ModelSpec& model, const StepShape& s,
                             const StepProgramOptions& options, bool recompute_core_only) {
  const AttentionShape a = attention_shape(s);
  if (!recompute_core_only) {
    o.memory(OpKind::kNorm, "input_norm", norm_bytes(s));
    if (s.sp)
      o.comm(OpKind::kAllGather, "qkv_input_ag", s.tokens * s.hidden * kAct, CommGroup::kTensor, s.tp);
    if (s.mla) {
      const std::int64_t qk = model.qk_head_dim + model.qk_pos_emb_head_dim;
      if (model.q_lora_rank > 0) {
        o.gemm("q_down", s.tokens, model.q_lora_rank, s.hidden);
        o.gemm("q_up", s.tokens, s.heads * qk / s.tp, model.q_lora_rank);
      } else {
        o.gemm("q_up", s.tokens, s.heads * qk / s.tp, s.hidden);
      }
      o.gemm("kv_down", s.tokens, model.kv_lora_rank + model.qk_pos_emb_head_dim, s.hidden);
      o.gemm("kv_up", s.tokens, s.heads * (model.qk_head_dim + model.v_head_dim) / s.tp, model.kv_lora_rank);
    } else {
      o.gemm("qkv", s.tokens, qkv_out(s), s.hidden);
    }
    if (s.rope) o.memory(OpKind::kRope, "rope", 2 * s.tokens * (a.heads + a.kv_heads) * s.head_dim * kAct);
    if (s.cp > 1) {
      const std::int64_t kv_bytes = 2 * s.tokens * a.kv_heads * s.head_dim * kAct;
      if (options.cp_comm == ContextParallelComm::kAllGather) {
        o.comm(OpKind::kAllGather, "cp_kv_ag", kv_bytes * s.cp, CommGroup::kContext, s.cp);
      }
    }
  }
  attention_with_context(o, s, options, OpKind::kAttentionForward);
  if (recompute_core_only) return;
  const std::int64_t proj_in = s.mla ? s.heads * model.v_head_dim / s.tp : s.heads * s.head_dim / s.tp;
  o.gemm("proj", s.tokens, s.hidden, proj_in);
  tp_reduce(o, s, "proj_ar", "proj_rs");
  // The residual add follows in the pre-MLP norm (norm_residual_bytes).
}

void attention_block_backward(OpSink& o, const ModelSpec& model, const StepShape& s,
                              const StepProgramOptions& options) {
  const AttentionShape a = attention_shape(s);
  const std::int64_t proj_in = s.mla ? s.heads * model.v_head_dim / s.tp : s.heads * s.head_dim / s.tp;
  if (s.sp) o.comm(OpKind::kAllGather, "proj_grad_ag", s.tokens * s.hidden * kAct, CommGroup::kTensor, s.tp);
  o.gemm_backward("proj", s.tokens, s.hidden, proj_in);
  const std::int64_t kv_bytes = 2 * s.tokens * a.kv_heads * s.head_dim * kAct;
  attention_with_context(o, s, options, OpKind::kAttentionBackward);
  if (s.cp > 1 && options.cp_comm == ContextParallelComm::kAllGather) {
    o.comm(OpKind::kReduceScatter, "cp_dkv_rs", kv_bytes * s.cp, CommGroup::kContext, s.cp);
  }
  if (s.rope)
    o.memory(OpKind::kRopeBackward, "rope", 2 * s.tokens * (a.heads + a.kv_heads) * s.head_dim * kAct);
  // The input norm's output is not saved: recomputed (from the layer input and its statistics) for the
  // weight gradients, unless a full-recompute re-run just produced it.
  if (s.recompute != RecomputeGranularity::kFull)
    o.with_phase(OpPhase::kRecompute).memory(OpKind::kNorm, "input_norm", norm_bytes(s));
  if (s.sp) o.comm(OpKind::kAllGather, "qkv_input_ag", s.tokens * s.hidden * kAct, CommGroup::kTensor, s.tp);
  if (s.mla) {
    const std::int64_t qk = model.qk_head_dim + model.qk_pos_emb_head_dim;
    o.gemm_backward("kv_up", s.tokens, s.heads * (model.qk_head_dim + model.v_head_dim) / s.tp,
                    model.kv_lora_rank);
    o.gemm_backward("kv_down", s.tokens, model.kv_lora_rank + model.qk_pos_emb_head_dim, s.hidden);
    if (model.q_lora_rank > 0) {
      o.gemm_backward("q_up", s.tokens, s.heads * qk / s.tp, model.q_lora_rank);
      o.gemm_backward("q_down", s.tokens, model.q_lora_rank, s.hidden);
    } else {
      o.gemm_backward("q_up", s.tokens, s.heads * qk / s.tp, s.hidden);
    }
  } else {
    o.gemm_backward("qkv", s.tokens, qkv_out(s), s.hidden);
  }
  if (s.sp)
    o.comm(OpKind::kReduceScatter, "qkv_dgrad_rs", s.tokens * s.hidden * kAct, CommGroup::kTensor, s.tp);
  else
    o.comm(OpKind::kAllReduce, "qkv_dgrad_ar", s.tokens * s.hidden * kAct, CommGroup::kTensor, s.tp);
  o.memory(OpKind::kNormBackward, "input_norm", 3 * s.tokens_sp * s.hidden * kAct);
}

std::int64_t glu(const StepShape& s) { return s.swiglu ? 2 : 1; }

// GELU runs in fc1's GEMM epilogue (cuBLASLt GELU_AUX_BIAS), so only SwiGLU issues an activation kernel.
void dense_mlp_forward(OpSink& o, const StepShape& s, std::int64_t ffn, const char* fc1, const char* fc2,
                       bool with_norm) {
  if (with_norm) {
    o.memory(OpKind::kNorm, "pre_mlp_norm", norm_residual_bytes(s));
    if (s.sp)
      o.comm(OpKind::kAllGather, "fc1_input_ag", s.tokens * s.hidden * kAct, CommGroup::kTensor, s.tp);
  }
  o.gemm(fc1, s.tokens, glu(s) * ffn / s.tp, s.hidden);
  if (s.swiglu) o.memory(OpKind::kActivation, "act", s.tokens * (glu(s) + 1) * ffn / s.tp * kAct);
  o.gemm(fc2, s.tokens, s.hidden, ffn / s.tp);
}

// The activation output is not saved: fc2's data gradient comes first, then one activation-backward pass
// turns it into fc1's output gradient and recomputes the activation output for fc2's weight gradient, which
// follows (bytes: read fc1 output and its gradient input, write both). recompute_norm: the pre-MLP norm
// output is not saved either, but recomputed before fc1's backward GEMMs (unless a full-recompute re-run just
// produced it).
void dense_mlp_backward(OpSink& o, const StepShape& s, std::int64_t ffn, const std::string& fc1,
                        const std::string& fc2, bool recompute_norm) {
  o.gemm_backward(fc2, s.tokens, s.hidden, ffn / s.tp, true, /*need_wgrad=*/false);
  o.memory(OpKind::kActivationBackward, "act", s.tokens * (2 * glu(s) + 2) * ffn / s.tp * kAct);
  o.gemm_backward(fc2, s.tokens, s.hidden, ffn / s.tp, /*need_dgrad=*/false);
  if (recompute_norm && s.recompute != RecomputeGranularity::kFull)
    o.with_phase(OpPhase::kRecompute).memory(OpKind::kNorm, "pre_mlp_norm", norm_bytes(s));
  // Sequence parallelism: the norm output is re-gathered for fc1's weight gradient (before its GEMMs).
  if (recompute_norm && s.sp)
    o.comm(OpKind::kAllGather, "fc1_input_ag", s.tokens * s.hidden * kAct, CommGroup::kTensor, s.tp);
  o.gemm_backward(fc1, s.tokens, glu(s) * ffn / s.tp, s.hidden);
}

// Rows one rank's experts process per microbatch under uniform routing.
std::int64_t expert_rows(const StepShape& s, const StepProgramOptions& options) {
  const std::int64_t local_tokens = s.tokens / s.tp;  // SP-sharded tokens entering the MoE layer
  if (options.moe_dispatcher == MoeDispatcher::kAllGather) {
    // Every rank sees all tokens of the tp-ep group; its E/ep experts get topk/E of them each.
    return local_tokens * s.etp * s.ep * s.topk / s.ep;
  }
  return local_tokens * s.topk * s.etp;
}

void moe_mlp_forward(OpSink& o, const StepShape& s, const StepProgramOptions& options) {
  const std::int64_t local_tokens = s.tokens / s.tp;
  const std::int64_t rows = expert_rows(s, options);
  o.memory(OpKind::kNorm, "pre_mlp_norm", norm_residual_bytes(s));
  o.gemm("router", local_tokens, s.experts, s.hidden);
  o.memory(OpKind::kRouter, "permute", 2 * local_tokens * s.topk * s.hidden * kAct);
  const int tp_ep = s.etp * s.ep;
  if (options.moe_dispatcher == MoeDispatcher::kAllGather) {
    o.comm(OpKind::kAllGather, "dispatch_ag", local_tokens * tp_ep * s.hidden * kAct,
           CommGroup::kTensorExpert, tp_ep);
  } else {
    o.comm(OpKind::kAllToAll, "dispatch_a2a", local_tokens * s.topk * s.hidden * kAct, CommGroup::kExpert,
           s.ep);
    o.comm(OpKind::kAllGather, "dispatch_ag", rows * s.hidden * kAct, CommGroup::kExpertTensor, s.etp);
  }
  o.gemm("expert_fc1", rows, glu(s) * s.moe_ffn / s.etp, s.hidden);
  o.memory(OpKind::kActivation, "expert_act", rows * (glu(s) + 1) * s.moe_ffn / s.etp * kAct);
  o.gemm("expert_fc2", rows, s.hidden, s.moe_ffn / s.etp);
  if (options.moe_dispatcher == MoeDispatcher::kAllGather) {
    o.comm(OpKind::kReduceScatter, "combine_rs", local_tokens * tp_ep * s.hidden * kAct,
           CommGroup::kTensorExpert, tp_ep);
  } else {
    o.comm(OpKind::kReduceScatter, "combine_rs", rows * s.hidden * kAct, CommGroup::kExpertTensor, s.etp);
    o.comm(OpKind::kAllToAll, "combine_a2a", local_tokens * s.topk * s.hidden * kAct, CommGroup::kExpert,
           s.ep);
  }
  o.memory(OpKind::kRouter, "unpermute", 2 * local_tokens * s.topk * s.hidden * kAct);
  if (s.shared_ffn > 0) {
    if (s.sp)
      o.comm(OpKind::kAllGather, "shared_input_ag", s.tokens * s.hidden * kAct, CommGroup::kTensor, s.tp);
    dense_mlp_forward(o, s, s.shared_ffn, "shared_fc1", "shared_fc2", false);
    tp_reduce(o, s, "shared_fc2_ar", "shared_fc2_rs");
  }
}

void moe_mlp_backward(OpSink& o, const StepShape& s, const StepProgramOptions& options) {
  const std::int64_t local_tokens = s.tokens / s.tp;
  const std::int64_t rows = expert_rows(s, options);
  const int tp_ep = s.etp * s.ep;
  if (s.shared_ffn > 0) {
    if (s.sp)
      o.comm(OpKind::kAllGather, "shared_grad_ag", s.tokens * s.hidden * kAct, CommGroup::kTensor, s.tp);
    dense_mlp_backward(o, s, s.shared_ffn, "shared_fc1", "shared_fc2", false);
    if (s.sp)
      o.comm(OpKind::kReduceScatter, "shared_dgrad_rs", s.tokens * s.hidden * kAct, CommGroup::kTensor, s.tp);
    else
      o.comm(OpKind::kAllReduce, "shared_dgrad_ar", s.tokens * s.hidden * kAct, CommGroup::kTensor, s.tp);
  }
  o.memory(OpKind::kRouter, "unpermute", 2 * local_tokens * s.topk * s.hidden * kAct);
  if (options.moe_dispatcher == MoeDispatcher::kAllGather) {
    o.comm(OpKind::kAllGather, "combine_grad_ag", local_tokens * tp_ep * s.hidden * kAct,
           CommGroup::kTensorExpert, tp_ep);
  } else {
    o.comm(OpKind::kAllToAll, "combine_grad_a2a", local_tokens * s.topk * s.hidden * kAct, CommGroup::kExpert,
           s.ep);
    o.comm(OpKind::kAllGather, "combine_grad_ag", rows * s.hidden * kAct, CommGroup::kExpertTensor, s.etp);
  }
  o.gemm_backward("expert_fc2", rows, s.hidden, s.moe_ffn / s.etp);
  o.memory(OpKind::kActivationBackward, "expert_act", rows * (2 * glu(s) + 1) * s.moe_ffn / s.etp * kAct);
  o.gemm_backward("expert_fc1", rows, glu(s) * s.moe_ffn / s.etp, s.hidden);
  if (options.moe_dispatcher == MoeDispatcher::kAllGather) {
    o.comm(OpKind::kReduceScatter, "dispatch_grad_rs", local_tokens * tp_ep * s.hidden * kAct,
           CommGroup::kTensorExpert, tp_ep);
  } else {
    o.comm(OpKind::kReduceScatter, "dispatch_grad_rs", rows * s.hidden * kAct, CommGroup::kExpertTensor,
           s.etp);
    o.comm(OpKind::kAllToAll, "dispatch_grad_a2a", local_tokens * s.topk * s.hidden * kAct,
           CommGroup::kExpert, s.ep);
  }
  o.memory(OpKind::kRouter, "permute", 2 * local_tokens * s.topk * s.hidden * kAct);
  o.gemm_backward("router", local_tokens, s.experts, s.hidden);
}

// One decoder layer's forward (full: norm -> attention -> residual -> norm -> MLP -> residual).
void layer_forward(OpSink& o, const ModelSpec& model, const StepShape& s, bool moe,
                   const StepProgramOptions& options) {
  attention_block_forward(o, model, s, options, false);
  if (moe) {
    moe_mlp_forward(o, s, options);
  } else {
    dense_mlp_forward(o, s, s.ffn, "fc1", "fc2", true);
    tp_reduce(o, s, "fc2_ar", "fc2_rs");
  }
  o.memory(OpKind::kElementwise, "residual2", 3 * s.tokens_sp * s.hidden * kAct);
}

void layer_backward(std::vector<Op>& ops, const ModelSpec& model, const StepShape& s, bool moe, int layer,
                    int microbatch, int chunk, const StepProgramOptions& options) {
  if (s.recompute == RecomputeGranularity::kFull) {
    OpSink r(ops, OpPhase::kRecompute, layer, microbatch, chunk);
    layer_forward(r, model, s, moe, options);
  }
  OpSink o(ops, OpPhase::kBackward, layer, microbatch, chunk);
  if (moe) {
    moe_mlp_backward(o, s, options);
  } else {
    if (s.sp) o.comm(OpKind::kAllGather, "fc2_grad_ag", s.tokens * s.hidden * kAct, CommGroup::kTensor, s.tp);
    dense_mlp_backward(o, s, s.ffn, "fc1", "fc2", true);
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
  attention_block_backward(o, model, s, options);
}

void embedding_forward(OpSink& o, const StepShape& s) {
  o.memory(OpKind::kEmbedding, "embedding", s.tokens * s.hidden * kAct + s.tokens * 8);
  if (s.sp)
    o.comm(OpKind::kReduceScatter, "embedding_rs", s.tokens * s.hidden * kAct, CommGroup::kTensor, s.tp);
  else
    o.comm(OpKind::kAllReduce, "embedding_ar", s.tokens * s.hidden * kAct, CommGroup::kTensor, s.tp);
}

void embedding_backward(OpSink& o, const StepShape& s) {
  if (s.sp)
    o.comm(OpKind::kAllGather, "embedding_grad_ag", s.tokens * s.hidden * kAct, CommGroup::kTensor, s.tp);
  o.memory(OpKind::kEmbeddingBackward, "embedding",
           s.tokens * s.hidden * kAct + s.tokens * 8 + s.tokens * s.hidden * 4);
}

// The LM head and the loss run over chunks of loss_chunk_rows() tokens, so that one chunk of logits exists
// at a time: per chunk the logits GEMM, the fused vocab-parallel cross entropy (reads the bf16 logits, writes
// their gradient in place) and the head's data and weight gradients (OpPhase::kBackward, issued during the
// forward pass, as the gradient is known there).
void loss_forward(OpSink& o, const StepShape& s, const char* label, const StepProgramOptions& options) {
  o.memory(OpKind::kNorm, "final_norm", norm_bytes(s));
  if (s.sp)
    o.comm(OpKind::kAllGather, "logits_input_ag", s.tokens * s.hidden * kAct, CommGroup::kTensor, s.tp);
  const std::int64_t vocab = s.vocab_padded / s.tp,
                     chunk = loss_chunk_rows(s.tokens, vocab, options.loss_chunk_logits_bytes);
  OpSink backward = o.with_phase(OpPhase::kBackward);
  for (std::int64_t first = 0; first < s.tokens; first += chunk) {
    const std::int64_t rows = std::min(chunk, s.tokens - first);
    o.gemm(label, rows, vocab, s.hidden);
    o.memory(OpKind::kCrossEntropy, "cross_entropy", 2 * rows * vocab * kAct, DType::kBF16);
    for (const char* l : {"ce_max_ar", "ce_target_ar", "ce_sum_exp_ar"})
      o.comm(OpKind::kAllReduce, l, rows * 4, CommGroup::kTensor, s.tp, DType::kFP32);
    backward.gemm_backward(label, rows, vocab, s.hidden, true, true, /*first_chunk=*/first == 0);
  }
}

// The head's GEMMs ran in loss_forward; what is left: the tensor-parallel reduction of the final norm's
// output gradient and the final norm's backward.
void loss_backward(OpSink& o, const StepShape& s, const std::string& label) {
  (void)label;
  if (s.sp)
    o.comm(OpKind::kReduceScatter, "logits_dgrad_rs", s.tokens * s.hidden * kAct, CommGroup::kTensor, s.tp);
  else
    o.comm(OpKind::kAllReduce, "logits_dgrad_ar", s.tokens * s.hidden * kAct, CommGroup::kTensor, s.tp);
  o.memory(OpKind::kNormBackward, "final_norm", 3 * s.tokens_sp * s.hidden * kAct);
}

bool mtp_is_moe(const ModelSpec& model) { return model.is_moe() && model.is_moe_layer(model.num_layers - 1); }

// Global layer index of symbol i of the stage (decoder layers only; -1 otherwise).
std::vector<int> symbol_layers(const PipelineStage& stage) {
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

std::int64_t layer_dense_params(const ModelSpec& model, const StepShape& s, bool moe) {
  std::int64_t attn = s.mla ? 0 : s.hidden * qkv_out(s) + s.heads * s.head_dim / s.tp * s.hidden;
  if (s.mla) {
    const std::int64_t qk = model.qk_head_dim + model.qk_pos_emb_head_dim;
    attn = (model.q_lora_rank > 0 ? s.hidden * model.q_lora_rank + model.q_lora_rank * s.heads * qk / s.tp
                                  : s.hidden * s.heads * qk / s.tp) +
           s.hidden * (model.kv_lora_rank + model.qk_pos_emb_head_dim) +
           model.kv_lora_rank * s.heads * (model.qk_head_dim + model.v_head_dim) / s.tp +
           s.heads * model.v_head_dim / s.tp * s.hidden;
  }
  const std::int64_t norms = 2 * s.hidden * (s.rms ? 1 : 2);
  std::int64_t mlp = 0;
  if (moe) {
    mlp = s.hidden * s.experts + (glu(s) + 1) * s.hidden * s.shared_ffn / s.tp;
  } else {
    mlp = (glu(s) + 1) * s.hidden * s.ffn / s.tp;
  }
  // Linear biases (add_bias_linear): column-parallel ones split by tp, row-parallel ones (proj, fc2) whole.
  if (model.add_bias_linear && !s.mla) {
    attn += qkv_out(s) + s.hidden;
    if (!moe) mlp += glu(s) * s.ffn / s.tp + s.hidden;
  }
  return attn + norms + mlp;
}

std::int64_t layer_expert_params(const StepShape& s, bool moe) {
  if (!moe) return 0;
  return s.experts / s.ep * (glu(s) + 1) * s.hidden * s.moe_ffn / s.etp;
}

}  // namespace

std::int64_t loss_chunk_rows(std::int64_t tokens, std::int64_t vocab_per_rank,
                             std::int64_t max_logits_bytes) {
  const std::int64_t logits_bytes = tokens * vocab_per_rank * kAct;
  const std::int64_t budget = std::max<std::int64_t>(1, max_logits_bytes);
  const std::int64_t chunks = std::max<std::int64_t>(1, (logits_bytes + budget - 1) / budget);
  std::int64_t rows = (tokens + chunks - 1) / chunks;
  if (rows > 64) rows = (rows + 63) / 64 * 64;  // aligned chunk starts, GEMM-friendly m
  return std::max<std::int64_t>(1, std::min(rows, tokens));
}

StepShape resolve_step_shape(const ModelSpec& model, const ParallelConfig& config) {
  StepShape s;
  s.tp = config.tp();
  s.cp = config.cp();
  s.ep = config.ep();
  s.etp = config.etp();
  s.pp = config.pp();
  s.dp = config.dp();
  s.edp = config.edp();
  s.sp = config.sequence_parallel_enabled();
  s.seq = model.seq_length;
  s.seq_local = model.seq_length / s.cp;
  s.micro_batch = config.micro_batch_size;
  s.tokens = s.seq_local * s.micro_batch;
  s.tokens_sp = s.sp ? s.tokens / s.tp : s.tokens;
  s.hidden = model.hidden_size;
  s.heads = model.num_attention_heads;
  s.groups = model.multi_latent_attention ? model.num_attention_heads : model.query_groups();
  s.head_dim =
      model.multi_latent_attention ? model.qk_head_dim + model.qk_pos_emb_head_dim : model.head_dim();
  s.ffn = model.ffn_size();
  s.moe_ffn = model.is_moe() ? model.moe_ffn_size() : 0;
  s.shared_ffn = model.moe_shared_expert_intermediate_size;
  s.vocab_padded = model.padded_vocab_size(s.tp);
  s.experts = model.num_experts;
  s.topk = model.is_moe() ? model.moe_router_topk : 0;
  s.swiglu = model.activation == Activation::kSwiglu;
  s.rms = model.normalization == Normalization::kRMSNorm;
  s.rope = model.position_embedding == PositionEmbedding::kRope;
  s.tied = !model.untie_embeddings_and_output_weights;
  s.mla = model.multi_latent_attention;
  s.recompute = config.recompute_granularity;
  s.p2p_bytes = s.tokens_sp * s.hidden * kAct;
  return s;
}

std::vector<Op> stage_forward_ops(const ModelSpec& model, const StepShape& shape, const PipelineStage& stage,
                                  int microbatch, const StepProgramOptions& options) {
  std::vector<Op> ops;
  const std::vector<int> layers = symbol_layers(stage);
  for (std::size_t i = 0; i < stage.symbols.size(); ++i) {
    const LayerSymbol sym = stage.symbols[i];
    OpSink o(ops, OpPhase::kForward, layers[i] >= 0 ? layers[i] : -1, microbatch, stage.vpp_rank);
    switch (sym) {
      case LayerSymbol::kEmbedding:
        embedding_forward(o, shape);
        break;
      case LayerSymbol::kDecoder:
        layer_forward(o, model, shape, model.is_moe_layer(layers[i]), options);
        break;
      case LayerSymbol::kMtp:
        o.memory(OpKind::kNorm, "mtp_norms", 2 * norm_bytes(shape));
        o.gemm("mtp_eh_proj", shape.tokens, shape.hidden / shape.tp, 2 * shape.hidden);
        layer_forward(o, model, shape, mtp_is_moe(model), options);
        loss_forward(o, shape, "mtp_logits", options);
        break;
      case LayerSymbol::kLoss:
        loss_forward(o, shape, "logits", options);
        break;
    }
  }
  return ops;
}

std::vector<std::vector<Op>> stage_backward_ops_by_entry(const ModelSpec& model, const StepShape& shape,
                                                         const PipelineStage& stage, int microbatch,
                                                         const StepProgramOptions& options) {
  std::vector<std::vector<Op>> entries;
  const std::vector<int> layers = symbol_layers(stage);
  for (std::size_t j = stage.symbols.size(); j-- > 0;) {
    entries.emplace_back();
    std::vector<Op>& ops = entries.back();
    const LayerSymbol sym = stage.symbols[j];
    OpSink o(ops, OpPhase::kBackward, layers[j] >= 0 ? layers[j] : -1, microbatch, stage.vpp_rank);
    switch (sym) {
      case LayerSymbol::kEmbedding:
        embedding_backward(o, shape);
        break;
      case LayerSymbol::kDecoder:
        layer_backward(ops, model, shape, model.is_moe_layer(layers[j]), layers[j], microbatch,
                       stage.vpp_rank, options);
        break;
      case LayerSymbol::kMtp:
        loss_backward(o, shape, "mtp_logits");
        layer_backward(ops, model, shape, mtp_is_moe(model), -1, microbatch, stage.vpp_rank, options);
        o.gemm_backward("mtp_eh_proj", shape.tokens, shape.hidden / shape.tp, 2 * shape.hidden);
        o.memory(OpKind::kNormBackward, "mtp_norms", 3 * norm_bytes(shape));
        break;
      case LayerSymbol::kLoss:
        loss_backward(o, shape, "logits");
        break;
    }
  }
  return entries;
}

std::vector<Op> stage_backward_ops(const ModelSpec& model, const StepShape& shape, const PipelineStage& stage,
                                   int microbatch, const StepProgramOptions& options) {
  std::vector<Op> ops;
  for (auto& entry : stage_backward_ops_by_entry(model, shape, stage, microbatch, options)) {
    for (auto& op : entry) ops.push_back(std::move(op));
  }
  return ops;
}

namespace {
// The gradient-buffer elements of one stage entry: from the parameter table for dense GPT / Llama entries
// (each parameter padded to the buffer's alignment), the unpadded count otherwise (MoE, MLA, MTP, which the
// executor does not run yet).
std::int64_t buffer_elements(const ModelSpec& model, const StepShape& s, const PipelineStage& stage,
                             LayerSymbol symbol, int layer, std::int64_t dense) {
  if (s.mla || symbol == LayerSymbol::kMtp || (symbol == LayerSymbol::kDecoder && model.is_moe_layer(layer)))
    return dense;
  DenseParameterShape shape;
  shape.num_layers = model.num_layers;
  shape.hidden = s.hidden;
  shape.heads = s.heads;
  shape.groups = s.groups;
  shape.head_dim = s.head_dim;
  shape.ffn = s.ffn;
  shape.vocab_padded = s.vocab_padded;
  shape.max_positions = model.max_positions();
  shape.layernorm = !s.rms;
  shape.swiglu = s.swiglu;
  shape.learned_positions = !s.rope;
  shape.tied = s.tied;
  shape.bias = model.add_bias_linear;
  shape.tp = s.tp;
  shape.sequence_parallel = s.sp;
  StageContents contents;
  contents.num_layers = 0;
  if (symbol == LayerSymbol::kDecoder) {
    contents.first_layer = layer;
    contents.num_layers = 1;
  }
  contents.has_embedding = symbol == LayerSymbol::kEmbedding;
  contents.has_loss = symbol == LayerSymbol::kLoss;
  std::int64_t n = 0;
  for (const ParameterSpec& p : stage_parameter_table(shape, contents)) {
    // A tied head is the stage's own embedding table (counted with E) when the stage holds the embedding.
    const bool head_copy = p.layer == -2 && p.name == "embedding.word_embeddings.weight";
    if (!(head_copy && stage.has_embedding)) n += aligned_elements(p.numel());
  }
  return n;
}
}  // namespace

StageParameters stage_parameters(const ModelSpec& model, const StepShape& s, const PipelineStage& stage) {
  StageParameters p;
  const std::vector<int> layers = symbol_layers(stage);
  for (std::size_t j = stage.symbols.size(); j-- > 0;) {
    std::int64_t dense = 0, expert = 0;
    switch (stage.symbols[j]) {
      case LayerSymbol::kEmbedding:
        dense = s.vocab_padded / s.tp * s.hidden;
        if (!s.rope) dense += static_cast<std::int64_t>(model.max_positions()) * s.hidden;
        break;
      case LayerSymbol::kDecoder: {
        const bool moe = model.is_moe_layer(layers[j]);
        dense = layer_dense_params(model, s, moe);
        expert = layer_expert_params(s, moe);
        break;
      }
      case LayerSymbol::kMtp:
        dense =
            layer_dense_params(model, s, mtp_is_moe(model)) + 2 * s.hidden * s.hidden / s.tp + 3 * s.hidden;
        expert = layer_expert_params(s, mtp_is_moe(model));
        break;
      case LayerSymbol::kLoss:
        dense = s.hidden * (s.rms ? 1 : 2);
        // Untied: the output layer. Tied with pp > 1: the last stage keeps its own copy of the embedding.
        if (!s.tied || !stage.has_embedding) dense += s.vocab_padded / s.tp * s.hidden;
        break;
    }
    p.dense += dense;
    p.expert += expert;
    p.dense_buffer_per_layer_reverse.push_back(
        buffer_elements(model, s, stage, stage.symbols[j], layers[j], dense));
    p.dense_per_layer_reverse.push_back(dense);
    p.expert_per_layer_reverse.push_back(expert);
    p.layer_reverse.push_back(layers[j]);
  }
  return p;
}

std::vector<GradBucket> grad_sync_buckets(const StepShape& shape, const ParallelConfig& config,
                                          const StageParameters& parameters, int chunk,
                                          const StepProgramOptions& options) {
  std::vector<GradBucket> buckets;
  const std::int64_t grad_bytes = options.grad_reduce_in_bf16 ? 2 : 4;
  const int dense_group = shape.dp * shape.cp;
  const bool overlap = config.overlap_grad_reduce;
  std::int64_t bucket_limit = options.bucket_size_elements > 0
                                  ? options.bucket_size_elements
                                  : std::max<std::int64_t>(40'000'000, 1'000'000LL * dense_group);
  if (!overlap) bucket_limit = INT64_MAX;
  auto emit = [&](std::int64_t elements, bool expert, int ready_after) {
    const int group_size = expert ? shape.edp : dense_group;
    if (elements <= 0 || group_size <= 1) return;
    GradBucket b;
    b.op.kind = config.use_distributed_optimizer ? OpKind::kReduceScatter : OpKind::kAllReduce;
    b.op.phase = OpPhase::kGradSync;
    b.op.label = expert ? "expert_grad_bucket" : "grad_bucket";
    b.op.dtype = grad_bytes == 2 ? DType::kBF16 : DType::kFP32;
    b.op.bytes = elements * grad_bytes;
    b.op.group = expert ? CommGroup::kExpertData : CommGroup::kDataContext;
    b.op.group_size = group_size;
    b.op.chunk = chunk;
    b.ready_after_entry = ready_after;
    buckets.push_back(std::move(b));
  };
  std::int64_t dense_fill = 0, expert_fill = 0;
  const int n = static_cast<int>(parameters.layer_reverse.size());
  for (int i = 0; i < n; ++i) {
    dense_fill += parameters.dense_buffer_per_layer_reverse.empty() ? parameters.dense_per_layer_reverse[i]
                                                                    : parameters.dense_buffer_per_layer_reverse[i];
    expert_fill += parameters.expert_per_layer_reverse[i];
    if (dense_fill >= bucket_limit) {
      emit(dense_fill, false, i);
      dense_fill = 0;
    }
    if (expert_fill >= bucket_limit) {
      emit(expert_fill, true, i);
      expert_fill = 0;
    }
  }
  emit(dense_fill, false, n - 1);
  emit(expert_fill, true, n - 1);
  return buckets;
}

std::vector<Op> optimizer_step_ops(const ModelSpec& model, const StepShape& shape,
                                   const ParallelConfig& config,
                                   const std::vector<const PipelineStage*>& stages,
                                   const StepProgramOptions& options) {
  std::vector<Op> ops;
  OpSink o(ops, OpPhase::kOptimizer, -1, -1, -1);
  std::int64_t dense = 0, expert = 0;
  bool has_embedding = false, has_loss = false;
  for (const PipelineStage* stage : stages) {
    StageParameters p = stage_parameters(model, shape, *stage);
    dense += p.dense;
    expert += p.expert;
    has_embedding |= stage->has_embedding;
    has_loss |= stage->has_loss;
  }
  const std::int64_t grad_bytes = options.grad_reduce_in_bf16 ? 2 : 4;
  if (shape.tied && shape.pp > 1 && (has_embedding || has_loss)) {
    o.comm(OpKind::kAllReduce, "embedding_grad_ar", shape.vocab_padded / shape.tp * shape.hidden * grad_bytes,
           CommGroup::kEmbedding, 2, DType::kFP32);
  }
  if (shape.sp) {
    std::int64_t norm_params = 0;
    for (const PipelineStage* stage : stages)
      norm_params += static_cast<std::int64_t>(stage->num_decoder_layers + stage->num_mtp_layers) * 2 *
                         shape.hidden * (shape.rms ? 1 : 2) +
                     (stage->has_loss ? shape.hidden * (shape.rms ? 1 : 2) : 0);
    o.comm(OpKind::kAllReduce, "sp_norm_grad_ar", norm_params * grad_bytes, CommGroup::kTensor, shape.tp,
           DType::kFP32);
  }
  const bool dist = config.use_distributed_optimizer;
  const std::int64_t dense_shard = dist ? (dense + shape.dp * shape.cp - 1) / (shape.dp * shape.cp) : dense;
  const std::int64_t expert_shard = dist ? (expert + shape.edp - 1) / shape.edp : expert;
  const std::int64_t local = dense_shard + expert_shard;
  o.memory(OpKind::kGradNorm, "grad_norm", local * 4, DType::kFP32);
  o.comm(OpKind::kAllReduce, "grad_norm_ar", 4, CommGroup::kWorld, config.world_size, DType::kFP32);
  o.memory(OpKind::kOptimizer, "adamw", local * 30, DType::kFP32);
  if (dist) {
    // Param all-gather, bucketed like the grads.
    for (const PipelineStage* stage : stages) {
      StageParameters p = stage_parameters(model, shape, *stage);
      for (const GradBucket& b : grad_sync_buckets(shape, config, p, stage->vpp_rank, options)) {
        Op& ag =
            o.add(OpKind::kAllGather, b.op.group == CommGroup::kExpertData ? "expert_param_ag" : "param_ag");
        ag.bytes = b.op.bytes / grad_bytes * 2;
        ag.group = b.op.group;
        ag.group_size = b.op.group_size;
        ag.chunk = stage->vpp_rank;
      }
    }
  }
  return ops;
}

StepProgram build_step_program(const ModelSpec& model, const ParallelConfig& config, int rank,
                               const StepProgramOptions& options) {
  StepProgram program;
  program.rank = rank;
  const RankGrid grid = RankGrid::from_config(config);
  if (rank < 0 || rank >= grid.world_size()) {
    throw std::out_of_range("build_step_program: rank " + std::to_string(rank) + " outside the world of " +
                            std::to_string(grid.world_size()));
  }
  program.coordinates = grid.dense_coordinates(rank);
  const PipelineLayout layout = config.resolved_pipeline_layout(model);
  const RankSchedule schedule = build_schedule(model, config, program.coordinates.pp);
  const StepShape shape = resolve_step_shape(model, config);
  const std::vector<const PipelineStage*> stages = layout.stages_of_rank(program.coordinates.pp);

  // The last backward item of each chunk: where its grad buckets are issued.
  std::vector<int> last_backward(stages.size(), -1);
  for (int i = 0; i < static_cast<int>(schedule.items.size()); ++i) {
    const ScheduleItem& item = schedule.items[i];
    if (item.kind == ScheduleItemKind::kBackward) last_backward[item.chunk] = i;
  }
  std::vector<Op> deferred_sync;
  auto peer_rank = [&](int peer_pp) {
    DenseCoordinates c = program.coordinates;
    c.pp = peer_pp;
    return grid.rank_of(c);
  };
  auto push = [&](Op op, int item) {
    program.ops.push_back(std::move(op));
    program.schedule_item.push_back(item);
  };
  for (int i = 0; i < static_cast<int>(schedule.items.size()); ++i) {
    const ScheduleItem& item = schedule.items[i];
    if (item.kind == ScheduleItemKind::kP2p) {
      // Sends first, then receives (Megatron posts the batch together).
      for (int pass = 0; pass < 2; ++pass) {
        for (const P2pTransfer& t : item.transfers) {
          if ((t.direction == P2pDirection::kSend) != (pass == 0)) continue;
          Op op;
          op.kind = t.direction == P2pDirection::kSend ? OpKind::kSend : OpKind::kRecv;
          op.phase = t.tensor == P2pTensor::kActivation ? OpPhase::kForward : OpPhase::kBackward;
          op.label = t.tensor == P2pTensor::kActivation ? "p2p_activation" : "p2p_gradient";
          op.bytes = shape.p2p_bytes;
          op.group = CommGroup::kPipeline;
          op.group_size = shape.pp;
          op.peer_rank = peer_rank(t.peer_pp_rank);
          op.microbatch = t.microbatch;
          op.chunk = t.chunk;
          push(std::move(op), i);
        }
      }
      continue;
    }
    const PipelineStage& stage = *stages.at(item.chunk);
    if (item.kind == ScheduleItemKind::kForward) {
      for (Op& op : stage_forward_ops(model, shape, stage, item.microbatch, options)) push(std::move(op), i);
      continue;
    }
    auto entries = stage_backward_ops_by_entry(model, shape, stage, item.microbatch, options);
    std::vector<GradBucket> buckets;
    if (i == last_backward[item.chunk]) {
      buckets = grad_sync_buckets(shape, config, stage_parameters(model, shape, stage), item.chunk, options);
    }
    std::size_t next_bucket = 0;
    for (int e = 0; e < static_cast<int>(entries.size()); ++e) {
      for (Op& op : entries[e]) push(std::move(op), i);
      while (next_bucket < buckets.size() && buckets[next_bucket].ready_after_entry == e) {
        if (config.overlap_grad_reduce)
          push(buckets[next_bucket].op, i);
        else
          deferred_sync.push_back(buckets[next_bucket].op);
        ++next_bucket;
      }
    }
  }
  for (Op& op : deferred_sync) push(std::move(op), -1);
  for (Op& op : optimizer_step_ops(model, shape, config, stages, options)) push(std::move(op), -1);
  return program;
}

}  // namespace megatune::layouts
