// DataParallelStrategy: the chunks' regions, buckets and owned ranges, the reduction, the global norm, the
// multi-tensor table of the update and the moments; make_data_parallel_strategy.
#include "executor/parallel/data_parallel.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "executor/parallel/distributed_optimizer.h"
#include "executor/parallel/fsdp_data_parallel.h"
#include "executor/parallel/replicated_data_parallel.h"

namespace megatune::executor {

using layouts::OpPhase;

std::int64_t DataParallelChunk::total_elements() const {
  return (expert_buffer != nullptr ? expert_buffer->total_elements() : 0) + dense_buffer->total_elements();
}

DataParallelStrategy::DataParallelStrategy(Communicator& communicator, std::vector<DataParallelChunk> chunks,
                                           const std::vector<std::vector<layouts::GradBucket>>& step_buckets,
                                           const DataParallelOptions& options, bool shard_optimizer_state,
                                           bool sizing)
    : communicator_(communicator),
      backend_(communicator.backend()),
      options_(options),
      shard_(shard_optimizer_state),
      norm_(communicator.backend()) {
  for (std::size_t c = 0; c < chunks.size(); ++c) {
    Chunk chunk;
    chunk.buffers = chunks[c];
    const DataParallelChunk& b = chunk.buffers;
    if (b.dense_buffer == nullptr)
      throw std::invalid_argument("DataParallelStrategy: a chunk without buffers");
    if (b.grads.rows != 1 || b.grads.cols < b.total_elements())
      throw std::invalid_argument("DataParallelStrategy: the gradients do not cover the chunk's buffer");
    if (b.expert_buffer != nullptr) add_region(chunk, true, *b.expert_buffer, 0, sizing);
    add_region(chunk, false, *b.dense_buffer, b.total_elements() - b.dense_buffer->total_elements(), sizing);
    const std::int64_t state = std::max<std::int64_t>(chunk.owned_elements, 1);
    if (b.main_params.numel() == 0)
      chunk.master = backend_.allocate(DType::kFP32, 1, state, state_label::kMainParams);
    chunk.exp_avg = backend_.allocate(DType::kFP32, 1, state, state_label::kMoments);
    chunk.exp_avg_sq = backend_.allocate(DType::kFP32, 1, state, state_label::kMoments);
    if (b.residence != nullptr)
      chunk.model_shard = backend_.allocate(b.model_params.dtype, 1, state, state_label::kModelParams);
    if (b.gradient_residence != nullptr)
      chunk.grad_shard = backend_.allocate(DType::kFP32, 1, state, state_label::kMainGrads);
    map_step_buckets(chunk, c < step_buckets.size() ? step_buckets[c] : std::vector<layouts::GradBucket>{});
    chunks_.push_back(std::move(chunk));
  }
  if (sizing) return;
  for (Chunk& chunk : chunks_) {
    backend_.fill_zero(chunk.exp_avg);
    backend_.fill_zero(chunk.exp_avg_sq);
  }
  backend_.prepare_optimizer(optimizer_tensors());
}

void DataParallelStrategy::add_region(Chunk& chunk, bool expert, const GradBufferLayout& buffer,
                                      std::int64_t base, bool sizing) {
  Region r;
  r.expert = expert;
  r.group = expert ? CommGroup::kExpertData : CommGroup::kDataContext;
  r.base = base;
  r.buffer = &buffer;
  require_layout_for_group(buffer, communicator_, r.group, "DataParallelStrategy");
  const int rank = communicator_.rank(r.group);
  const int region = static_cast<int>(chunk.regions.size());
  for (int b = 0; b < static_cast<int>(buffer.buckets().size()); ++b) {
    const GradBucketRange& bucket = buffer.buckets()[b];
    OwnedRange o;
    o.region = region;
    o.bucket = b;
    o.begin = base + (shard_ ? buffer.shard_begin(b, rank) : bucket.begin);
    o.end = shard_ ? o.begin + buffer.shard_elements(b) : base + bucket.end;
    o.state_offset = chunk.owned_elements;
    chunk.owned_elements += o.end - o.begin;
    chunk.owned.push_back(o);
  }
  if (!sizing && chunk.buffers.gradient_residence == nullptr) {  // sharded gradients: FsdpDataParallel's
    GradientReducerOptions reducer;
    reducer.overlap_grad_reduce = options_.overlap_grad_reduce;
    reducer.distributed_optimizer = shard_;
    reducer.group = r.group;
    reducer.expert = expert;
    reducer.scale_to_mean = false;  // the loss gradient carries 1 / (dp * cp)
    const Tensor grads = flat_range(backend_, chunk.buffers.grads, base, buffer.total_elements());
    r.reducer = std::make_unique<GradientReducer>(communicator_, buffer, grads, reducer);
  }
  chunk.regions.push_back(std::move(r));
}

void DataParallelStrategy::map_step_buckets(Chunk& chunk, const std::vector<layouts::GradBucket>& buckets) {
  // The walker's buckets of each kind in order are the region's buckets in order.
  int next[2] = {0, 0};
  for (const layouts::GradBucket& b : buckets) {
    const auto region = std::find_if(chunk.regions.begin(), chunk.regions.end(),
                                     [&](const Region& r) { return r.expert == b.expert; });
    if (region == chunk.regions.end() || next[b.expert] >= static_cast<int>(region->buffer->buckets().size()))
      throw std::logic_error(std::string("the step program has more ") + (b.expert ? "expert" : "dense") +
                             " gradient buckets than the executor's buffer");
    chunk.step_buckets.emplace_back(static_cast<int>(region - chunk.regions.begin()), next[b.expert]++);
  }
}

std::vector<OptimizerTensor> DataParallelStrategy::optimizer_tensors() const {
  // The pieces of every parameter this rank updates (the whole buffer, or its shard of every bucket),
  // padding included when sharded (zero gradients, zero weights: AdamW leaves them at zero) so that the
  // optimizer ops count the shard's elements. Each element of the model counts once in the global grad
  // norm: replicated parameters on TP rank 0, and the shard's owner when sharded, else rank 0 of the
  // region's data-parallel group.
  const int tp_rank = communicator_.rank(CommGroup::kTensor);
  std::vector<OptimizerTensor> tensors;
  for (const Chunk& chunk : chunks_) {
    const DataParallelChunk& b = chunk.buffers;
    for (const OwnedRange& o : chunk.owned) {
      const Region& region = chunk.regions[o.region];
      const bool dp_counts = shard_ || communicator_.rank(region.group) == 0;
      auto piece = [&](std::int64_t lo, std::int64_t hi, bool decay, bool counts, bool decoupled) {
        if (hi <= lo) return;
        const std::int64_t n = hi - lo, state = o.state_offset + (lo - o.begin);
        OptimizerTensor t;
        t.main_param = b.main_params.numel() == 0 ? flat_range(backend_, chunk.master, state, n)
                                                  : flat_range(backend_, b.main_params, lo, n);
        t.main_grad = chunk.grad_shard.numel() > 0 ? flat_range(backend_, chunk.grad_shard, state, n)
                                                   : flat_range(backend_, b.grads, lo, n);
        t.exp_avg = flat_range(backend_, chunk.exp_avg, state, n);
        t.exp_avg_sq = flat_range(backend_, chunk.exp_avg_sq, state, n);
        // Beyond the model's copy (DDP's untied embedding tables): the main parameters are the weights.
        t.model_param = b.residence != nullptr          ? flat_range(backend_, chunk.model_shard, state, n)
                        : lo + n <= b.model_params.cols ? flat_range(backend_, b.model_params, lo, n)
                                                        : flat_range(backend_, b.main_params, lo, n);
        t.apply_weight_decay = decay;
        t.decoupled_lr = decoupled;
        t.in_grad_norm = counts;
        tensors.push_back(t);
      };
      const GradBufferLayout& buffer = *region.buffer;
      const GradBucketRange& bucket = buffer.buckets()[o.bucket];
      std::int64_t at = o.begin;
      for (int e = bucket.first_entry; e < bucket.end_entry; ++e) {
        const GradBufferEntry& entry = buffer.entries()[e];
        const std::int64_t offset = region.base + buffer.offset(e);
        const std::int64_t lo = std::max(o.begin, offset), hi = std::min(o.end, offset + entry.numel);
        if (hi <= lo) continue;
        if (shard_) piece(at, lo, false, false, false);  // padding before it
        piece(lo, hi, entry.weight_decay, dp_counts && counts_in_grad_norm(entry, tp_rank),
              entry.embedding_or_output);
        at = hi;
      }
      if (shard_) piece(at, o.end, false, false, false);
    }
  }
  return tensors;
}

const DataParallelStrategy::Region& DataParallelStrategy::region_of_step_bucket(int chunk, int step_bucket,
                                                                                int* bucket) const {
  const auto& [region, local] = chunks_.at(chunk).step_buckets.at(step_bucket);
  *bucket = local;
  return chunks_[chunk].regions.at(region);
}

void DataParallelStrategy::launch_bucket(int chunk, int step_bucket) {
  int bucket = 0;
  const Region& r = region_of_step_bucket(chunk, step_bucket, &bucket);
  if (r.reducer) r.reducer->launch_bucket(bucket);
}

void DataParallelStrategy::finish_grad_reduction() {
  for (Chunk& chunk : chunks_)
    for (Region& r : chunk.regions)
      if (r.reducer) r.reducer->finish();
}

void DataParallelStrategy::gather_reduced_grads(int, std::int64_t, std::int64_t, const OpTag&) {}

Tensor DataParallelStrategy::gathered_grads(int chunk, std::int64_t begin, std::int64_t numel) {
  return flat_range(backend_, chunks_.at(chunk).buffers.grads, begin, numel);
}

void DataParallelStrategy::end_gathered_grads(int) {}

std::vector<Tensor> DataParallelStrategy::reduced_grad_pieces(int chunk, std::int64_t begin,
                                                              std::int64_t numel) const {
  const Chunk& c = chunks_.at(chunk);
  if (c.grad_shard.numel() == 0) return {flat_range(backend_, c.buffers.grads, begin, numel)};
  std::vector<Tensor> pieces;
  for (const OwnedRange& o : c.owned) {
    const std::int64_t lo = std::max(o.begin, begin), hi = std::min(o.end, begin + numel);
    if (hi > lo)
      pieces.push_back(flat_range(backend_, c.grad_shard, o.state_offset + (lo - o.begin), hi - lo));
  }
  return pieces;
}

float DataParallelStrategy::grad_norm() { return norm_.compute(communicator_); }

void DataParallelStrategy::step(const AdamWHyper& hyper) {
  backend_.adamw_step(hyper, {"adamw", -1, OpPhase::kOptimizer});
}

void DataParallelStrategy::gather_params(int chunk, int step_bucket) {
  const auto& [region, bucket] = chunks_.at(chunk).step_buckets.at(step_bucket);
  gather_bucket(chunk, region, bucket);
}

void DataParallelStrategy::gather_all_params() {
  for (int c = 0; c < num_chunks(); ++c)
    for (const OwnedRange& o : chunks_[c].owned) gather_bucket(c, o.region, o.bucket);
}

void DataParallelStrategy::gather_bucket(int, int, int) {}

void DataParallelStrategy::before_forward(int, int) {}

void DataParallelStrategy::prepare_forward_gradients(int, int) {}

void DataParallelStrategy::before_backward(int, int) {}

void DataParallelStrategy::after_forward(int, int) {}

void DataParallelStrategy::after_backward(int, int) {}

void DataParallelStrategy::wait_params() {}

DataParallelStrategy::Moments DataParallelStrategy::moments(int chunk) const {
  const Chunk& c = chunks_.at(chunk);
  Moments m;
  m.exp_avg.resize(static_cast<std::size_t>(c.exp_avg.cols));
  m.exp_avg_sq.resize(m.exp_avg.size());
  backend_.download(c.exp_avg, m.exp_avg.data());
  backend_.download(c.exp_avg_sq, m.exp_avg_sq.data());
  m.exp_avg.resize(static_cast<std::size_t>(c.owned_elements));
  m.exp_avg_sq.resize(m.exp_avg.size());
  return m;
}

void DataParallelStrategy::set_moments(int chunk, const Moments& m) {
  const Chunk& c = chunks_.at(chunk);
  if (static_cast<std::int64_t>(m.exp_avg.size()) != c.owned_elements ||
      m.exp_avg_sq.size() != m.exp_avg.size())
    throw std::invalid_argument("set_moments: " + std::to_string(m.exp_avg.size()) +
                                " elements for a shard of " + std::to_string(c.owned_elements));
  std::vector<float> padded = m.exp_avg;
  padded.resize(static_cast<std::size_t>(c.exp_avg.cols), 0.0f);
  backend_.upload(c.exp_avg, padded.data());
  padded = m.exp_avg_sq;
  padded.resize(static_cast<std::size_t>(c.exp_avg.cols), 0.0f);
  backend_.upload(c.exp_avg_sq, padded.data());
}

std::vector<float> DataParallelStrategy::owned_values(int chunk, const std::vector<float>& whole) const {
  std::vector<float> own;
  for (const OwnedRange& o : chunks_.at(chunk).owned)
    own.insert(own.end(), whole.begin() + o.begin, whole.begin() + o.end);
  return own;
}

void DataParallelStrategy::set_moments_from_whole(int chunk, const Moments& whole) {
  set_moments(chunk, {owned_values(chunk, whole.exp_avg), owned_values(chunk, whole.exp_avg_sq)});
}

std::unique_ptr<DataParallelStrategy> make_data_parallel_strategy(
    bool distributed_optimizer, Communicator& communicator, std::vector<DataParallelChunk> chunks,
    const std::vector<std::vector<layouts::GradBucket>>& step_buckets, const DataParallelOptions& options,
    bool sizing) {
  if (options.fsdp && *options.fsdp != layouts::DataParallelSharding::kNoShard)
    return std::make_unique<FsdpDataParallel>(communicator, std::move(chunks), step_buckets, options, sizing);
  if (distributed_optimizer)
    return std::make_unique<DistributedOptimizer>(communicator, std::move(chunks), step_buckets, options,
                                                  sizing);
  return std::make_unique<ReplicatedDataParallel>(communicator, std::move(chunks), step_buckets, options,
                                                  sizing);
}

}  // namespace megatune::executor
