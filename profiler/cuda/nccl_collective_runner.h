// NcclCollectiveRunner: one process per GPU times NCCL collectives (bf16) over groups of the first
// group_size ranks (sub-communicators split from the world communicator on first use). Sizes follow
// nccl-tests: all-reduce, all-to-all, send/recv (ring: to rank+1, from rank-1) and broadcast move `bytes`
// per rank; all-gather's `bytes` is the gathered output and reduce-scatter's the full input.
// time_collective() reads each repeat's device time from the Tracer; event_timed_seconds() is the
// nccl-tests-style CUDA-event loop the checks compare it against.
#pragma once
#include <cuda_runtime.h>
#include <nccl.h>

#include <map>

#include "profiler/cuda/device_arena.h"
#include "profiler/microbenchmark_runner.h"
#include "profiler/tracer.h"

namespace megatune::profiler::cuda {

class NcclCollectiveRunner : public CollectiveRunner {
 public:
  // Collective: every rank constructs with the same id (ncclGetUniqueId on rank 0, shared by the caller).
  // The current CUDA device must be this rank's GPU.
  NcclCollectiveRunner(Tracer& tracer, int rank, int world_size, const ncclUniqueId& id,
                       cudaStream_t stream = nullptr, std::uint64_t first_range_id = std::uint64_t(1) << 48);
  ~NcclCollectiveRunner() override;
  NcclCollectiveRunner(const NcclCollectiveRunner&) = delete;
  NcclCollectiveRunner& operator=(const NcclCollectiveRunner&) = delete;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  TimingSamples time_collective(const CollectiveItem& item, const RepeatPolicy& policy) override;

  // Mean seconds per collective of `iterations` back-to-back calls between two CUDA events, after
  // `warmup` calls (nullopt outside the group). Every rank calls it.
  std::optional<double> event_timed_seconds(const CollectiveItem& item, int warmup, int iterations);

  // A world all-reduce of one element and a stream synchronize: lines the ranks up before a timing loop.
  void barrier();

 private:
  struct Buffers {
    void* send = nullptr;
    void* recv = nullptr;
  };
  ncclComm_t comm_for(int group_size);  // collective over the world communicator on first use
  Buffers prepare(const CollectiveItem& item);
  void launch(const CollectiveItem& item, ncclComm_t comm, const Buffers& buffers);

  Tracer& tracer_;
  int rank_;
  int world_size_;
  cudaStream_t stream_;
  std::uint64_t next_range_id_;
  ncclComm_t world_ = nullptr;
  std::map<int, ncclComm_t> groups_;  // group size -> communicator (null on ranks outside the group)
  DeviceArena arena_;
  std::uint64_t fill_seed_ = 1;
};

}  // namespace megatune::profiler::cuda
