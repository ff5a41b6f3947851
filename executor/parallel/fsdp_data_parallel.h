// FsdpDataParallel: Megatron FSDP (--use-megatron-fsdp with --data-parallel-sharding-strategy optim,
// optim_grads or optim_grads_params; --use-torch-fsdp2 runs as optim_grads_params) as a DataParallelStrategy.
// Its optimizer sharding is the distributed optimizer's: each bucket is reduce-scattered over the region's
// data-parallel group (dp x cp; the routed experts' over expert-dp), this rank holds the fp32 main
// parameters and AdamW moments of its shard and updates them. optim and optim_grads then all-gather the
// updated parameters after the step, as DistributedOptimizer does.
// optim_grads and optim_grads_params shard the gradients too (a chunk whose model keeps no gradient buffer:
// DataParallelChunk::gradient_residence): this rank holds the fp32 shard of each bucket's gradients and a
// pool of whole-bucket fp32 slots of the largest bucket's size (DataParallelOptions::
// gradient_buckets_in_flight). As Megatron FSDP's GradReducePipeline, every micro-batch's gradients of a
// bucket are written into a zeroed slot placed before the first pass writing them (the LM head's forward
// segment for the head's bucket, else the backward of the bucket's first entry), the slot is
// reduce-scattered ("grad_bucket", "expert_grad_bucket") right after the backward of the bucket's last
// entry (a region's last bucket short of the bucket size: after the chunk's last entry, the walker's ready
// point), and the reduced shard is added into this rank's gradient shard ("fsdp_grad_accumulate"; the first
// micro-batch's reduce-scatter writes the shard itself); the slot is then free. The gradient norm, clipping
// and AdamW read the shards. optim_grads_params has one bucket per parameter entry (the trainer buckets the
// buffer so) and no gather after the step: AdamW writes this rank's shard of the model-dtype parameters, and
// each bucket is all-gathered ("fsdp_param_ag", "fsdp_expert_param_ag") right before a forward segment reads
// it (before_forward) and again before its entry's backward (before_backward), as Megatron FSDP gathers again
// what it released after the forward. With a bf16 model that keeps no copy (DataParallelChunk::residence)
// this rank holds only its shard of each bucket's parameters and a pool of gathered-entry slots, each the
// size of the largest entry (DataParallelOptions::gathered_entries_in_use of them): a bucket is gathered
// into its entry's slot, placed for the model to read, and the slots are released after each forward
// segment and each backward entry (after_forward, after_backward). Megatron's 2/d bytes per parameter plus
// the entries in flight. A tied LM head beside its embedding keeps the embedding's entry gathered through the
// step (DataParallelChunk::head_reads_embedding). An fp32 model, and a chunk holding MTP layers (which read
// the embedding's and the head's parameters), keep the whole copy the gathers land in.
#pragma once
#include <cstdint>
#include <vector>

#include "executor/parallel/distributed_optimizer.h"

namespace megatune::executor {

class FsdpDataParallel final : public DistributedOptimizer {
 public:
  // options.fsdp: the sharding strategy (optim, optim_grads or optim_grads_params).
  FsdpDataParallel(Communicator& communicator, std::vector<DataParallelChunk> chunks,
                   const std::vector<std::vector<layouts::GradBucket>>& step_buckets,
                   const DataParallelOptions& options, bool sizing);

  void before_forward(int chunk, int group) override;
  void before_backward(int chunk, int layer_code) override;
  void after_forward(int chunk, int group) override;
  void after_backward(int chunk, int layer_code) override;
  void prepare_forward_gradients(int chunk, int group) override;
  bool gathers_parameters_at_use() const override { return shard_parameters_; }
  bool runs_backward_by_entry() const override { return shard_parameters_ || shard_gradients_; }
  void launch_bucket(int chunk, int step_bucket) override;
  void finish_grad_reduction() override;
  void gather_reduced_grads(int chunk, std::int64_t begin, std::int64_t numel, const OpTag& tag) override;
  Tensor gathered_grads(int chunk, std::int64_t begin, std::int64_t numel) override;
  void end_gathered_grads(int chunk) override;
  // optim_grads_params with an fp32 model (whose main parameters are its parameters, whole only around
  // their use): gathers every bucket first (not a step-program op). Every rank of the group calls it.
  std::vector<float> main_parameters(int chunk) override;

 protected:
  void gather_bucket(int chunk, int region, int bucket) override;

 private:
  struct BucketRef {
    int region = 0, bucket = 0;
    int layer_code = 0;            // the entry group its parameters belong to
    std::int64_t slot_offset = 0;  // where it lies in its entry's gathered-entry slot
  };
  struct Slot {
    Tensor storage;                    // (1, the largest entry's bucket elements) compute dtype
    int chunk = -1, layer_code = 0;    // the entry it holds (chunk -1: free)
    std::vector<std::int64_t> placed;  // the first buffer element of each bucket placed from it
  };
  void gather_at_use(int chunk, const BucketRef& ref, layouts::OpPhase phase);
  // Each entry's buckets laid out back to back; the pool's slots when a chunk keeps no copy.
  void lay_out_slots(const DataParallelOptions& options);
  Slot& slot_of(int chunk, int layer_code);
  void release_slots();

  struct GradSlot {
    Tensor storage;                          // (1, the largest bucket's elements) fp32
    int chunk = -1, region = 0, bucket = 0;  // the bucket it holds (chunk -1: free)
  };
  bool sharded_grads(int chunk) const { return chunks_.at(chunk).grad_shard.numel() > 0; }
  void lay_out_grad_slots(const DataParallelOptions& options);
  // The bucket of `region` holding the entries of `layer_code` (-1: none).
  int bucket_of_code(int chunk, int region, int layer_code) const;
  GradSlot* held_grad_slot(int chunk, int region, int bucket);
  GradSlot& free_grad_slot(const char* why);
  // Places a zeroed slot for the bucket's gradients (nothing when one is placed already).
  void open_grad_bucket(int chunk, int region, int bucket);
  // The bucket's slot reduce-scattered and added into this rank's shard; the slot released.
  void reduce_grad_bucket(int chunk, int region, int bucket);
  const OwnedRange& owned_range(int chunk, int region, int bucket) const;

  bool shard_parameters_ = false;
  bool shard_gradients_ = false;
  std::vector<GradSlot> grad_slots_;
  // Per chunk, per region, per bucket: whether its shard holds this iteration's reduced gradients yet.
  std::vector<std::vector<std::vector<char>>> shard_written_;
  // gather_reduced_grads of sharded gradients: the slot holding the gathered bucket, and where its region
  // and bucket lie (chunk -1: none).
  struct Gathered {
    int chunk = -1, region = 0, bucket = 0;
    GradSlot* slot = nullptr;
  } gathered_;
  std::vector<std::vector<BucketRef>> buckets_;  // per chunk, in the walker's (reduction) order
  std::vector<Slot> slots_;
};

}  // namespace megatune::executor
