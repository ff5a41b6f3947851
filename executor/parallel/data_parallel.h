// DataParallelStrategy: how the data-parallel ranks of a model share its training state, as Megatron's
// DistributedDataParallel and optimizer do: each model chunk's gradient buckets and their reduction over the
// data-parallel group (dp x cp; the routed experts' over expert-dp), the fp32 main parameters and AdamW
// moments this rank holds, its part of the global gradient norm, the update, and the gathers of updated
// parameters, each waited in a forward pre-hook where the model first reads them.
// Implementations: ReplicatedDataParallel (DDP: all-reduce, every rank holds and updates everything) and
// DistributedOptimizer (--use-distributed-optimizer: reduce-scatter, each rank holds and updates its shard,
// then the model-dtype parameters are all-gathered) and FsdpDataParallel (Megatron FSDP: optim and
// optim_grads as the distributed optimizer; optim_grads_params also gathers each segment's parameters in
// the forward pre-hook and again before the segment's backward).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "executor/backend/backend.h"
#include "executor/kernels/adamw_hyper.h"
#include "executor/parallel/communicator.h"
#include "executor/parallel/grad_buckets.h"
#include "executor/parallel/grad_norm.h"
#include "executor/parallel/gradient_reducer.h"
#include "executor/parallel/parameter_residence.h"
#include "executor/parallel/state_labels.h"
#include "layouts/recompute_plan.h"
#include "layouts/step_program.h"

namespace megatune::executor {

// What a strategy needs of one model chunk: its two gradient-buffer regions and its flat buffers.
struct DataParallelChunk {
  const GradBufferLayout* expert_buffer = nullptr;  // elements [0, its total) (null: no routed experts)
  const GradBufferLayout* dense_buffer = nullptr;   // the elements after the experts'
  Tensor grads;                                     // (1, total) fp32
  // (1, <= total) model dtype: the weights the model computes with. Under DDP the untied embedding tables
  // may be left out of a bf16 copy (the model reads them from main_params).
  Tensor model_params;
  // (1, total) fp32: the whole main parameters when the model keeps them (DDP; the model params themselves
  // in fp32); empty when the strategy keeps its own.
  Tensor main_params;
  // FSDP optim_grads_params with a model that keeps no compute-dtype copy (model_params then has no
  // storage): the strategy holds this rank's shard of the parameters and places each gathered bucket here.
  ParameterResidence* residence = nullptr;
  // With a residence: the chunk's tied LM head reads the word embedding, whose entry (code -1) then stays
  // gathered and placed from its first gather through the step.
  bool head_reads_embedding = false;
  // FSDP optim_grads / optim_grads_params with a model that keeps no gradient buffer (grads then has no
  // storage): the strategy holds this rank's fp32 shard of each bucket and places a whole-bucket slot here
  // while the bucket's gradients are written.
  GradientResidence* gradient_residence = nullptr;
  // With a gradient residence: the first element of the LM head's weight (its gradient GEMMs run in the
  // forward of the head's segment); -1 without a head.
  std::int64_t head_weight_offset = -1;
  std::int64_t total_elements() const;
};

struct DataParallelOptions {
  bool overlap_grad_reduce = false;   // --overlap-grad-reduce: buckets launched at the walker's points
  bool overlap_param_gather = false;  // --overlap-param-gather: a bucket's gather is waited where it is read
  // Megatron FSDP's sharding strategy when it runs (--use-megatron-fsdp, --use-torch-fsdp2); unset: DDP or
  // the distributed optimizer. no_shard runs as DDP.
  std::optional<layouts::DataParallelSharding> fsdp;
  // FSDP optim_grads_params with DataParallelChunk::residence: the slots for gathered entries (a layer's
  // parameters, GradBufferEntry::group), each of the largest entry's size (layouts::fsdp_gathered_entries:
  // Megatron's entry in use and prefetched next one, a recompute unit's layers during its re-run, the
  // embedding a tied head keeps). The executor gathers an entry when it is used, without prefetching the
  // next: the second slot holds the tied head's embedding or a unit's other layer, else it stays free.
  int gathered_entries_in_use = 2;
  // FSDP optim_grads / optim_grads_params with DataParallelChunk::gradient_residence: the whole-bucket fp32
  // gradient slots, each of the largest bucket's size (layouts::kFsdpGradientBucketsInFlight).
  int gradient_buckets_in_flight = layouts::kFsdpGradientBucketsInFlight;
};

// The ranges of a chunk's buffer this rank updates: elements [begin, end) (absolute) of bucket `bucket` of
// region `region`, held at [state_offset, state_offset + end - begin) of the optimizer state.
struct OwnedRange {
  int region = 0, bucket = 0;
  std::int64_t begin = 0, end = 0;
  std::int64_t state_offset = 0;
};

class DataParallelStrategy {
 public:
  virtual ~DataParallelStrategy() = default;
  DataParallelStrategy(const DataParallelStrategy&) = delete;
  DataParallelStrategy& operator=(const DataParallelStrategy&) = delete;

