// A profiling session: which sweep items the database lacks for this GPU and software (resumption), and
// running them through a runner into the database, each measurement committed in its own transaction so
// several processes can share one file and an interrupted run loses at most the item in flight.
#pragma once
#include <cstddef>
#include <functional>
#include <string>

#include "cost_models/records.h"
#include "cost_models/sqlite_database.h"
#include "profiler/microbenchmark_runner.h"
#include "profiler/sweep_items.h"

namespace megatune::profiler {

// What a measurement is attributed to.
struct DeviceIdentity {
  std::string gpu;           // gpu_models.name ("H200 SXM")
  std::string interconnect;  // interconnects.name of the intra-node fabric ("NVLink4"), "" when unknown
  cost_models::SoftwareVersions versions;
};

// The items of `sweep` that `database` holds no measurement of for `identity` (same GPU and the same
// driver, CUDA, cuBLAS, NCCL and commit).
Sweep pending_items(cost_models::Database& database, const Sweep& sweep, const DeviceIdentity& identity);

struct ProfileProgress {
  std::size_t done = 0;
  std::size_t total = 0;
  std::string current;  // describe() of the item just finished
};
using ProgressCallback = std::function<void(const ProfileProgress&)>;

struct ProfileCounts {
  int measured = 0;     // rows written
  int unsupported = 0;  // the runner has no kernel for the item
  ProfileCounts& operator+=(const ProfileCounts& other) {
    measured += other.measured, unsupported += other.unsupported;
    return *this;
  }
};

// Runs the kernel items whose position i in the sweep (gemms, then memory-bound, then attention) has
// i % worker_count == worker_index, writing each to `database`.
ProfileCounts run_kernel_sweep(cost_models::Database& database, KernelRunner& runner, const Sweep& sweep,
                               const DeviceIdentity& identity, const RepeatPolicy& policy,
                               const ProgressCallback& progress = {}, int worker_index = 0,
                               int worker_count = 1);

// Runs every collective item on every rank; rank 0 writes the rows (`database` may be null elsewhere).
ProfileCounts run_collective_sweep(cost_models::Database* database, CollectiveRunner& runner,
                                   const std::vector<CollectiveItem>& items, const DeviceIdentity& identity,
                                   const RepeatPolicy& policy, const ProgressCallback& progress = {});

// nccl-tests' bandwidths of one collective: algbw = bytes / time, busbw = algbw x bus factor.
struct CollectiveBandwidth {
  double algbw_bytes_per_s = 0;
  double busbw_bytes_per_s = 0;
};
CollectiveBandwidth collective_bandwidth(const CollectiveItem& item, double time_s);

}  // namespace megatune::profiler
