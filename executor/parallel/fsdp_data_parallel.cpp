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
  lay_out_grad_slots(options);
}

void FsdpDataParallel::lay_out_grad_slots(const DataParallelOptions& options) {
  std::int64_t slot_elements = 0;
  for (int c = 0; c < num_chunks(); ++c) {
    std::vector<std::vector<char>>& written = shard_written_.emplace_back();
    for (const Region& r : chunks_[c].regions) {
      written.emplace_back(r.buffer->buckets().size(), 0);
      if (!sharded_grads(c)) continue;
      shard_gradients_ = true;
      for (const GradBucketRange& b : r.buffer->buckets()) slot_elements = std::max(slot_elements, b.numel());
    }
  }
  if (!shard_gradients_ || slot_elements == 0) return;
  for (int s = 0; s < std::max(1, options.gradient_buckets_in_flight); ++s)
    grad_slots_.push_back({backend_.allocate(DType::kFP32, 1, slot_elements, state_label::kMainGrads)});
}

int FsdpDataParallel::bucket_of_code(int chunk, int region, int layer_code) const {
  const GradBufferLayout& buffer = *chunks_.at(chunk).regions.at(region).buffer;
  for (int e = 0; e < static_cast<int>(buffer.entries().size()); ++e)
    if (buffer.entries()[e].group == layer_code) return buffer.bucket_of(e);
  return -1;
}

FsdpDataParallel::GradSlot* FsdpDataParallel::held_grad_slot(int chunk, int region, int bucket) {
  for (GradSlot& s : grad_slots_)
    if (s.chunk == chunk && s.region == region && s.bucket == bucket) return &s;
  return nullptr;
}

FsdpDataParallel::GradSlot& FsdpDataParallel::free_grad_slot(const char* why) {
  for (GradSlot& s : grad_slots_)
    if (s.chunk < 0) return s;
  throw std::logic_error(std::string("FSDP sharded gradients: more than ") +
                         std::to_string(grad_slots_.size()) +
                         " whole-bucket gradient slots in use at once (" + why + ")");
}

const OwnedRange& FsdpDataParallel::owned_range(int chunk, int region, int bucket) const {
  const Chunk& c = chunks_.at(chunk);
  const auto o = std::find_if(c.owned.begin(), c.owned.end(),
                              [&](const OwnedRange& x) { return x.region == region && x.bucket == bucket; });
  if (o == c.owned.end()) throw std::logic_error("FSDP: no owned range of bucket " + std::to_string(bucket));
  return *o;
}

void FsdpDataParallel::open_grad_bucket(int chunk, int region, int bucket) {
  if (bucket < 0 || held_grad_slot(chunk, region, bucket) != nullptr) return;
  GradSlot& slot = free_grad_slot("a bucket's gradients");
  const Region& r = chunks_[chunk].regions[region];
  const GradBucketRange& range = r.buffer->buckets()[bucket];
  const Tensor storage = flat_range(backend_, slot.storage, 0, range.numel());
  backend_.fill_zero(storage);
  chunks_[chunk].buffers.gradient_residence->place_gradients(r.base + range.begin, r.base + range.end,
                                                             storage);
  slot.chunk = chunk;
  slot.region = region;
  slot.bucket = bucket;
}

void FsdpDataParallel::reduce_grad_bucket(int chunk, int region, int bucket) {
  GradSlot* slot = held_grad_slot(chunk, region, bucket);
  if (slot == nullptr)
    throw std::logic_error("FSDP: bucket " + std::to_string(bucket) + " completed without its gradient slot");
  const Chunk& c = chunks_[chunk];
  const Region& r = c.regions[region];
  const GradBucketRange& range = r.buffer->buckets()[bucket];
  const OwnedRange& o = owned_range(chunk, region, bucket);
  const int size = communicator_.size(r.group);
  const std::int64_t n = o.end - o.begin;
  const OpTag tag = r.expert ? OpTag{"expert_grad_bucket", -1, OpPhase::kGradSync, OpRole::kExpertGradReduce}
                             : OpTag{"grad_bucket", -1, OpPhase::kGradSync, OpRole::kGradReduce};
  const Tensor input = flat_range(backend_, slot->storage, 0, range.numel(), size);
  const Tensor shard = flat_range(backend_, c.grad_shard, o.state_offset, n);
  char& written = shard_written_[chunk][region][bucket];
  if (!written) {  // the first micro-batch's sum is the shard
    CommHandle h = communicator_.reduce_scatter_async(r.group, input, shard, tag);
    if (h) h->wait();
  } else {  // reduced in place in the slot, then added into the shard
    const Tensor reduced = flat_range(backend_, slot->storage, o.begin - (r.base + range.begin), n);
    CommHandle h = communicator_.reduce_scatter_async(r.group, input, reduced, tag);
    if (h) h->wait();
    const OpTag add{"fsdp_grad_accumulate", -1, OpPhase::kGradSync};
    if (size > 1) {
      backend_.add(shard, reduced, shard, add);
    } else {  // a group of one has no bucket in the step program
      RecordingPause pause(backend_);
      backend_.add(shard, reduced, shard, add);
    }
  }
  written = 1;
  c.buffers.gradient_residence->release_gradients(r.base + range.begin);
  slot->chunk = -1;
}