  // ---- gradients
  // Launches the reduction of bucket `step_bucket` (an index into the walker's RankStep::buckets[chunk]).
  virtual void launch_bucket(int chunk, int step_bucket);
  // Launches every bucket not yet launched and waits for all: the reduced gradients are in place (the
  // whole buffer, or this rank's shard of every bucket).
  virtual void finish_grad_reduction();
  // After gather_reduced_grads(chunk, begin, numel, ...): those gradients whole, to be summed in place (the
  // tied embedding's copies over kEmbedding); end_gathered_grads(chunk) then keeps what this rank holds of
  // them. The chunk's buffer by default; FSDP's sharded gradients gather the bucket into a slot instead.
  virtual Tensor gathered_grads(int chunk, std::int64_t begin, std::int64_t numel);
  virtual void end_gathered_grads(int chunk);
  // After finish_grad_reduction(): where this rank holds reduced gradients of elements [begin, begin +
  // numel): the whole range, or under FSDP's sharded gradients the parts of it in this rank's shards (every
  // rank of a tensor-parallel group holds the same parts).
  virtual std::vector<Tensor> reduced_grad_pieces(int chunk, std::int64_t begin, std::int64_t numel) const;
  // After finish_grad_reduction(): the reduced gradients of elements [begin, begin + numel) of the chunk's
  // buffer whole on this rank (a sharded strategy all-gathers the buckets holding them, recorded as `tag`).
  virtual void gather_reduced_grads(int chunk, std::int64_t begin, std::int64_t numel, const OpTag& tag);

  // ---- the update
  // The global gradient norm (each element of the model counted once over the world); clipping and the
  // skip on a non-finite norm follow it.
  float grad_norm();
  float local_grad_norm() const { return norm_.local_norm(); }  // this rank's part of the last grad_norm()
  // AdamW over the ranges this rank owns ("adamw", phase kOptimizer).
  void step(const AdamWHyper& hyper);

  // ---- parameters
  // After step(): the updated parameters of bucket `step_bucket` to every rank that reads them.
  void gather_params(int chunk, int step_bucket);
  void gather_all_params();  // every bucket of every chunk (a step without the walker's gather items)
  // Forward pre-hook: the model is about to read the parameters of `group` (GradBufferEntry::group) of
  // `chunk`; a gather still in flight for them is waited here.
  virtual void before_forward(int chunk, int group);
  // Before the forward segment `group` of a training pass (not an evaluation): the gradients it writes (the
  // LM head's weight gradient) have their place (FSDP's sharded gradients place the head's bucket's slot).
  virtual void prepare_forward_gradients(int chunk, int group);
  // Backward pre-hook: the backward of parameter entry `layer_code`
  // (layouts::StageParameters::layer_reverse's codes, GradBufferEntry::group) of `chunk` is about to run
  // (FSDP optim_grads_params gathers it here).
  virtual void before_backward(int chunk, int layer_code);
  // Whether the parameters are gathered around each use (the trainer then runs each backward entry by
  // entry, calling before_backward before each).
  virtual bool gathers_parameters_at_use() const { return false; }
  // Whether the trainer runs each backward entry by entry between before_backward and after_backward (the
  // parameters gathered at use, or FSDP's gradients reduce-scattered after each bucket's backward).
  virtual bool runs_backward_by_entry() const { return gathers_parameters_at_use(); }
  // After the forward segment of `group` and after the backward of entry `layer_code` (with the recompute
  // re-run it needed): the parameters gathered for them may be released.
  virtual void after_forward(int chunk, int group);
  virtual void after_backward(int chunk, int layer_code);
  virtual void wait_params();  // every gather in flight

