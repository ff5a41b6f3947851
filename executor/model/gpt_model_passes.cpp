// GPTModel's passes segment by segment: the forward in the walk's forward segments (the embedding, each
// decoder layer, the head: final norm, MTP layers, LM head and loss), so the caller can wait a layer's
// parameters right before the segment that reads them; the backward in parameter entries (the loss, the
// layers last..first, the embedding), so a gradient bucket's reduction can start between them.
#include <stdexcept>

#include "executor/model/gpt_model.h"
#include "executor/model/gpt_model_phases.h"
#include "layouts/schedule_walker.h"

namespace megatune::executor {
namespace {
using namespace gpt_model_phases;  // NOLINT(google-build-using-namespace)
}  // namespace

int GPTModel::forward_segments() const { return static_cast<int>(forward_segment_groups().size()); }

std::vector<int> GPTModel::forward_segment_groups() const { return layouts::forward_segment_groups(stage_); }

void GPTModel::forward(const MicroBatch& mb, int index) { forward(mb, index, 0, forward_segments()); }

void GPTModel::forward(const MicroBatch& mb, int index, int begin, int end) {
  run_forward(mb, index, begin, end, true);
}

void GPTModel::forward_only(const MicroBatch& mb, int index) {
  forward_only(mb, index, 0, forward_segments());
}

void GPTModel::forward_only(const MicroBatch& mb, int index, int begin, int end) {
  run_forward(mb, index, begin, end, false);
}

void GPTModel::run_forward(const MicroBatch& mb, int index, int begin, int end, bool with_gradients) {
  bind_placed_linears();
  const std::int64_t T = shape_.tokens;
  const int count = forward_segments();
  if (index < 0 || index >= batch_.num_microbatches)
    throw std::out_of_range("micro-batch index out of range");
  if (begin < 0 || begin > end || end > count)
    throw std::out_of_range("forward: segment range outside the stage");
  if (forward_done_[index]) throw std::logic_error("forward of a micro-batch whose backward has not run");
  const bool needs_tokens = stage_.has_embedding, needs_labels = stage_.has_loss;
  if ((needs_tokens && static_cast<std::int64_t>(mb.tokens.size()) != T) ||
      (needs_labels && (static_cast<std::int64_t>(mb.labels.size()) != T ||
                        static_cast<std::int64_t>(mb.loss_mask.size()) != T)))
    throw std::invalid_argument("micro-batch size does not match micro_batch * seq");
  const int slot = slot_of(index);
  moe_slot_ = slot;
  Slot& s = slots_[slot];
  const int first_layer_segment = stage_.has_embedding ? 1 : 0;
  for (int segment = begin; segment < end; ++segment) {
    if (segment < first_layer_segment) {
      embedding_forward(mb, slot);
      continue;
    }
    const int i = segment - first_layer_segment;
    if (i < stage_.num_layers) {
      layer_forward(stage_.first_layer + i, activations_for(slot, i), s.residual[i], s.residual[i + 1], kF);
      // With MTP the last decoder layer's stage applies the final norm (holds_last_layer: its last layer).
      if (i == stage_.num_layers - 1 && config_.mtp_num_layers > 0 && holds_last_layer())
        final_norm_forward(slot, kF);
      continue;
    }
    if (stage_.num_mtp_layers > 0) mtp_forward(mb, index, slot, with_gradients);
    if (stage_.has_loss) loss_forward(mb, index, slot, with_gradients);
  }
  if (end < count) return;
  if (with_gradients)
    forward_done_[index] = true;
  else if (stage_.has_loss)
    slot_of_microbatch_[index] = -1;  // nothing to send: the slot is free
}

int GPTModel::backward_entries() const {
  return local_layer_count() + (stage_.has_embedding ? 1 : 0) + (stage_.has_loss ? 1 : 0);
}

void GPTModel::backward(int index) { backward(index, 0, backward_entries()); }

void GPTModel::backward(int index, int begin, int end) {
  bind_placed_linears();
  const int count = backward_entries();
  if (index < 0 || index >= batch_.num_microbatches || !forward_done_[index])
    throw std::logic_error("backward of a micro-batch whose forward did not run");
  if (begin < 0 || begin > end || end > count)
    throw std::out_of_range("backward: entry range outside the stage");
  const int slot = slot_of(index);
  moe_slot_ = slot;
  Slot& s = slots_[slot];
  const int loss_entries = stage_.has_loss ? 1 : 0;
  if (begin == 0 && !stage_.has_loss) backend_.copy(s.output_grad, d_res_);
  for (int e = begin; e < end; ++e) {
    const int mtp_entries = stage_.num_mtp_layers;
    if (e < loss_entries) {
      loss_backward(slot);
    } else if (e < loss_entries + mtp_entries) {
      mtp_backward(slot, mtp_entries - 1 - (e - loss_entries));  // MTP layers last..first
    } else if (e < loss_entries + mtp_entries + stage_.num_layers) {
      const int i = stage_.num_layers - 1 - (e - loss_entries - mtp_entries);  // layers last..first
      const int l = stage_.first_layer + i;
      LayerActivations& acts = activations_for(slot, i);
      if (config_.mtp_num_layers > 0 && l == config_.num_layers - 1)
        final_norm_backward(slot, stage_.has_loss ? mtp_->d_hidden : s.output_grad);
      recompute_unit_ending_at(l, slot);  // as Megatron: the unit's layers, before its last one's backward
      layer_backward(l, acts, s.residual[i], plan_.at(l) == layouts::LayerRecompute::kUnitLast);
    } else {
      embedding_backward(slot);
    }
  }
  if (end < count) return;
  forward_done_[index] = false;
  if (!stage_.has_embedding)
    backend_.copy(d_res_, s.input_grad);
  else
    slot_of_microbatch_[index] = -1;  // nothing to send: the slot is free
}

}  // namespace megatune::executor
