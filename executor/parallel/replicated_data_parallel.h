// ReplicatedDataParallel: Megatron's DistributedDataParallel without the distributed optimizer, as a
// DataParallelStrategy: each bucket of a chunk's gradient buffer is all-reduced over the region's
// data-parallel group (dp x cp; the routed experts' over expert-dp), every rank holds the whole fp32 main
// parameters (the model's) and AdamW moments and applies the same update, so nothing is gathered. Memory per
// parameter with a bf16 model: 2 + 4 + 4 + 8 = 18 bytes (the untied embedding tables keep no bf16 copy).
#pragma once
#include <vector>

#include "executor/parallel/data_parallel.h"

namespace megatune::executor {

class ReplicatedDataParallel final : public DataParallelStrategy {
 public:
  // Every chunk must carry its whole main parameters (DataParallelChunk::main_params).
  ReplicatedDataParallel(Communicator& communicator, std::vector<DataParallelChunk> chunks,
                         const std::vector<std::vector<layouts::GradBucket>>& step_buckets,
                         const DataParallelOptions& options, bool sizing);

  std::vector<float> main_parameters(int chunk) override;
  void set_main_parameters(int chunk, const std::vector<float>& values) override;
  bool shards_optimizer_state() const override { return false; }
};

}  // namespace megatune::executor