  // ---- training state (checkpoints)
  // The chunk's fp32 main parameters, whole (buffer order, padding zero). A sharded strategy gathers them
  // over the data-parallel group: every rank of the group calls it together.
  virtual std::vector<float> main_parameters(int chunk) = 0;
  // Sets the chunk's parameters from whole fp32 values: the model's copy, its whole main parameters when it
  // keeps them, and this rank's main-parameter shard.
  virtual void set_main_parameters(int chunk, const std::vector<float>& values) = 0;
  virtual bool shards_optimizer_state() const = 0;
  struct Moments {
    std::vector<float> exp_avg, exp_avg_sq;  // over the owned ranges, back to back
  };
  Moments moments(int chunk) const;
  void set_moments(int chunk, const Moments& moments);
  // From whole-buffer moments: this rank's owned ranges of them.
  void set_moments_from_whole(int chunk, const Moments& whole);
  const std::vector<OwnedRange>& owned_ranges(int chunk) const { return chunks_.at(chunk).owned; }
  std::int64_t owned_elements(int chunk) const { return chunks_.at(chunk).owned_elements; }
  int num_chunks() const { return static_cast<int>(chunks_.size()); }

 protected:
  struct Region {
    bool expert = false;
    CommGroup group = CommGroup::kDataContext;  // the group its buckets are reduced over
    std::int64_t base = 0;                      // its first element in the chunk's buffers
    const GradBufferLayout* buffer = nullptr;   // offsets relative to base
    std::unique_ptr<GradientReducer> reducer;   // null in the sizing pass
  };
  struct Chunk {
    DataParallelChunk buffers;
    std::vector<Region> regions;  // the experts' (when there is one) first, as in the buffers
    std::vector<OwnedRange> owned;
    std::int64_t owned_elements = 0;
    std::vector<std::pair<int, int>> step_buckets;  // the walker's buckets as (region, bucket)
    // (1, owned elements) fp32: the main parameters when the chunk has no whole ones, and the moments.
    Tensor master, exp_avg, exp_avg_sq;
    // (1, owned elements) compute dtype: this rank's shard of the model's parameters when the model keeps
    // none (DataParallelChunk::residence); empty otherwise.
    Tensor model_shard;
    // (1, owned elements) fp32: this rank's shard of the reduced gradients when the model keeps no buffer
    // (DataParallelChunk::gradient_residence); empty otherwise.
    Tensor grad_shard;
  };

  // Lays out the chunks' regions and the ranges this rank owns (whole buckets, or with
  // `shard_optimizer_state` its shard of each), allocates the main-parameter shards a chunk without whole
  // main parameters needs and the moments; when not sizing, builds the reducers (all-reduce or
  // reduce-scatter), zeroes the moments and registers the optimizer's tensors with the backend.
  DataParallelStrategy(Communicator& communicator, std::vector<DataParallelChunk> chunks,
                       const std::vector<std::vector<layouts::GradBucket>>& step_buckets,
                       const DataParallelOptions& options, bool shard_optimizer_state, bool sizing);

  const Region& region_of_step_bucket(int chunk, int step_bucket, int* bucket) const;
  // The owned ranges of whole-buffer values, back to back (the layout of the chunk's state tensors).
  std::vector<float> owned_values(int chunk, const std::vector<float>& whole) const;
  // gather_params of bucket `bucket` of region `region` (nothing to gather by default).
  virtual void gather_bucket(int chunk, int region, int bucket);

  Communicator& communicator_;
  Backend& backend_;
  DataParallelOptions options_;
  std::vector<Chunk> chunks_;

 private:
  void add_region(Chunk& chunk, bool expert, const GradBufferLayout& buffer, std::int64_t base, bool sizing);
  std::vector<OptimizerTensor> optimizer_tensors() const;
  void map_step_buckets(Chunk& chunk, const std::vector<layouts::GradBucket>& buckets);

  bool shard_;
  GlobalGradNorm norm_;
};

// The strategy the flags pick: FsdpDataParallel for a sharded options.fsdp strategy, DistributedOptimizer
// with --use-distributed-optimizer, else ReplicatedDataParallel. `step_buckets[c]`: the walker's buckets of
// chunk c (may be empty: a run without the walker, whose buckets are launched by finish_grad_reduction()).
// Run it in the sizing pass and for real, like the model.
std::unique_ptr<DataParallelStrategy> make_data_parallel_strategy(
    bool distributed_optimizer, Communicator& communicator, std::vector<DataParallelChunk> chunks,
    const std::vector<std::vector<layouts::GradBucket>>& step_buckets, const DataParallelOptions& options,
    bool sizing);

}  // namespace megatune::executor
