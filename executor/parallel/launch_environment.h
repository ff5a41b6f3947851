// LaunchEnvironment: this process's rank, world size, local rank and rendezvous address, read from the
// environment of the usual launchers (torchrun, Slurm, Open MPI, `megatune train --nproc`), through an
// injectable lookup so tests fake environments.
#pragma once
#include <functional>
#include <optional>
#include <string>

namespace megatune::executor {

// Where this process stands in a multi-process job. A process started by no launcher is rank 0 of 1.
struct LaunchEnvironment {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;             // the GPU index on this host
  std::string master_addr;        // rank 0's host (empty for a single process)
  int master_port = 0;            // rank 0's rendezvous port (0 for a single process)
  std::string launcher = "none";  // "torchrun", "slurm", "openmpi" or "none"
  // The variables the values came from, for messages ("RANK=3 WORLD_SIZE=4 (torchrun)").
  std::string describe() const;
  bool single_process() const { return world_size == 1; }
};

// Reads one environment variable: nullopt when unset. An empty value counts as set (and is rejected).
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;
EnvLookup process_environment();  // getenv

// The launcher is recognised by its rank variable, in this order: torchrun (RANK, WORLD_SIZE, LOCAL_RANK,
// MASTER_ADDR, MASTER_PORT), Slurm (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID with MASTER_ADDR /
// MASTER_PORT), Open MPI (OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK with MASTER_ADDR / MASTER_PORT).
// torchrun's variables win over Slurm's and Open MPI's (torchrun started inside an allocation). A rank
// variable without its world-size partner, a non-integer, a rank or local rank outside [0, world size),
// or a multi-process job without MASTER_ADDR / MASTER_PORT throws a UserError naming the
// variable and the fix.
LaunchEnvironment read_launch_environment(const EnvLookup& env = process_environment());

// Throws a UserError when the launcher started a different number of processes than the layout needs
// (`layout_world_size`: --world-size, or tp * cp * pp * dp).
void check_layout_world_size(const LaunchEnvironment& launch, int layout_world_size);

// The CPU backend runs every rank of a layout as a thread of one process; a process a launcher started as
// one of several would train the whole layout alone, beside its copies. Throws a UserError naming the
// launcher's variables and the fix (one process with --nproc N, or --device cuda) for such a process.
void require_single_process_for_cpu(const LaunchEnvironment& launch);

}  // namespace megatune::executor
