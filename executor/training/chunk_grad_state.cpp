// ChunkGradState: the dense and expert gradient regions of a chunk, their buckets and owned ranges.
#include "executor/training/chunk_grad_state.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace megatune::executor {

ChunkGradState::ChunkGradState(const GPTModel& model, Communicator& communicator,
                               const ChunkGradOptions& options,
                               const std::vector<layouts::GradBucket>& walker_buckets, bool with_reducers) {
  Backend& backend = communicator.backend();
  const ParameterLayout& layout = model.layout();
  std::int64_t owned_elements = 0;
  for (const bool expert : {true, false}) {
    if (expert && layout.expert_elements() == 0) continue;
    GradRegion r;
    r.expert = expert;
    r.group = expert ? CommGroup::kExpertData : CommGroup::kDataContext;
    r.base = expert ? 0 : layout.expert_elements();
    const int size = communicator.size(r.group), rank = communicator.rank(r.group);
    GradBucketOptions bucket_options;
    bucket_options.data_parallel_size = size;
    bucket_options.overlap_grad_reduce = options.overlap_grad_reduce;
    bucket_options.distributed_optimizer = options.distributed_optimizer;
    bucket_options.bucket_end_multiple = layouts::kParameterAlignElements;
    r.buffer = std::make_unique<GradBufferLayout>(
        grad_buffer_entries(layout, options.shared_embedding, expert), bucket_options);
    r.first_bucket = static_cast<int>(owned.size());
    for (int b = 0; b < static_cast<int>(r.buffer->buckets().size()); ++b) {
      const GradBucketRange& range = r.buffer->buckets()[b];
      const std::int64_t begin =
          r.base + (options.distributed_optimizer ? r.buffer->shard_begin(b, rank) : range.begin);
      const std::int64_t end =
          options.distributed_optimizer ? begin + r.buffer->shard_elements(b) : r.base + range.end;
      owned.emplace_back(begin, end);
      owned_elements += end - begin;
    }
    if (with_reducers) {
      GradientReducerOptions reducer;
      reducer.overlap_grad_reduce = options.overlap_grad_reduce;
      reducer.distributed_optimizer = options.distributed_optimizer;
      reducer.group = r.group;
      reducer.expert = expert;
      reducer.scale_to_mean = false;  // the loss gradient carries 1 / (dp * cp)
      const Tensor grads = flat_range(backend, model.grads(), r.base, r.buffer->total_elements());
      r.reducer = std::make_unique<GradientReducer>(communicator, *r.buffer, grads, reducer);
    }
    regions.push_back(std::move(r));
  }
  std::int64_t covered = 0;
  for (const GradRegion& r : regions) covered += r.buffer->total_elements();
  if (covered != layout.total_elements())
    throw std::logic_error("the grad buffer's buckets do not tile the model's buffer");
  exp_avg = backend.allocate(DType::kFP32, 1, std::max<std::int64_t>(owned_elements, 1),
                             "AdamW exp_avg, exp_avg_sq (fp32)");
  exp_avg_sq = backend.allocate(DType::kFP32, 1, std::max<std::int64_t>(owned_elements, 1),
                                "AdamW exp_avg, exp_avg_sq (fp32)");
  // The walker's buckets of each kind in order are the region's buckets in order.
  int next[2] = {0, 0};
  for (const layouts::GradBucket& b : walker_buckets) {
    const auto region = std::find_if(regions.begin(), regions.end(),
                                     [&](const GradRegion& r) { return r.expert == b.expert; });
    if (region == regions.end() || next[b.expert] >= static_cast<int>(region->buffer->buckets().size()))
      throw std::logic_error(std::string("the step program has more ") + (b.expert ? "expert" : "dense") +
                             " gradient buckets than the executor's buffer");
    step_buckets.emplace_back(static_cast<int>(region - regions.begin()), next[b.expert]++);
  }
}

const GradRegion& ChunkGradState::region_of_step_bucket(int bucket, int* local_bucket) const {
  const auto& [region, local] = step_buckets.at(bucket);
  *local_bucket = local;
  return regions.at(region);
}

void ChunkGradState::finish_reductions() {
  for (GradRegion& r : regions)
    if (r.reducer) r.reducer->finish();
}

}  // namespace megatune::executor
