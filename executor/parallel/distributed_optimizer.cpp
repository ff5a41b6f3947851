// DistributedOptimizer: the sharded state's gathers (updated parameters, reduced gradients, the main
// parameters for checkpoints) and the forward pre-hook that waits them.
#include "executor/parallel/distributed_optimizer.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "executor/backend/recording_pause.h"

namespace megatune::executor {

using layouts::OpPhase;
using layouts::OpRole;

DistributedOptimizer::DistributedOptimizer(Communicator& communicator, std::vector<DataParallelChunk> chunks,
                                           const std::vector<std::vector<layouts::GradBucket>>& step_buckets,
                                           const DataParallelOptions& options, bool sizing)
    : DataParallelStrategy(communicator, std::move(chunks), step_buckets, options,
                           /*shard_optimizer_state=*/true, sizing) {
  for (const Chunk& chunk : chunks_) {
    if (chunk.buffers.model_params.cols < chunk.buffers.total_elements())
      throw std::invalid_argument("DistributedOptimizer: the model's copy must cover every parameter");
    gathers_.emplace_back();
    first_bucket_of_group_.emplace_back();
    for (const Region& r : chunk.regions) {
      gathers_.back().emplace_back(r.buffer->buckets().size());
      std::map<int, int>& first = first_bucket_of_group_.back().emplace_back();
      for (int e = 0; e < static_cast<int>(r.buffer->entries().size()); ++e)
        first.emplace(r.buffer->entries()[e].group, r.buffer->bucket_of(e));  // keeps the first
    }
  }
}

CommHandle DistributedOptimizer::gather_range(int chunk, const OwnedRange& o, Tensor source, bool from_state,
                                              Tensor target, const OpTag& tag) {
  const Region& r = chunks_.at(chunk).regions.at(o.region);
  const GradBucketRange& bucket = r.buffer->buckets().at(o.bucket);
  const std::int64_t n = o.end - o.begin;
  const Tensor input = flat_range(backend_, source, from_state ? o.state_offset : o.begin, n);
  return communicator_.all_gather_async(
      r.group, input,
      flat_range(backend_, target, r.base + bucket.begin, bucket.numel(), communicator_.size(r.group)), tag);
}

void DistributedOptimizer::gather_reduced_grads(int chunk, std::int64_t begin, std::int64_t numel,
                                                const OpTag& tag) {
  const Chunk& c = chunks_.at(chunk);
  for (const OwnedRange& o : c.owned) {
    const Region& r = c.regions[o.region];
    const GradBucketRange& bucket = r.buffer->buckets()[o.bucket];
    if (r.base + bucket.end <= begin || r.base + bucket.begin >= begin + numel) continue;
    CommHandle h = gather_range(chunk, o, c.buffers.grads, false, c.buffers.grads, tag);
    if (h) h->wait();
  }
}

void DistributedOptimizer::gather_bucket(int chunk, int r, int bucket) {
  const Chunk& c = chunks_.at(chunk);
  const Region& region = c.regions.at(r);
  const auto o = std::find_if(c.owned.begin(), c.owned.end(),
                              [&](const OwnedRange& x) { return x.region == r && x.bucket == bucket; });
  const OpTag tag = region.expert
                        ? OpTag{"expert_param_ag", -1, OpPhase::kOptimizer, OpRole::kExpertParamGather}
                        : OpTag{"param_ag", -1, OpPhase::kOptimizer, OpRole::kParamGather};
  CommHandle h = gather_range(chunk, *o, c.buffers.model_params, false, c.buffers.model_params, tag);
  if (!h) return;
  if (options_.overlap_param_gather)
    gathers_[chunk][r][bucket] = std::move(h);
  else
    h->wait();
}

void DistributedOptimizer::before_forward(int chunk, int group) {
  // Buckets hold the parameters in reverse forward order: what the forward read before `group` lies in
  // later buckets, already waited by their hooks.
  for (std::size_t r = 0; r < gathers_.at(chunk).size(); ++r) {
    const auto first = first_bucket_of_group_[chunk][r].find(group);
    if (first == first_bucket_of_group_[chunk][r].end()) continue;
    std::vector<CommHandle>& handles = gathers_[chunk][r];
    for (std::size_t b = static_cast<std::size_t>(first->second); b < handles.size(); ++b)
      if (handles[b]) {
        handles[b]->wait();
        handles[b].reset();
      }
  }
}

void DistributedOptimizer::wait_params() {
  for (auto& chunk : gathers_)
    for (auto& region : chunk)
      for (CommHandle& h : region)
        if (h) {
          h->wait();
          h.reset();
        }
}

std::vector<float> DistributedOptimizer::main_parameters(int chunk) {
  wait_params();
  const Chunk& c = chunks_.at(chunk);
  Tensor whole = c.buffers.main_params;  // an fp32 model's parameters are its main parameters
  if (whole.numel() == 0) {
    // Not a step-program op: the shards gathered into the gradient buffer, which is free between iterations.
    RecordingPause pause(backend_);
    whole = c.buffers.grads;
    for (const OwnedRange& o : c.owned) {
      CommHandle h = gather_range(chunk, o, c.master, true, whole,
                                  {"main_param_ag", -1, OpPhase::kOptimizer, OpRole::kParamGather});
      if (h) h->wait();
    }
  }
  std::vector<float> host(static_cast<std::size_t>(whole.cols));
  backend_.download(whole, host.data());
  host.resize(static_cast<std::size_t>(c.buffers.total_elements()));
  return host;
}

void DistributedOptimizer::set_main_parameters(int chunk, const std::vector<float>& values) {
  wait_params();
  const Chunk& c = chunks_.at(chunk);
  const DataParallelChunk& b = c.buffers;
  if (static_cast<std::int64_t>(values.size()) != b.total_elements())
    throw std::invalid_argument("set_main_parameters: " + std::to_string(values.size()) +
                                " values for a buffer of " + std::to_string(b.total_elements()));
  std::vector<float> own = owned_values(chunk, values);
  own.resize(static_cast<std::size_t>(c.exp_avg.cols), 0.0f);  // the state tensors' length
  if (b.residence != nullptr) {
    backend_.upload(c.model_shard, own.data());  // the model keeps no copy (FSDP optim_grads_params)
  } else {
    std::vector<float> copy = values;  // the model's copy may be longer than the buffer
    copy.resize(static_cast<std::size_t>(b.model_params.cols), 0.0f);
    backend_.upload(b.model_params, copy.data());
  }
  if (c.master.numel() > 0) backend_.upload(c.master, own.data());
}

}  // namespace megatune::executor