void FsdpDataParallel::launch_bucket(int chunk, int step_bucket) {
  if (!sharded_grads(chunk)) DistributedOptimizer::launch_bucket(chunk, step_bucket);
}

void FsdpDataParallel::finish_grad_reduction() {
  DistributedOptimizer::finish_grad_reduction();
  for (const GradSlot& s : grad_slots_)
    if (s.chunk >= 0)
      throw std::logic_error("FSDP: bucket " + std::to_string(s.bucket) + " of chunk " +
                             std::to_string(s.chunk) + " still holds unreduced gradients after the backward");
  for (int c = 0; c < num_chunks(); ++c)
    for (std::size_t r = 0; r < shard_written_[c].size(); ++r)
      for (std::size_t b = 0; b < shard_written_[c][r].size(); ++b) {
        // A bucket no backward wrote this iteration holds zero gradients.
        if (sharded_grads(c) && !shard_written_[c][r][b]) {
          const OwnedRange& o = owned_range(c, static_cast<int>(r), static_cast<int>(b));
          backend_.fill_zero(flat_range(backend_, chunks_[c].grad_shard, o.state_offset, o.end - o.begin));
        }
        shard_written_[c][r][b] = 0;
      }
}

void FsdpDataParallel::gather_reduced_grads(int chunk, std::int64_t begin, std::int64_t numel,
                                            const OpTag& tag) {
  if (!sharded_grads(chunk)) return DistributedOptimizer::gather_reduced_grads(chunk, begin, numel, tag);
  if (gathered_.chunk >= 0) throw std::logic_error("FSDP: gathered gradients not ended");
  // The bucket holding the range, gathered whole into a slot (the range lies in one bucket: a bucket
  // holds whole entries).
  const Chunk& c = chunks_.at(chunk);
  for (const OwnedRange& o : c.owned) {
    const Region& r = c.regions[o.region];
    const GradBucketRange& range = r.buffer->buckets()[o.bucket];
    if (begin < r.base + range.begin || begin + numel > r.base + range.end) continue;
    GradSlot& slot = free_grad_slot("a shared gradient's bucket");
    slot.chunk = chunk;  // held until end_gathered_grads
    slot.region = o.region;
    slot.bucket = -1;
    CommHandle h = communicator_.all_gather_async(
        r.group, flat_range(backend_, c.grad_shard, o.state_offset, o.end - o.begin),
        flat_range(backend_, slot.storage, 0, range.numel(), communicator_.size(r.group)), tag);
    if (h) h->wait();
    gathered_ = {chunk, o.region, o.bucket, &slot};
    return;
  }
  throw std::logic_error("FSDP: gradients [" + std::to_string(begin) + ", +" + std::to_string(numel) +
                         ") span gradient buckets");
}

Tensor FsdpDataParallel::gathered_grads(int chunk, std::int64_t begin, std::int64_t numel) {
  if (!sharded_grads(chunk)) return DistributedOptimizer::gathered_grads(chunk, begin, numel);
  if (gathered_.chunk != chunk) throw std::logic_error("FSDP: gathered_grads before gather_reduced_grads");
  const Region& r = chunks_[chunk].regions[gathered_.region];
  return flat_range(backend_, gathered_.slot->storage,
                    begin - (r.base + r.buffer->buckets()[gathered_.bucket].begin), numel);
}

void FsdpDataParallel::end_gathered_grads(int chunk) {
  if (!sharded_grads(chunk)) return;
  if (gathered_.chunk != chunk) throw std::logic_error("FSDP: end_gathered_grads without a gather");
  const Region& r = chunks_[chunk].regions[gathered_.region];
  const OwnedRange& o = owned_range(chunk, gathered_.region, gathered_.bucket);
  const std::int64_t bucket_begin = r.base + r.buffer->buckets()[gathered_.bucket].begin;
  backend_.copy(flat_range(backend_, gathered_.slot->storage, o.begin - bucket_begin, o.end - o.begin),
                flat_range(backend_, chunks_[chunk].grad_shard, o.state_offset, o.end - o.begin));
  gathered_.slot->chunk = -1;
  gathered_ = {};
}

