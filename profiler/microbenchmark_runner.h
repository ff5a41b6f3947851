// The interfaces the profiling session drives: a KernelRunner times GEMMs, attention and memory-bound
// kernels on one device; a CollectiveRunner times NCCL collectives with its peers (one process per GPU).
// Times are device times read from a Tracer, one sample per repeat. Implementations: the CUDA runners in
// profiler/cuda and SyntheticDevice (a roofline model, for tests and dry runs).
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "profiler/sweep_items.h"

namespace megatune::profiler {

struct RepeatPolicy {
  int warmup = 3;    // untimed runs first (plan creation, caches, clocks)
  int repeats = 10;  // timed runs; their median is stored
};

// Samples in seconds, or nullopt when the executor has no kernel for the item (unsupported head dim,
// a kind the build does not have): the session counts those as unsupported and stores nothing.
using TimingSamples = std::optional<std::vector<double>>;

class KernelRunner {
 public:
  virtual ~KernelRunner() = default;
  virtual TimingSamples time_gemm(const GemmItem& item, const RepeatPolicy& policy) = 0;
  virtual TimingSamples time_attention(const AttentionItem& item, const RepeatPolicy& policy) = 0;
  virtual TimingSamples time_memory_bound(const MemoryBoundItem& item, const RepeatPolicy& policy) = 0;
};

class CollectiveRunner {
 public:
  virtual ~CollectiveRunner() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Every rank calls this for the same items in the same order. Ranks outside the item's group (rank >=
  // group_size) take part in nothing but still return. Returns the samples of this rank (nullopt outside
  // the group).
  virtual TimingSamples time_collective(const CollectiveItem& item, const RepeatPolicy& policy) = 0;
};

}  // namespace megatune::profiler
