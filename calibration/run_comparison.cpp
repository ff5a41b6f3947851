// compare_run: per rank, the measured op times (means over the traced iterations) beside the simulated
// timeline of the rank's pipeline stage, summed per op kind and summarized.
#include "calibration/run_comparison.h"

#include <algorithm>
#include <cmath>

#include "layouts/rank_grid.h"
#include "layouts/step_program.h"

namespace megatune::calibration {
namespace {

using layouts::OpKind;

bool is_p2p(OpKind kind) { return kind == OpKind::kSend || kind == OpKind::kRecv; }

const planner::RankOpTimeline& timeline_for(const planner::SimulationResult& simulation,
                                            const layouts::RankGrid& grid, int rank) {
  const planner::RankOpTimeline* same_stage = nullptr;
  for (const planner::RankOpTimeline& t : simulation.op_timelines) {
    if (t.rank == rank) return t;
    if (same_stage == nullptr && grid.dense_coordinates(t.rank).pp == grid.dense_coordinates(rank).pp)
      same_stage = &t;
  }
  if (same_stage == nullptr)
    throw std::logic_error("compare_run: the simulation holds no op timeline for rank " +
                           std::to_string(rank) + "'s stage");
  return *same_stage;
}

RankComparison compare_rank(const TracedRank& traced, const layouts::StepProgram& program,
                            const planner::RankOpTimeline& timeline, const planner::StageReport& stage) {
  RankComparison r;
  r.rank = traced.rank;
  r.tp = traced.tp, r.pp = traced.pp, r.dp = traced.dp, r.cp = traced.cp;
  r.simulated_rank = timeline.rank;
  r.predicted_step_s = stage.finish_s;
  r.predicted_compute_s = stage.compute_s;
  r.predicted_exposed_comm_s = stage.exposed_comm_s;
  const double working = stage.compute_s + stage.exposed_comm_s;
  r.predicted_bubble = working > 0 ? stage.pipeline_wait_s / working : 0.0;
  const double iterations = static_cast<double>(traced.iterations.size());
  double wait_s = 0;
  for (const TracedIteration& it : traced.iterations) r.measured_step_s += it.step_s / iterations;
  std::vector<KindComparison> kinds(planner::kOpKindCount);
  for (std::size_t i = 0; i < program.ops.size(); ++i) {
    ComparedOp c;
    c.id = static_cast<int>(i);
    c.op = program.ops[i];
    for (const TracedIteration& it : traced.iterations) c.measured_s += it.ops[i].duration_s() / iterations;
    c.measured_start_s = traced.iterations.front().ops[i].start_s;
    c.measured_first_s = traced.iterations.front().ops[i].duration_s();
    if (i < timeline.ops.size() && timeline.ops[i].start_s >= 0) {
      c.predicted_start_s = timeline.ops[i].start_s;
      c.predicted_s = timeline.ops[i].end_s - timeline.ops[i].start_s;
    }
    KindComparison& k = kinds[static_cast<int>(c.op.kind)];
    k.kind = c.op.kind;
    k.count += 1;
    k.predicted_s += std::max(0.0, c.predicted_s);
    k.measured_s += c.measured_s;
    r.measured_ops_s += c.measured_s;
    if (c.op.kind == OpKind::kRecv) {
      wait_s += c.measured_s;
    } else if (c.op.is_communication() && !is_p2p(c.op.kind)) {
      r.measured_exposed_comm_s += c.measured_s;
    } else if (!c.op.is_communication()) {
      r.measured_compute_s += c.measured_s;
    }
    r.ops.push_back(std::move(c));
  }
  for (std::size_t i = program.ops.size(); i < traced.iterations.front().ops.size(); ++i) {
    double measured = 0;
    for (const TracedIteration& it : traced.iterations)
      measured += i < it.ops.size() ? it.ops[i].duration_s() / iterations : 0.0;
    r.unjoined.push_back({traced.iterations.front().ops[i].text, measured});
  }
  const double measured_working = r.measured_compute_s + r.measured_exposed_comm_s;
  r.measured_bubble = measured_working > 0 ? wait_s / measured_working : 0.0;
  for (const KindComparison& k : kinds)
    if (k.count > 0) r.kinds.push_back(k);
  std::sort(r.kinds.begin(), r.kinds.end(),
            [](const KindComparison& a, const KindComparison& b) { return a.measured_s > b.measured_s; });
  return r;
}

}  // namespace

RunComparison compare_run(const MeasuredRun& run, const layouts::ModelSpec& model,
                          const layouts::ParallelConfig& config, const planner::SimulationResult& simulation,
                          std::vector<MemoryColumn> memory, const layouts::StepProgramOptions& step) {
  RunComparison c;
  c.model = run.model;
  c.layout = run.layout;
  c.device = run.device + (run.gpu.empty() ? "" : " (" + run.gpu + ")");
  c.timing = run.timing;
  c.run_dir = run.dir;
  c.world_size = run.world_size;
  c.predicted_step_s = simulation.step_time_s;
  c.predicted_mfu = simulation.mfu;
  c.predicted_bubble = simulation.bubble_fraction;
  c.predicted_exposed_comm_s = simulation.exposed_comm_s;
  const layouts::RankGrid grid = layouts::RankGrid::from_config(config);
  for (const TracedRank& traced : run.ranks) {
    const layouts::StepProgram program = layouts::build_step_program(model, config, traced.rank, step);
    const int pp = grid.dense_coordinates(traced.rank).pp;
    c.ranks.push_back(
        compare_rank(traced, program, timeline_for(simulation, grid, traced.rank), simulation.stages.at(pp)));
  }
  double bubble_sum = 0;
  for (const RankComparison& r : c.ranks) {
    bubble_sum += r.measured_bubble;
    if (r.measured_step_s > c.measured_step_s) {
      c.measured_step_s = r.measured_step_s;
      c.measured_exposed_comm_s = r.measured_exposed_comm_s;
    }
  }
  double clock_sum = 0, power_sum = 0;
  int clocks = 0, powers = 0;
  for (const TracedRank& traced : run.ranks)
    for (const TracedIteration& it : traced.iterations) {
      if (it.sm_clock_mhz >= 0) clock_sum += it.sm_clock_mhz, ++clocks;
      if (it.power_w >= 0) power_sum += it.power_w, ++powers;
    }
  if (clocks > 0) c.measured_sm_clock_mhz = clock_sum / clocks;
  if (powers > 0) c.measured_power_w = power_sum / powers;
  c.measured_bubble = c.ranks.empty() ? 0.0 : bubble_sum / static_cast<double>(c.ranks.size());
  if (run.peak_tflops > 0 && c.measured_step_s > 0)
    c.measured_mfu =
        run.model_flops_per_iteration / (c.measured_step_s * run.world_size * run.peak_tflops * 1e12);
  c.memory = std::move(memory);
  if (run.device == "cpu")
    c.notes.push_back(
        "a CPU run: its times are the CPU backend's, the prediction is for " +
        std::string("the simulated GPUs; compare op identity, counts and bytes, and time shares"));
  for (const RankComparison& r : c.ranks)
    for (const auto& [text, seconds] : r.unjoined)
      c.notes.push_back("rank " + std::to_string(r.rank) + " issued '" + text +
                        "' after its step program's last op " +
                        "(not in the step program; left out of the sums)");
  if (fp32_run(run))
    c.notes.push_back(
        "an fp32 run (CPU without --bf16): dtypes and bytes were not held against the step "
        "program's bf16 ones; trace with --bf16 to check them too");
  return c;
}

std::vector<ComparedOp> worst_offenders(const RankComparison& rank, std::size_t count) {
  std::vector<ComparedOp> ops = rank.ops;
  auto error = [](const ComparedOp& o) {
    return o.predicted_s < 0 ? -1.0 : std::fabs(o.measured_s - o.predicted_s);
  };
  std::stable_sort(ops.begin(), ops.end(),
                   [&](const ComparedOp& a, const ComparedOp& b) { return error(a) > error(b); });
  if (ops.size() > count) ops.resize(count);
  return ops;
}

}  // namespace megatune::calibration
