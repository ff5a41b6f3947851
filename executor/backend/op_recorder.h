// OpRecorder: the list of Ops (layouts/op.h vocabulary) a backend issued, for holding against the planner.
#pragma once
#include <vector>

#include "layouts/op.h"

namespace megatune::executor {

// Where an issued kernel belongs in the model: label ("qkv", "fc1", "attn", ...), layer and phase.
struct OpTag {
  const char* label = "";
  int layer = -1;
  layouts::OpPhase phase = layouts::OpPhase::kForward;
  layouts::OpRole role = layouts::OpRole::kCompute;  // what a collective is for (layouts/op.h)
};

class OpRecorder {
 public:
  void set_enabled(bool enabled) { enabled_ = enabled; }
  bool enabled() const { return enabled_; }
  // Schedule position stamped on every recorded op.
  void set_position(int microbatch, int chunk) {
    microbatch_ = microbatch;
    chunk_ = chunk;
  }
  // Fills the op's bookkeeping fields from the tag and the current schedule position.
  void stamp(layouts::Op& op, const OpTag& tag) const {
    op.label = tag.label;
    op.layer = tag.layer;
    op.phase = tag.phase;
    op.role = tag.role;
    op.microbatch = microbatch_;
    op.chunk = chunk_;
  }
  void append(layouts::Op op) {
    if (enabled_) ops_.push_back(std::move(op));
  }
  const std::vector<layouts::Op>& ops() const { return ops_; }
  void clear() { ops_.clear(); }

 private:
  bool enabled_ = false;
  int microbatch_ = -1;
  int chunk_ = -1;
  std::vector<layouts::Op> ops_;
};

}  // namespace megatune::executor
