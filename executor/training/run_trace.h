// Traced runs (`megatune train --trace-dir DIR`): a window of iterations after warm-up with every op timed
// (its step-program id, stream, start and end), the step time and the arena, written per rank in the format
// of layouts/run_trace_format.h; and the run's manifest (DIR/run.json), written once every rank has finished.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "executor/backend/backend.h"
#include "layouts/rank_grid.h"

namespace megatune::executor {

struct StepResult;

struct RunTraceOptions {
  std::string dir;                   // --trace-dir ("": no trace)
  std::int64_t first_iteration = 0;  // --trace-iterations START:COUNT (1-based); 0: the default window
  std::int64_t iterations = 0;
  // Set per rank by build_run_config.
  int rank = 0;
  layouts::DenseCoordinates coordinates;
};

// "START:COUNT" (e.g. "2:3") into options; UserError naming --trace-iterations otherwise.
void parse_trace_iterations(const std::string& text, RunTraceOptions& options);
// Fills the default window (from iteration 2, or 1 in a one-iteration run; up to 3 iterations) and checks
// that the window lies within --train-iters (UserError otherwise).
void resolve_trace_window(RunTraceOptions& options, std::int64_t train_iters);

// One rank's trace: op timing on for the window's iterations, their ops kept, the rank file written by
// finish() (temporary file + rename).
class RankTracer {
 public:
  RankTracer(RunTraceOptions options, Backend& backend);
  void before_step(std::int64_t iteration);  // `iteration` is the one about to run (1-based)
  void after_step(std::int64_t iteration, const StepResult& step);
  // Writes DIR/rank_<r>.ops.jsonl; UserError when no iteration of the window ran or DIR is not writable.
  void finish();

 private:
  struct Iteration {
    std::int64_t iteration = 0;
    double step_s = 0, loss = 0;
    Backend::DeviceSample device;  // right after the step (synchronized)
    std::vector<Backend::TimedOp> ops;
  };
  bool in_window(std::int64_t iteration) const;
  RunTraceOptions options_;
  Backend& backend_;
  std::vector<Iteration> iterations_;
  std::int64_t device_memory_used_bytes_ = -1;
};

// What DIR/run.json says of the run (see layouts/run_trace_format.h for the fields).
struct RunManifest {
  std::vector<std::string> command;     // argv
  std::vector<std::string> model_args;  // flags that rebuild (model, layout)
  std::string model, layout, device, backend, gpu, cluster, timing;
  std::int64_t parameters = 0;
  int world_size = 1, micro_batch_size = 1, global_batch_size = 1, num_microbatches = 1, seq_length = 0;
  double model_flops_per_iteration = 0, peak_tflops = 0;
  RunTraceOptions trace;
};
// Writes DIR/run.json atomically after checking that every rank's file exists (UserError otherwise).
void write_run_manifest(const RunManifest& manifest);

}  // namespace megatune::executor
