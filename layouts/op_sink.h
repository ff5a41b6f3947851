// OpSink: appends Ops with shared bookkeeping (phase, layer, microbatch, chunk) and the role of each
// collective; internal to the step-program builders (step_program.cpp, grad_sync.cpp).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "layouts/op.h"

namespace megatune::layouts {

// The role of a collective issued inside a forward/backward pass, by the group it runs over (kTensor,
// kContext, the expert groups; other groups throw std::logic_error).
OpRole layer_comm_role(OpKind kind, CommGroup group);

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
  // A collective of a layer pass: its role follows from its group (layer_comm_role).
  void comm(OpKind kind, const char* label, std::int64_t bytes, CommGroup group, int group_size,
            DType dtype = DType::kBF16) {
    comm_as(layer_comm_role(kind, group), kind, label, bytes, group, group_size, dtype);
  }
  void comm_as(OpRole role, OpKind kind, const char* label, std::int64_t bytes, CommGroup group,
               int group_size, DType dtype = DType::kBF16) {
    if (group_size <= 1) return;
    Op& op = add(kind, label);
    op.role = role;
    op.bytes = bytes;
    op.group = group;
    op.group_size = group_size;
    op.dtype = dtype;
  }
  void attention(OpKind kind, const char* label, const AttentionShape& shape) {
    Op& op = add(kind, label);
    op.attention = shape;
  }
  Op& last() { return ops_.back(); }
  OpPhase phase() const { return phase_; }
  int microbatch() const { return microbatch_; }
  // A sink appending to the same list with the same bookkeeping but another phase.
  OpSink with_phase(OpPhase phase) const { return OpSink(ops_, phase, layer_, microbatch_, chunk_); }

 private:
  std::vector<Op>& ops_;
  OpPhase phase_;
  int layer_, microbatch_, chunk_;
};

}  // namespace megatune::layouts
