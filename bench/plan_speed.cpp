// Benchmark: planner search speed (candidates simulated per second) on llama3-70b over 1024 H100s and
// over 64 H100s, and the time of one llama3-405b simulation at 16384 to 1048576 GPUs, priced from the
// embedded catalog. Usage: bench_plan_speed [threads]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "cost_models/cluster_spec.h"
#include "cost_models/cost_model.h"
#include "layouts/model_spec.h"
#include "planner/search.h"
#include "planner/simulator.h"

int main(int argc, char** argv) {
  using namespace megatune;
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  struct Case {
    const char* cluster;
    int global_batch_size;
  };
  for (Case c : {Case{"128x8xH100", 1024}, Case{"8x8xH100", 512}}) {
    cost_models::ClusterSpec cluster = cost_models::parse_cluster_spec(c.cluster);
    auto cost_model = cost_models::CostModel::from_embedded(cluster);
    planner::CostModelPricer pricer(*cost_model);
    planner::PlanRequest request;
    request.model = layouts::model_preset("llama3-70b");
    request.model.seq_length = 4096;
    request.world_size = cluster.world_size();
    request.global_batch_size = c.global_batch_size;
    request.threads = threads;
    request.top_k = 5;
    const auto start = std::chrono::steady_clock::now();
    planner::PlanResult result = planner::plan(request, pricer);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const auto& st = result.statistics;
    std::printf(
        "llama3-70b seq 4096 gbs %d on %s (%d threads): %.2f s total; enumerated %lld, invalid %lld, out of "
        "memory %lld, pruned by bound %lld, simulated %lld; search %.2f s = %.0f candidates/s; best %s step "
        "%.3f s "
        "MFU %.1f%%\n",
        c.global_batch_size, c.cluster, threads, seconds, static_cast<long long>(st.enumerated),
        static_cast<long long>(st.invalid), static_cast<long long>(st.out_of_memory),
        static_cast<long long>(st.pruned_by_bound), static_cast<long long>(st.simulated), st.simulate_seconds,
        st.simulate_seconds > 0 ? st.simulated / st.simulate_seconds : 0.0,
        planner::describe(result.ranked[0]).c_str(), result.ranked[0].simulation.step_time_s,
        100.0 * result.ranked[0].simulation.mfu);
  }
  // Every surviving candidate simulated (no lower-bound pruning): the simulator's own rate.
  {
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
    planner::PlanResult result = planner::plan(request, pricer);
    const auto& st = result.statistics;
    std::printf(
        "exhaustive (no bound pruning), 128x8xH100: %lld candidates simulated in %.2f s = %.0f "
        "simulations/s\n",
        static_cast<long long>(st.simulated), st.simulate_seconds,
        st.simulate_seconds > 0 ? st.simulated / st.simulate_seconds : 0.0);
  }
  // One simulation of the same layout as the world grows (llama3-405b, tp8 pp16 with 7-layer first/last
  // ranks, 16 microbatches): only the data-parallel groups grow, so the time should not.
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
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / repeats;
    std::printf(
        "simulate llama3-405b tp8 pp16 dp%d (%d GPUs, 16 microbatches): %.2f ms per simulation, step %.3f "
        "s\n",
        config.dp(), world, seconds * 1e3, step_s);
  }
  return 0;
}
