// ChunkGradState: a model chunk's gradient buffers as Megatron keeps them: the dense parameters' buffer
// (reduced over dp-cp) and, for MoE, the routed experts' buffer (reduced over expert-dp), each split into
// its buckets with their reducer; the ranges this rank updates (the whole buffer, or under the distributed
// optimizer its shard of every bucket) and the AdamW moments over them.
#pragma once
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "executor/model/gpt_model.h"
#include "executor/parallel/grad_buckets.h"
#include "executor/parallel/gradient_reducer.h"
#include "layouts/step_program.h"

namespace megatune::executor {

// One gradient buffer of a chunk: a contiguous region of the chunk's flat buffers.
struct GradRegion {
  bool expert = false;
  CommGroup group = CommGroup::kDataContext;  // the group its buckets are reduced over
  std::int64_t base = 0;                      // first element of the region in the chunk's buffers
  std::unique_ptr<GradBufferLayout> buffer;   // offsets relative to base
  std::unique_ptr<GradientReducer> reducer;
  int first_bucket = 0;  // index of its first bucket in ChunkGradState::owned
};

struct ChunkGradOptions {
  bool overlap_grad_reduce = false;
  bool distributed_optimizer = false;
  bool shared_embedding = false;  // the chunk's word embedding is a tied copy another stage owns
};

struct ChunkGradState {
  std::vector<GradRegion> regions;  // the expert region (when there is one) first, as in the buffers
  // Per bucket of every region, in buffer order: [begin, end) this rank updates (absolute offsets).
  std::vector<std::pair<std::int64_t, std::int64_t>> owned;
  Tensor exp_avg, exp_avg_sq;  // (1, owned elements) fp32
  // The step program's buckets of this chunk (layouts::RankStep::buckets[chunk]) as (region, bucket).
  std::vector<std::pair<int, int>> step_buckets;

  // Lays out the regions of `model` and allocates the moments; with_reducers: also the reducers (not in the
  // sizing pass). step_buckets: the walker's buckets of this chunk, which must match the regions' buckets.
  ChunkGradState(const GPTModel& model, Communicator& communicator, const ChunkGradOptions& options,
                 const std::vector<layouts::GradBucket>& step_buckets, bool with_reducers);
  const GradRegion& region_of_step_bucket(int bucket, int* local_bucket) const;
  const GradRegion& dense_region() const { return regions.back(); }
  void finish_reductions();
};

}  // namespace megatune::executor
