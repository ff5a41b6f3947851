// Running a profile on the GPUs of this host: one forked worker process per GPU (CUDA is never touched in
// the parent before forking). Rank 0 creates the NCCL unique id and hands it to the others through pipes;
// all ranks run the collective sweep together (rank 0 writes it), then share the kernel sweep round-robin,
// each writing its own rows to the one database (every write in its own transaction; SQLite's busy
// timeout queues the writers). Workers report progress to the parent, which draws the bar.
#pragma once
#include <string>
#include <vector>

#include "profiler/profile_session.h"

namespace megatune::profiler::cuda {

// The identity of GPU 0 and the number of GPUs, read in a short-lived child process so the caller stays
// free to fork workers. Throws std::runtime_error when no GPU is visible or CUDA fails.
struct HostGpus {
  DeviceIdentity identity;
  int count = 0;
};
HostGpus probe_host_gpus();

struct GpuProfileJob {
  std::string database_path;
  Sweep sweep;  // the pending items (pending_items against the identity from probe_host_gpus)
  int gpus = 1;
  RepeatPolicy kernel_policy;
  RepeatPolicy collective_policy{5, 20};
};

struct GpuProfileOutcome {
  ProfileCounts kernels;
  ProfileCounts collectives;
  std::vector<std::string> errors;  // one line per failed worker
  double wall_s = 0;
};

// Forks `job.gpus` workers and waits for them; `progress` is called in the parent with the items done.
GpuProfileOutcome run_gpu_profile(const GpuProfileJob& job, const ProgressCallback& progress);

}  // namespace megatune::profiler::cuda
