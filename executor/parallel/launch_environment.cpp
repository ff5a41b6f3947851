// The launchers' environment variables -> LaunchEnvironment, with one clear line for every bad value.
#include "executor/parallel/launch_environment.h"

#include <charconv>
#include <cstdlib>

#include "base/user_error.h"

namespace megatune::executor {
namespace {

// The variable names one launcher uses.
struct LauncherVariables {
  const char* launcher;
  const char* rank;
  const char* world_size;
  const char* local_rank;
  const char* how_to_start;  // the fix, for messages
};

constexpr LauncherVariables kTorchrun{"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                                      "start the job with torchrun or `megatune train --nproc N`"};
constexpr LauncherVariables kSlurm{"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
                                   "start the job with srun --ntasks N"};
constexpr LauncherVariables kOpenMpi{"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                     "OMPI_COMM_WORLD_LOCAL_RANK", "start the job with mpirun -np N"};

std::string assignment(const std::string& name, const std::string& value) { return name + "=" + value; }

// An integer in [min_value, max_value], or a UserError naming the variable.
int parse_int(const std::string& name, const std::string& value, int min_value, int max_value,
              const std::string& fix) {
  int parsed = 0;
  const char* end = value.data() + value.size();
  const auto [ptr, error] = std::from_chars(value.data(), end, parsed);
  if (value.empty() || error != std::errc() || ptr != end)
    throw UserError(assignment(name, value) + ": not an integer; " + fix);
  if (parsed < min_value || parsed > max_value)
    throw UserError(assignment(name, value) + ": must lie in [" + std::to_string(min_value) + ", " +
                    std::to_string(max_value) + "]; " + fix);
  return parsed;
}

LaunchEnvironment read_launcher(const LauncherVariables& v, const EnvLookup& env) {
  const std::optional<std::string> rank = env(v.rank), world = env(v.world_size);
  const std::string fix = std::string("set both or neither, or ") + v.how_to_start;
  if (!world)
    throw UserError(assignment(v.rank, *rank) + " is set but " + v.world_size + " is not (" + v.launcher +
                    " environment); " + fix);
  LaunchEnvironment launch;
  launch.launcher = v.launcher;
  launch.world_size = parse_int(v.world_size, *world, 1, 1 << 20, v.how_to_start);
  const std::string range_fix = std::string("ranks run from 0 to ") + v.world_size +
                                " - 1 = " + std::to_string(launch.world_size - 1) + "; " + v.how_to_start;
  launch.rank = parse_int(v.rank, *rank, 0, launch.world_size - 1, range_fix);
  if (const std::optional<std::string> local = env(v.local_rank))
    launch.local_rank = parse_int(v.local_rank, *local, 0, launch.world_size - 1, range_fix);
  else
    launch.local_rank = launch.world_size == 1 ? 0 : launch.rank;  // no local rank: assume one host
  return launch;
}

// MASTER_ADDR / MASTER_PORT, required by every multi-process job.
void read_master(LaunchEnvironment& launch, const EnvLookup& env) {
  const std::optional<std::string> addr = env("MASTER_ADDR"), port = env("MASTER_PORT");
  if (launch.world_size == 1 && !addr && !port) return;
  const std::string fix = "export MASTER_ADDR=<rank 0's host> MASTER_PORT=<free port> on every rank";
  const std::string job = " (" + launch.describe() + ")";
  if (!addr) throw UserError("MASTER_ADDR is not set" + job + "; " + fix);
  if (addr->empty()) throw UserError("MASTER_ADDR is empty" + job + "; " + fix);
  if (!port) throw UserError("MASTER_PORT is not set" + job + "; " + fix);
  launch.master_addr = *addr;
  launch.master_port = parse_int("MASTER_PORT", *port, 1, 65535, fix);
}

}  // namespace

std::string LaunchEnvironment::describe() const {
  if (launcher == "none") return "a single process started by no launcher";
  return "rank " + std::to_string(rank) + " of " + std::to_string(world_size) + ", local rank " +
         std::to_string(local_rank) + ", from " + launcher;
}

EnvLookup process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

LaunchEnvironment read_launch_environment(const EnvLookup& env) {
  for (const LauncherVariables* v : {&kTorchrun, &kSlurm, &kOpenMpi}) {
    if (!env(v->rank)) {
      if (const std::optional<std::string> world = env(v->world_size); world && v == &kTorchrun)
        throw UserError(assignment(v->world_size, *world) +
                        " is set but RANK is not (torchrun environment); " + "set both or neither, or " +
                        v->how_to_start);
      continue;
    }
    LaunchEnvironment launch = read_launcher(*v, env);
    read_master(launch, env);
    return launch;
  }
  return LaunchEnvironment{};
}

void check_layout_world_size(const LaunchEnvironment& launch, int layout_world_size) {
  if (launch.world_size == layout_world_size) return;
  const std::string started =
      launch.launcher == "none"
          ? std::string("one process was started (no launcher)")
          : std::to_string(launch.world_size) + " processes were started (" + launch.launcher + ")";
  throw UserError(started + " but the layout needs " + std::to_string(layout_world_size) +
                  " (--world-size, or tp * cp * pp * dp): start " + std::to_string(layout_world_size) +
                  " processes (`megatune train --nproc " + std::to_string(layout_world_size) +
                  "`, torchrun --nproc-per-node, srun --ntasks) or change the layout");
}

void require_single_process_for_cpu(const LaunchEnvironment& launch) {
  if (launch.world_size == 1 && launch.rank == 0) return;
  throw UserError(
      "--device cpu runs every rank as a thread of one process, but this process was started as " +
      launch.describe() +
      ": start one process (`megatune train --device cpu --nproc N` runs N ranks as threads) "
      "or use --device cuda for one process per GPU");
}

}  // namespace megatune::executor
