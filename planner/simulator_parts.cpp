// The simulator's trace events; RankBuild is header-only (planner/simulator_parts.h).
#include "planner/simulator_parts.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

namespace megatune::planner {

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

}  // namespace megatune::planner