void FsdpDataParallel::prepare_forward_gradients(int chunk, int group) {
  // The LM head's weight-gradient GEMMs run in the forward of its segment: its bucket's slot from here.
  const DataParallelChunk& b = chunks_.at(chunk).buffers;
  if (!sharded_grads(chunk) || group != -2 || b.head_weight_offset < 0) return;
  for (int r = 0; r < static_cast<int>(chunks_[chunk].regions.size()); ++r) {
    const Region& region = chunks_[chunk].regions[r];
    const std::vector<GradBucketRange>& buckets = region.buffer->buckets();
    for (int k = 0; k < static_cast<int>(buckets.size()); ++k)
      if (b.head_weight_offset >= region.base + buckets[k].begin &&
          b.head_weight_offset < region.base + buckets[k].end)
        open_grad_bucket(chunk, r, k);
  }
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
  if (shard_parameters_)
    for (const BucketRef& ref : buckets_.at(chunk))
      if (ref.layer_code == layer_code) gather_at_use(chunk, ref, OpPhase::kBackward);
  if (!sharded_grads(chunk)) return;
  for (int r = 0; r < static_cast<int>(chunks_[chunk].regions.size()); ++r)
    open_grad_bucket(chunk, r, bucket_of_code(chunk, r, layer_code));
}

void FsdpDataParallel::after_forward(int, int) { release_slots(); }

void FsdpDataParallel::after_backward(int chunk, int layer_code) {
  release_slots();
  if (!sharded_grads(chunk)) return;
  // As the walker's ready points (layouts::grad_sync_buckets): a bucket that reached the bucket size is
  // complete after the backward of its last entry (buffer order = backward order), a region's last one short
  // of it after the chunk's last entry (the dense region's last); the dense region's first.
  const std::vector<Region>& regions = chunks_[chunk].regions;
  const bool last_entry = regions.back().buffer->entries().back().group == layer_code;
  for (int r = static_cast<int>(regions.size()); r-- > 0;) {
    const GradBufferLayout& buffer = *regions[r].buffer;
    const int last = static_cast<int>(buffer.buckets().size()) - 1;
    const bool short_last = buffer.buckets()[last].parameter_elements < buffer.bucket_size_limit();
    const int bucket = bucket_of_code(chunk, r, layer_code);
    if (bucket >= 0 && !(bucket == last && short_last) &&
        buffer.entries()[buffer.buckets()[bucket].end_entry - 1].group == layer_code)
      reduce_grad_bucket(chunk, r, bucket);
    if (last_entry && short_last && held_grad_slot(chunk, r, last) != nullptr)
      reduce_grad_bucket(chunk, r, last);
  }
}

std::vector<float> FsdpDataParallel::main_parameters(int chunk) {
  const Chunk& c = chunks_.at(chunk);
  if (shard_parameters_ && c.master.numel() == 0) {
    RecordingPause pause(backend_);
    for (const BucketRef& ref : buckets_.at(chunk)) gather_at_use(chunk, ref, OpPhase::kOptimizer);
  }
  if (!sharded_grads(chunk) || c.buffers.main_params.numel() > 0)
    return DistributedOptimizer::main_parameters(chunk);
  // No whole gradient buffer to gather through: bucket by bucket through a gradient slot (not a
  // step-program op).
  wait_params();
  RecordingPause pause(backend_);
  std::vector<float> host(static_cast<std::size_t>(c.buffers.total_elements()), 0.0f);
  GradSlot& slot = free_grad_slot("gathering the main parameters");
  for (const OwnedRange& o : c.owned) {
    const Region& r = c.regions[o.region];
    const GradBucketRange& range = r.buffer->buckets()[o.bucket];
    CommHandle h = communicator_.all_gather_async(
        r.group, flat_range(backend_, c.master, o.state_offset, o.end - o.begin),
        flat_range(backend_, slot.storage, 0, range.numel(), communicator_.size(r.group)),
        {"main_param_ag", -1, OpPhase::kOptimizer, OpRole::kParamGather});
    if (h) h->wait();
    std::vector<float> bucket(static_cast<std::size_t>(range.numel()));
    backend_.download(flat_range(backend_, slot.storage, 0, range.numel()), bucket.data());
    std::copy(bucket.begin(), bucket.end(), host.begin() + (r.base + range.begin));
  }
  return host;
}

void FsdpDataParallel::gather_bucket(int chunk, int region, int bucket) {
  if (!shard_parameters_) DistributedOptimizer::gather_bucket(chunk, region, bucket);
}

}  // namespace megatune::executor
