// The simulator's trace events and communication categories; RankBuild is header-only
// (planner/simulator_parts.h).
#include "planner/simulator_parts.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "layouts/flops.h"

namespace megatune::planner {

using layouts::CommGroup;

CommCategory comm_category(const layouts::Op& op) {
  if (op.role == layouts::OpRole::kContextParallelRing) return CommCategory::kContext;
  if (op.kind == layouts::OpKind::kSend || op.kind == layouts::OpKind::kRecv) return CommCategory::kPipeline;
  switch (op.group) {
    case CommGroup::kTensor:
    case CommGroup::kExpertTensor:
      return CommCategory::kTensor;
    case CommGroup::kContext:
      return CommCategory::kContext;
    case CommGroup::kExpert:
    case CommGroup::kTensorExpert:
      return CommCategory::kExpert;
    case CommGroup::kPipeline:
      return CommCategory::kPipeline;
    case CommGroup::kData:
    case CommGroup::kDataContext:
    case CommGroup::kExpertData:
      return CommCategory::kData;
    default:
      return CommCategory::kOther;
  }
}

void append_trace_events(const layouts::RankGrid& grid, const std::vector<int>& sim_ranks,
                         const std::vector<std::vector<SimTask>>& programs, const EngineResult& replayed,
                         const std::vector<RankBuild>& builds, SimulationResult& result) {
  for (int sim = 0; sim < static_cast<int>(sim_ranks.size()); ++sim) {
    const int rank = sim_ranks[sim];
    const layouts::DenseCoordinates c = grid.dense_coordinates(rank);
    char pname[96];
    std::snprintf(pname, sizeof pname, "rank %d (pp%d tp%d cp%d dp%d)", rank, c.pp, c.tp, c.cp, c.dp);
    result.trace_processes.push_back({rank, pname});
    const auto& tasks = programs[sim];
    const auto& timeline = replayed.ranks[sim].timeline;
    for (std::size_t i = 0; i < tasks.size(); ++i) {
      const double duration = timeline[i].end_s - timeline[i].start_s;
      if (duration <= 0.0 && tasks[i].kind != TaskKind::kCompute) continue;
      TraceEvent e;
      e.pid = rank;
      e.thread = tasks[i].kind == TaskKind::kAsyncCollective ? TraceThread::kComm
                 : tasks[i].kind == TaskKind::kSend          ? TraceThread::kP2p
                                                             : TraceThread::kCompute;
      e.name = builds[sim].names[i];
      e.category = builds[sim].categories[i];
      e.start_s = timeline[i].start_s;
      e.duration_s = duration;
      e.args.push_back({"op", builds[sim].details[i]});
      if (i < builds[sim].provenance.size()) e.args.push_back({"provenance", builds[sim].provenance[i]});
      if (tasks[i].kind == TaskKind::kRecv) e.args.push_back({"waited", "pipeline or transfer"});
      result.trace_events.push_back(std::move(e));
    }
  }
}

std::string SimulationResult::kind_table() const {
  std::vector<int> order;
  double total = 0.0;
  for (int k = 0; k < kOpKindCount; ++k) {
    if (kind_times[k].count > 0) order.push_back(k);
    total += kind_times[k].total_s;
  }
  std::sort(order.begin(), order.end(),
            [&](int a, int b) { return kind_times[a].total_s > kind_times[b].total_s; });
  std::ostringstream out;
  char line[160];
  std::snprintf(line, sizeof line, "  %-16s %10s %12s %7s\n", "op kind", "count", "time (ms)", "share");
  out << line;
  for (int k : order) {
    std::snprintf(line, sizeof line, "  %-16s %10lld %12.3f %6.1f%%\n",
                  layouts::op_kind_name(static_cast<layouts::OpKind>(k)),
                  static_cast<long long>(kind_times[k].count), kind_times[k].total_s * 1e3,
                  total > 0 ? 100.0 * kind_times[k].total_s / total : 0.0);
    out << line;
  }
  return out.str();
}

void summarize_replay(const layouts::ModelSpec& model, const layouts::ParallelConfig& config,
                      double peak_bf16_tflops, const layouts::RankGrid& grid,
                      const std::vector<int>& sim_ranks, const EngineResult& replayed,
                      const std::vector<RankBuild>& builds, SimulationResult& result) {
  result.simulated_ranks = static_cast<int>(sim_ranks.size());
  result.step_time_s = replayed.step_time_s;
  const int pp = config.pp();
  result.stages.resize(pp);
  std::vector<int> stage_sim(pp, -1);
  for (int sim = 0; sim < static_cast<int>(sim_ranks.size()); ++sim) {
    const int stage = grid.dense_coordinates(sim_ranks[sim]).pp;
    if (stage_sim[stage] < 0 || replayed.ranks[sim].finish_s > replayed.ranks[stage_sim[stage]].finish_s)
      stage_sim[stage] = sim;
  }
  double bubble_sum = 0.0;
  int critical = 0;
  for (int s = 0; s < pp; ++s) {
    const RankReplay& r = replayed.ranks[stage_sim[s]];
    StageReport& report = result.stages[s];
    report.pp_rank = s;
    report.rank = sim_ranks[stage_sim[s]];
    report.finish_s = r.finish_s;
    report.compute_s = r.compute_busy_s;
    report.exposed_comm_s = r.exposed_comm_s;
    report.pipeline_wait_s = r.pipeline_wait_s;
    report.async_comm_s = r.async_comm_busy_s;
    const double working = r.compute_busy_s + r.exposed_comm_s;
    bubble_sum += working > 0 ? r.pipeline_wait_s / working : 0.0;
    if (r.finish_s > result.stages[critical].finish_s ||
        (r.finish_s == result.stages[critical].finish_s &&
         r.compute_busy_s > result.stages[critical].compute_s))
      critical = s;
  }
  result.bubble_fraction = bubble_sum / pp;
  result.critical_stage = critical;
  result.exposed_comm_s = result.stages[critical].exposed_comm_s;
  result.exposed_comm_by_category = replayed.ranks[stage_sim[critical]].exposed_by_category;
  result.compute_s = result.stages[critical].compute_s;
  result.kind_times = builds[stage_sim[critical]].kinds;

  const std::int64_t gbs = config.resolved_global_batch_size();
  result.model_flops = layouts::model_flops_per_iteration(model, gbs, config.tp());
  if (result.step_time_s > 0) {
    result.mfu = layouts::mfu(result.model_flops, result.step_time_s, config.world_size, peak_bf16_tflops);
    result.tflops_per_gpu = result.model_flops / (result.step_time_s * config.world_size * 1e12);
    result.tokens_per_s = static_cast<double>(gbs) * model.seq_length / result.step_time_s;
  }
}

}  // namespace megatune::planner
