// Benchmark: planner search speed, priced from the embedded catalog. Every model preset on 16384 H100s
// and deepseek-v3 on 2048 with megatune plan's default memory model (the executor's sizing), llama3-405b
// on 1048576 GPUs; llama3-70b over 1024 and 64 H100s (Megatron's memory model) and its exhaustive search
// (the simulator's own rate); and the time of one llama3-405b simulation at 16384 to 1048576 GPUs.
// Usage: bench_plan_speed [threads] [presets|scale|searches|all] [no-fsdp] [uniform-only]   (default: 2 all;
// no-fsdp: the search without its Megatron FSDP strategies, the space it had before them; uniform-only: full
// recomputation as uniform 1 only, without the block units tried where no lighter recomputation fits), or
// bench_plan_speed [threads] one MODEL CLUSTER GBS: that one search (executor memory), e.g. to profile it
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <thread>

#include "base/user_error.h"
#include "cost_models/cluster_spec.h"
#include "cost_models/cost_model.h"
#include "layouts/model_spec.h"
#include "planner/search.h"
#include "planner/simulator.h"
#include "tools/executor_memory_model.h"

namespace {

using namespace megatune;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

bool g_fsdp_dimension = true;   // search the Megatron FSDP strategies (SearchSpace::fsdp)
bool g_block_recompute = true;  // search block units of full recomputation beside uniform 1

struct SearchCase {
  std::string model;
  std::string cluster;
  int global_batch_size;
  int seq_length = 0;  // 0: the preset's
  bool executor_memory = true;
};

// One search as `megatune plan` runs it (top 10, the memory model given), timed; one line of figures.
void run_search(const SearchCase& c, int threads) {
  const cost_models::ClusterSpec cluster = cost_models::parse_cluster_spec(c.cluster);
  auto cost_model = cost_models::CostModel::from_embedded(cluster);
  planner::CostModelPricer pricer(*cost_model);
  planner::PlanRequest request;
  request.model = layouts::model_preset(c.model);
  if (c.seq_length > 0) request.model.seq_length = c.seq_length;
  request.world_size = cluster.world_size();
  request.global_batch_size = c.global_batch_size;
  request.threads = threads;
  request.memory_headroom_fraction = 0.05;
  if (!g_fsdp_dimension) request.space.fsdp.clear();
  request.space.recompute_pinned = !g_block_recompute;  // pinned to the default: uniform 1
  if (c.executor_memory) {
    request.memory_model = planner::MemoryModelKind::kMegatune;
    request.peak_memory_of = tools::executor_peak_memory();
  }
  const auto start = std::chrono::steady_clock::now();
  const std::clock_t cpu_start = std::clock();
  try {
    const planner::PlanResult result = planner::plan(request, pricer);
    const double seconds = seconds_since(start);
    const double cpu_s = static_cast<double>(std::clock() - cpu_start) / CLOCKS_PER_SEC;
    const auto& st = result.statistics;
    std::printf(
        "%-22s seq %5d gbs %5d on %-12s (%s memory, %d threads): %6.2f s (cpu %.2f s); enumerated %lld, "
        "invalid %lld, out "
        "of memory %lld, pruned by bound %lld, simulated %lld; best %s %s step %.3f s MFU %.1f%%\n",
        c.model.c_str(), request.model.seq_length, c.global_batch_size, c.cluster.c_str(),
        c.executor_memory ? "executor" : "Megatron", threads, seconds, cpu_s,
        static_cast<long long>(st.enumerated), static_cast<long long>(st.invalid),
        static_cast<long long>(st.out_of_memory), static_cast<long long>(st.pruned_by_bound),
        static_cast<long long>(st.simulated), planner::describe(result.ranked[0]).c_str(),
        result.ranked[0].layout.c_str(), result.ranked[0].simulation.step_time_s,
        100.0 * result.ranked[0].simulation.mfu);
  } catch (const UserError& e) {
    std::printf("%-22s on %s: %.2f s, no plan: %s\n", c.model.c_str(), c.cluster.c_str(),
                seconds_since(start), e.what());
  }
  std::fflush(stdout);
}

// Every simulation of the survivors (no lower-bound pruning): the simulator's own rate.
void run_exhaustive(int threads) {
  cost_models::ClusterSpec cluster = cost_models::parse_cluster_spec("128x8xH100");
  auto cost_model = cost_models::CostModel::from_embedded(cluster);
  planner::CostModelPricer pricer(*cost_model);
  planner::PlanRequest request;
  request.model = layouts::model_preset("llama3-70b");
  request.model.seq_length = 4096;
  request.world_size = cluster.world_size();
  request.global_batch_size = 1024;
  request.threads = threads;
  request.top_k = 1 << 30;  // keep everything: nothing is pruned by the bound
  if (!g_fsdp_dimension) request.space.fsdp.clear();
  request.space.recompute_pinned = !g_block_recompute;
  planner::PlanResult result = planner::plan(request, pricer);
  const auto& st = result.statistics;
  std::printf(
      "exhaustive (no bound pruning), llama3-70b on 128x8xH100: %lld candidates simulated in %.2f s = %.0f "
      "simulations/s\n",
      static_cast<long long>(st.simulated), st.simulate_seconds,
      st.simulate_seconds > 0 ? st.simulated / st.simulate_seconds : 0.0);
}

// One simulation of the same layout as the world grows (llama3-405b, tp8 pp16 with 7-layer first/last
// ranks, 16 microbatches): only the data-parallel groups grow, so the time should not.
void run_simulation_scaling() {
  for (int world : {16384, 131072, 1048576}) {
    cost_models::ClusterSpec cluster = cost_models::parse_cluster_spec(std::to_string(world / 8) + "x8xH100");
    auto cost_model = cost_models::CostModel::from_embedded(cluster);
    planner::CostModelPricer pricer(*cost_model);
    layouts::ModelSpec model = layouts::model_preset("llama3-405b");
    model.seq_length = 8192;
    layouts::ParallelConfig config;
    config.world_size = world;
    config.tensor_model_parallel_size = 8;
    config.pipeline_model_parallel_size = 16;
    config.decoder_first_pipeline_num_layers = config.decoder_last_pipeline_num_layers = 7;
    config.sequence_parallel = config.use_distributed_optimizer = true;
    config.overlap_grad_reduce = config.overlap_param_gather = true;
    config.global_batch_size = 16 * config.dp();
    planner::simulate(model, config, pricer);  // warm the cost model's caches
    const int repeats = 3;
    const auto start = std::chrono::steady_clock::now();
    double step_s = 0;
    for (int i = 0; i < repeats; ++i) step_s = planner::simulate(model, config, pricer).step_time_s;
    std::printf(
        "simulate llama3-405b tp8 pp16 dp%d (%d GPUs, 16 microbatches): %.2f ms per simulation, step %.3f "
        "s\n",
        config.dp(), world, seconds_since(start) / repeats * 1e3, step_s);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  const std::string part = argc > 2 ? argv[2] : "all";
  if (part == "one") {
    if (argc < 6) {
      std::fprintf(
          stderr,
          "usage: bench_plan_speed THREADS one MODEL CLUSTER GBS (e.g. 1 one deepseek-v3 256x8xH100 2048)\n");
      return 2;
    }
    try {
      run_search({argv[3], argv[4], std::atoi(argv[5])}, threads);
    } catch (const UserError& e) {
      std::fprintf(stderr, "bench_plan_speed: %s\n", e.what());
      return 2;
    }
    return 0;
  }
  for (int i = 3; i < argc; ++i) {
    if (std::string(argv[i]) == "no-fsdp") g_fsdp_dimension = false;
    if (std::string(argv[i]) == "uniform-only") g_block_recompute = false;
  }
  if (part == "presets" || part == "all") {
    // Every preset on 16384 GPUs at global batch 2048 (16384 where 2048 sequences leave no layout: the tiny
    // models' few heads and layers cannot take up 8 GPUs per replica).
    for (const std::string& name : layouts::model_preset_names()) {
      const bool tiny = name == "tiny" || name == "tiny-mixtral";
      run_search({name, "2048x8xH100", tiny ? 16384 : 2048}, threads);
    }
    run_search({"deepseek-v3", "256x8xH100", 2048}, threads);
    run_search({"llama3-405b", "131072x8xH100", 16384, 8192}, threads);
  }
  if (part == "scale" || part == "all" || part == "searches") {
    run_search({"llama3-70b", "128x8xH100", 1024, 4096, false}, threads);
    run_search({"llama3-70b", "8x8xH100", 512, 4096, false}, threads);
    if (part == "searches") return 0;
    run_exhaustive(threads);
    run_simulation_scaling();
  }
  return 0;
}
