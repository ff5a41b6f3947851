// Op helpers: names, equality of work, FLOPs and the one-line text form.
#include "layouts/op.h"

#include <sstream>

namespace megatune::layouts {

bool Op::same_work(const Op& o) const {
  return kind == o.kind && phase == o.phase && role == o.role && dtype == o.dtype && label == o.label &&
         m == o.m && n == o.n && k == o.k && accumulate == o.accumulate && attention == o.attention &&
         bytes == o.bytes && group == o.group && group_size == o.group_size && layer == o.layer;
}

double Op::attention_flops() const {
  if (kind != OpKind::kAttentionForward && kind != OpKind::kAttentionBackward) return 0.0;
  const AttentionShape& a = attention;
  // Q.K^T over the q/k head dim, P.V over the value head dim.
  double forward =
      2.0 * a.batch * a.heads * static_cast<double>(a.seq_q) * a.seq_kv * (a.head_dim + a.value_head_dim());
  if (a.causal) forward /= 2.0;
  return kind == OpKind::kAttentionForward ? forward : 2.5 * forward;
}

const char* op_kind_name(OpKind kind) {
  switch (kind) {
    case OpKind::kGemm:
      return "gemm";
    case OpKind::kAttentionForward:
      return "attention_fwd";
    case OpKind::kAttentionBackward:
      return "attention_bwd";
    case OpKind::kEmbedding:
      return "embedding";
    case OpKind::kEmbeddingBackward:
      return "embedding_bwd";
    case OpKind::kNorm:
      return "norm";
    case OpKind::kNormBackward:
      return "norm_bwd";
    case OpKind::kRope:
      return "rope";
    case OpKind::kRopeBackward:
      return "rope_bwd";
    case OpKind::kActivation:
      return "activation";
    case OpKind::kActivationBackward:
      return "activation_bwd";
    case OpKind::kCrossEntropy:
      return "cross_entropy";
    case OpKind::kElementwise:
      return "elementwise";
    case OpKind::kRouter:
      return "router";
    case OpKind::kGradNorm:
      return "grad_norm";
    case OpKind::kOptimizer:
      return "optimizer";
    case OpKind::kAllReduce:
      return "all_reduce";
    case OpKind::kAllGather:
      return "all_gather";
    case OpKind::kReduceScatter:
      return "reduce_scatter";
    case OpKind::kAllToAll:
      return "all_to_all";
    case OpKind::kSend:
      return "send";
    case OpKind::kRecv:
      return "recv";
    case OpKind::kBroadcast:
      return "broadcast";
  }
  return "?";
}

const char* comm_group_name(CommGroup group) {
  switch (group) {
    case CommGroup::kNone:
      return "-";
    case CommGroup::kTensor:
      return "tp";
    case CommGroup::kContext:
      return "cp";
    case CommGroup::kData:
      return "dp";
    case CommGroup::kDataContext:
      return "dp-cp";
    case CommGroup::kPipeline:
      return "pp";
    case CommGroup::kExpert:
      return "ep";
    case CommGroup::kExpertTensor:
      return "etp";
    case CommGroup::kExpertData:
      return "edp";
    case CommGroup::kTensorExpert:
      return "tp-ep";
    case CommGroup::kEmbedding:
      return "embedding";
    case CommGroup::kWorld:
      return "world";
  }
  return "?";
}

const char* op_phase_name(OpPhase phase) {
  switch (phase) {
    case OpPhase::kForward:
      return "F";
    case OpPhase::kBackward:
      return "B";
    case OpPhase::kRecompute:
      return "R";
    case OpPhase::kGradSync:
      return "G";
    case OpPhase::kOptimizer:
      return "O";
  }
  return "?";
}

const char* op_role_name(OpRole role) {
  switch (role) {
    case OpRole::kCompute:
      return "compute";
    case OpRole::kTensorParallel:
      return "tensor_parallel";
    case OpRole::kContextParallelRing:
      return "context_parallel_ring";
    case OpRole::kContextParallelGather:
      return "context_parallel_gather";
    case OpRole::kExpertDispatch:
      return "expert_dispatch";
    case OpRole::kP2pActivation:
      return "p2p_activation";
    case OpRole::kP2pGradient:
      return "p2p_gradient";
    case OpRole::kGradReduce:
      return "grad_reduce";
    case OpRole::kExpertGradReduce:
      return "expert_grad_reduce";
    case OpRole::kEmbeddingGradReduce:
      return "embedding_grad_reduce";
    case OpRole::kSequenceParallelNormGrad:
      return "sequence_parallel_norm_grad";
    case OpRole::kGradNormReduce:
      return "grad_norm_reduce";
    case OpRole::kParamGather:
      return "param_gather";
    case OpRole::kExpertParamGather:
      return "expert_param_gather";
    case OpRole::kFsdpParamGather:
      return "fsdp_param_gather";
    case OpRole::kFsdpExpertParamGather:
      return "fsdp_expert_param_gather";
  }
  return "?";
}

std::int64_t dtype_bytes(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
    case DType::kFP16:
      return 2;
    case DType::kFP32:
      return 4;
    case DType::kFP8:
      return 1;
  }
  return 0;
}

std::string to_string(const Op& op) {
  static const char* dtype_names[] = {"bf16", "fp16", "fp32", "fp8"};
  std::ostringstream out;
  out << op_phase_name(op.phase);
  if (op.microbatch >= 0) out << " mb" << op.microbatch;
  if (op.chunk >= 0) out << " c" << op.chunk;
  if (op.layer >= 0) out << " L" << op.layer;
  out << ' ' << op_kind_name(op.kind);
  if (!op.label.empty()) out << ' ' << op.label;
  if (op.kind == OpKind::kGemm) {
    out << " m=" << op.m << " n=" << op.n << " k=" << op.k << (op.accumulate ? " +=" : "");
  } else if (op.kind == OpKind::kAttentionForward || op.kind == OpKind::kAttentionBackward) {
    const AttentionShape& a = op.attention;
    out << " b=" << a.batch << " h=" << a.heads << " kv=" << a.kv_heads << " sq=" << a.seq_q
        << " skv=" << a.seq_kv << " d=" << a.head_dim;
    if (a.value_head_dim() != a.head_dim) out << " dv=" << a.value_head_dim();
    out << (a.causal ? " causal" : "");
  } else {
    out << " bytes=" << op.bytes;
  }
  if (op.is_communication()) {
    out << " group=" << comm_group_name(op.group) << '/' << op.group_size;
    if (op.peer_rank >= 0) out << " peer=" << op.peer_rank;
  }
  out << ' ' << dtype_names[static_cast<int>(op.dtype)];
  return out.str();
}

}  // namespace megatune::layouts
