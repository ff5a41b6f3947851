// FsdpDataParallel: the buckets' entry groups and the gathers at use of optim_grads_params.
#include "executor/parallel/fsdp_data_parallel.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "executor/backend/recording_pause.h"
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
}

void FsdpDataParallel::gather_at_use(int chunk, const BucketRef& ref, OpPhase phase) {
  const Chunk& c = chunks_.at(chunk);
  const auto o = std::find_if(c.owned.begin(), c.owned.end(), [&](const OwnedRange& x) {
    return x.region == ref.region && x.bucket == ref.bucket;
  });
  const bool expert = c.regions[ref.region].expert;
  const OpTag tag = expert ? OpTag{"fsdp_expert_param_ag", -1, phase, OpRole::kFsdpExpertParamGather}
                           : OpTag{"fsdp_param_ag", -1, phase, OpRole::kFsdpParamGather};
  CommHandle h = gather_range(chunk, *o, c.buffers.model_params, false, c.buffers.model_params, tag);
  if (h) h->wait();
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
