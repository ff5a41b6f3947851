// DistributedOptimizer: Megatron's --use-distributed-optimizer as a DataParallelStrategy. Each bucket of a
// chunk's gradient buffer (padded to lcm(group size, 128) elements) splits into equal shards over the
// region's data-parallel group (dp x cp; the routed experts' over expert-dp); the gradients are
// reduce-scattered into this rank's shard, this rank holds the fp32 main parameters and AdamW moments of its
// shard only and updates them, and the updated model-dtype parameters are all-gathered bucket by bucket
// ("param_ag" / "expert_param_ag"). With --overlap-param-gather a bucket's gather is waited in the forward
// pre-hook of the first parameters it holds. Memory per parameter with a bf16 model: 2 (bf16 parameters) +
// 4 (fp32 gradients) + 12 / d (fp32 main parameters and moments), Megatron's 6 + 12/d; an fp32 model's
// parameters are its main parameters (8 + 8/d).
#pragma once
#include <map>
#include <vector>

#include "executor/parallel/data_parallel.h"

namespace megatune::executor {

class DistributedOptimizer : public DataParallelStrategy {
 public:
  DistributedOptimizer(Communicator& communicator, std::vector<DataParallelChunk> chunks,
                       const std::vector<std::vector<layouts::GradBucket>>& step_buckets,
                       const DataParallelOptions& options, bool sizing);

  void gather_reduced_grads(int chunk, std::int64_t begin, std::int64_t numel, const OpTag& tag) override;
  void before_forward(int chunk, int group) override;
  void wait_params() override;
  // Gathers the main-parameter shards through the chunk's gradient buffer (which holds nothing live between
  // iterations: zero_gradients and the first weight-gradient GEMMs of the next one overwrite it).
  std::vector<float> main_parameters(int chunk) override;
  void set_main_parameters(int chunk, const std::vector<float>& values) override;
  bool shards_optimizer_state() const override { return true; }

 protected:
  void gather_bucket(int chunk, int region, int bucket) override;

  // The all-gather of owned range `o` of `source` (a (1, total) buffer, or with from_state the chunk's
  // (1, owned) state tensor) into its bucket of `target` (1, total).
  CommHandle gather_range(int chunk, const OwnedRange& o, Tensor source, bool from_state, Tensor target,
                          const OpTag& tag);

 private:
  // Per chunk, per region, per bucket: a param gather in flight.
  std::vector<std::vector<std::vector<CommHandle>>> gathers_;
  // Per chunk, per region: the first bucket holding each entry group.
  std::vector<std::vector<std::map<int, int>>> first_bucket_of_group_;
};

}  // namespace megatune::executor
