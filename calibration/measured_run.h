// A traced run read back (`megatune train --trace-dir DIR`; the format is layouts/run_trace_format.h), and
// its join to the step program: each traced op must be the step-program op of the same index.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "layouts/model_spec.h"
#include "layouts/op.h"
#include "layouts/parallel_config.h"
#include "layouts/step_program.h"

namespace megatune::calibration {

// One op line: its id (= step-program index), times (s after the iteration's first op began) and the
// identity fields as written.
struct TracedOp {
  int id = 0;
  bool communication_stream = false;
  double start_s = 0, end_s = 0;
  std::string kind, phase, dtype, label, group, text;
  std::int64_t layer = -1, microbatch = -1, chunk = -1, m = 0, n = 0, k = 0, bytes = 0, group_size = 1;
  std::int64_t peer = -1;
  bool accumulate = false;
  std::vector<std::int64_t> attention;  // batch, heads, kv_heads, seq_q, seq_kv, head_dim, causal
  double duration_s() const { return end_s - start_s; }
};

struct TracedIteration {
  std::int64_t iteration = 0;
  double step_s = 0, loss = 0;
  double sm_clock_mhz = -1, power_w = -1;
  std::int64_t recorded_ops = 0;  // the iteration record's "ops": how many op lines follow it
  std::vector<TracedOp> ops;
};

struct TracedArenaUse {
  std::string what;
  std::int64_t bytes = 0;
};

struct TracedRank {
  int rank = 0, tp = 0, pp = 0, dp = 0, cp = 0;
  std::string backend;
  std::int64_t arena_capacity_bytes = 0, arena_used_bytes = 0, device_memory_used_bytes = -1;
  std::vector<TracedArenaUse> arena;
  std::vector<TracedIteration> iterations;
};

struct MeasuredRun {
  std::string dir;
  std::vector<std::string> command, model_args;
  std::string model, layout, device, backend, gpu, cluster, timing, created_utc;
  std::string megatune_commit;  // "" in a trace written before the field existed
  int world_size = 1, micro_batch_size = 1, global_batch_size = 1;
  double model_flops_per_iteration = 0, peak_tflops = 0;
  std::int64_t trace_first_iteration = 0, trace_iterations = 0;
  std::vector<TracedRank> ranks;
};

// Reads DIR/run.json and every rank file. UserError (one line naming the file and the fix) when DIR or a
// file is missing, not a regular file (a FIFO, a device), not JSON, of another format or version, or when
// the trace contradicts itself: a rank listed twice or missing, an iteration whose op lines are not as many
// as it records, a step time that is not positive, an op that ends before it starts.
MeasuredRun read_measured_run(const std::string& dir);

// Checks every traced iteration of every rank against layouts::build_step_program(model, config, rank, step)
// (step: the run's step-program options, its FP8 settings among them): every
// program op traced in order and, op by op, the same kind, phase, dtype, label, layer, micro-batch, shape,
// bytes and group (dtype and bytes not in an fp32 run: the step program counts bf16). UserError naming the
// first mismatch (a trace of another model or layout) otherwise. Ops the executor issued after the program's
// last one (work the step program does not list yet) are allowed; compare_run reports them as unjoined. A CPU
// run without --bf16: its ops compute in fp32, the step program's in bf16.
// `target` says whose (model, layout) it is, for the fix the message gives: the run's own flags (kRunFlags:
// the trace contradicts itself) or flags given by the user (kGiven: give the run's own).
bool fp32_run(const MeasuredRun& run);
enum class JoinTarget { kGiven, kRunFlags };
void check_join(const MeasuredRun& run, const layouts::ModelSpec& model,
                const layouts::ParallelConfig& config, JoinTarget target = JoinTarget::kGiven,
                const layouts::StepProgramOptions& step = {});

}  // namespace megatune::calibration
