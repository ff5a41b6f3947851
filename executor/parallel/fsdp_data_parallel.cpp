// FsdpDataParallel: the buckets' entry groups, the gathers at use of optim_grads_params and the slots they
// land in.
#include "executor/parallel/fsdp_data_parallel.h"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>

#include "executor/backend/recording_pause.h"
#include "executor/parallel/state_labels.h"
#include "layouts/schedule_walker.h"

namespace megatune::executor {

using layouts::OpPhase;
using layouts::OpRole;

FsdpDataParallel::FsdpDataParallel(Communicator& communicator, std::vector<DataParallelChunk> chunks,
                                   const std::vector<std::vector<layouts::GradBucket>>& step_buckets,
                                   const DataParallelOptions& options, bool sizing)
    : DistributedOptimizer(communicator, std::move(chunks), step_buckets, options, sizing),
      shard_parameters_(options.fsdp == layouts::DataParallelSharding::kOptimGradsParams) {
  for (const Chunk& chunk : chunks_) {
    std::vector<std::pair<int, int>> order = chunk.step_buckets;
    if (order.empty())  // no walker: the regions' buckets in buffer order
      for (int r = 0; r < static_cast<int>(chunk.regions.size()); ++r)
        for (int b = 0; b < static_cast<int>(chunk.regions[r].buffer->buckets().size()); ++b)
          order.emplace_back(r, b);
    std::vector<BucketRef>& refs = buckets_.emplace_back();
    for (const auto& [region, bucket] : order) {
      const GradBufferLayout& buffer = *chunk.regions[region].buffer;
      const GradBucketRange& range = buffer.buckets()[bucket];
      const int code = buffer.entries()[range.first_entry].group;
      if (shard_parameters_)
        for (int e = range.first_entry; e < range.end_entry; ++e)
          if (buffer.entries()[e].group != code)
            throw std::logic_error(
                "FSDP optim_grads_params needs a gradient bucket per parameter entry; bucket " +
                std::to_string(bucket) + " holds entries " + std::to_string(code) + " and " +
                std::to_string(buffer.entries()[e].group));
      refs.push_back({region, bucket, code});
    }
  }
  if (shard_parameters_) lay_out_slots(options);
}

void FsdpDataParallel::lay_out_slots(const DataParallelOptions& options) {
  std::int64_t slot_elements = 0;
  bool any_residence = false;
  for (std::size_t c = 0; c < chunks_.size(); ++c) {
    std::map<int, std::int64_t> filled;  // per entry
    for (BucketRef& ref : buckets_[c]) {
      const GradBufferLayout& buffer = *chunks_[c].regions[ref.region].buffer;
      ref.slot_offset = filled[ref.layer_code];
      filled[ref.layer_code] += buffer.buckets()[ref.bucket].numel();
      slot_elements = std::max(slot_elements, filled[ref.layer_code]);
    }
    any_residence = any_residence || chunks_[c].buffers.residence != nullptr;
  }
  if (!any_residence || slot_elements == 0) return;
  const DType dtype = chunks_.front().buffers.model_params.dtype;
  for (int s = 0; s < std::max(1, options.gathered_entries_in_use); ++s)
    slots_.push_back({backend_.allocate(dtype, 1, slot_elements, state_label::kModelParams), -1, 0, {}});
}

FsdpDataParallel::Slot& FsdpDataParallel::slot_of(int chunk, int layer_code) {
  for (Slot& s : slots_)
    if (s.chunk == chunk && s.layer_code == layer_code) return s;
  for (Slot& s : slots_)
    if (s.chunk < 0) {
      s.chunk = chunk;
      s.layer_code = layer_code;
      return s;
    }
  throw std::logic_error("FSDP optim_grads_params: more than " + std::to_string(slots_.size()) +
                         " gathered entries in use at once (entry " + std::to_string(layer_code) + ")");
}

void FsdpDataParallel::release_slots() {
  for (Slot& s : slots_) {
    if (s.chunk < 0) continue;
    if (s.layer_code == -1 && chunks_[s.chunk].buffers.head_reads_embedding) continue;  // the tied head's
    for (const std::int64_t begin : s.placed)
      chunks_[s.chunk].buffers.residence->release_parameters(s.layer_code, begin);
    s.placed.clear();
    s.chunk = -1;
  }
}

void FsdpDataParallel::gather_at_use(int chunk, const BucketRef& ref, OpPhase phase) {
  const Chunk& c = chunks_.at(chunk);
  const auto o = std::find_if(c.owned.begin(), c.owned.end(), [&](const OwnedRange& x) {
    return x.region == ref.region && x.bucket == ref.bucket;
  });
  const bool expert = c.regions[ref.region].expert;
  const OpTag tag = expert ? OpTag{"fsdp_expert_param_ag", -1, phase, OpRole::kFsdpExpertParamGather}
                           : OpTag{"fsdp_param_ag", -1, phase, OpRole::kFsdpParamGather};
  if (c.buffers.residence == nullptr) {  // into the model's whole copy
    CommHandle h = gather_range(chunk, *o, c.buffers.model_params, false, c.buffers.model_params, tag);
    if (h) h->wait();
    return;
  }
  const Region& r = c.regions[ref.region];
  const GradBucketRange& bucket = r.buffer->buckets()[ref.bucket];
  Slot& slot = slot_of(chunk, ref.layer_code);
  const Tensor shard = flat_range(backend_, c.model_shard, o->state_offset, o->end - o->begin);
  CommHandle h = communicator_.all_gather_async(
      r.group, shard,
      flat_range(backend_, slot.storage, ref.slot_offset, bucket.numel(), communicator_.size(r.group)), tag);
  if (h) h->wait();
  const std::int64_t begin = r.base + bucket.begin;
  if (std::find(slot.placed.begin(), slot.placed.end(), begin) != slot.placed.end()) return;
  c.buffers.residence->place_parameters(ref.layer_code, begin, r.base + bucket.end,
                                        flat_range(backend_, slot.storage, ref.slot_offset, bucket.numel()));
  slot.placed.push_back(begin);
}

void FsdpDataParallel::before_forward(int chunk, int group) {
  if (!shard_parameters_) return DistributedOptimizer::before_forward(chunk, group);
  // The segment's buckets in forward order: the reverse of the buffer's.
  const std::vector<BucketRef>& refs = buckets_.at(chunk);
  for (std::size_t i = refs.size(); i-- > 0;)
    if (layouts::forward_segment_group_of(refs[i].layer_code) == group)
      gather_at_use(chunk, refs[i], OpPhase::kForward);
}

void FsdpDataParallel::before_backward(int chunk, int layer_code) {
  if (!shard_parameters_) return;
  for (const BucketRef& ref : buckets_.at(chunk))
    if (ref.layer_code == layer_code) gather_at_use(chunk, ref, OpPhase::kBackward);
}

void FsdpDataParallel::after_forward(int, int) { release_slots(); }

void FsdpDataParallel::after_backward(int, int) { release_slots(); }

std::vector<float> FsdpDataParallel::main_parameters(int chunk) {
  if (shard_parameters_ && chunks_.at(chunk).master.numel() == 0) {
    RecordingPause pause(backend_);
    for (const BucketRef& ref : buckets_.at(chunk)) gather_at_use(chunk, ref, OpPhase::kOptimizer);
  }
  return DistributedOptimizer::main_parameters(chunk);
}

void FsdpDataParallel::gather_bucket(int chunk, int region, int bucket) {
  if (!shard_parameters_) DistributedOptimizer::gather_bucket(chunk, region, bucket);
}

}  // namespace megatune::executor
