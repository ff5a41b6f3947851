// Joining measured executor ops to step-program op ids and storing them as a run.
#include "profiler/run_join.h"

#include "cost_models/record_store.h"

namespace megatune::profiler {
namespace {

bool same_shape(const layouts::Op& a, const layouts::Op& b) {
  return a.kind == b.kind && a.m == b.m && a.n == b.n && a.k == b.k && a.attention == b.attention &&
         a.bytes == b.bytes;
}

}  // namespace

JoinedRun join_to_step_program(const std::vector<MeasuredOp>& executed, const layouts::StepProgram& program,
                               const cost_models::CostModel& prices, int window) {
  JoinedRun joined;
  std::vector<bool> used(program.ops.size(), false);
  std::size_t cursor = 0;
  for (const MeasuredOp& measured : executed) {
    const std::size_t end = std::min(program.ops.size(), cursor + static_cast<std::size_t>(window));
    std::size_t found = program.ops.size();
    bool loose = false;
    for (std::size_t i = cursor; i < end; ++i) {
      if (!used[i] && program.ops[i].same_work(measured.op)) {
        found = i;
        break;
      }
    }
    if (found == program.ops.size()) {
      for (std::size_t i = cursor; i < end; ++i) {
        if (!used[i] && same_shape(program.ops[i], measured.op)) {
          found = i, loose = true;
          break;
        }
      }
    }
    if (found == program.ops.size()) {
      ++joined.unmatched;
      continue;
    }
    used[found] = true;
    while (cursor < used.size() && (used[cursor] || program.ops[cursor].is_communication())) ++cursor;
    joined.matched_loosely += loose;
    cost_models::RunOp row;
    row.op_id = static_cast<std::int64_t>(found);
    row.op_text = layouts::to_string(program.ops[found]);
    row.measured_s = measured.measured_s;
    row.predicted_s = prices.price(program.ops[found]).time_s;
    joined.measured_total_s += row.measured_s;
    joined.predicted_total_s += row.predicted_s;
    joined.ops.push_back(std::move(row));
  }
  return joined;
}

std::int64_t store_joined_run(cost_models::Database& database, const cost_models::RunRecord& run,
                              const JoinedRun& joined) {
  cost_models::Transaction transaction(database);
  const std::int64_t run_id = cost_models::insert_run(database, run);
  for (cost_models::RunOp op : joined.ops) {
    op.run_id = run_id;
    cost_models::upsert_run_op(database, op);
  }
  transaction.commit();
  return run_id;
}

}  // namespace megatune::profiler
