// Traced training run: per-op CUPTI device times of a real iteration joined to the step program and stored.
#include "profiler/cuda/traced_training.h"

#include <algorithm>
#include <iostream>
#include <sstream>
#include <stdexcept>

#include "base/user_error.h"
#include "executor/cuda/cuda_backend.h"
#include "executor/parallel/communicator.h"
#include "executor/training/training_run.h"
#include "layouts/flops.h"
#include "layouts/step_program.h"
#include "profiler/cuda/cupti_tracer.h"
#include "profiler/op_range_observer.h"
#include "profiler/trace_timing.h"

namespace megatune::profiler::cuda {

TracedTrainingResult trace_training(const layouts::ModelSpec& model, const layouts::ParallelConfig& config,
                                    int iterations, const cost_models::CostModel& prices,
                                    cost_models::Database& database, const DeviceIdentity& identity) {
  if (iterations < 2) throw UserError("--train-iters must be at least 2 for --trace (one warm-up iteration)");
  if (config.world_size != 1)
    throw UserError("--trace runs the executor on one GPU: use --world-size 1 (the default)");
  config.validate(model);

  executor::RunConfig run;
  executor::TrainerConfig& t = run.trainer;
  // The defaults of `megatune train` (--rotary-base 10000, --norm-epsilon 1e-5, --init-method-std 0.02).
  t.model = executor::transformer_config_from(model, 1, 10000.0f, 1e-5f, 0.02f);
  t.batch.micro_batch = config.micro_batch_size;
  t.batch.seq = model.seq_length;
  t.batch.num_microbatches = config.num_microbatches();
  t.recompute = layouts::RecomputeSettings::of(config);
  t.compute_dtype = executor::DType::kBF16;
  t.lr.max_lr = 1e-4;
  t.lr.decay_samples = iterations * t.global_batch_size();
  run.train_iters = iterations;
  run.data.mock_data = true;
  run.data.gpt.vocab_size = model.vocab_size;
  run.data.gpt.eod_token = model.vocab_size > 256 ? 256 : 0;
  run.data.mock.vocab_size = model.vocab_size;
  run.data.mock.eod_token = run.data.gpt.eod_token;
  run.log_interval = iterations;
  run.flops_per_iteration = layouts::model_flops_per_iteration(model, t.global_batch_size(), 1);

  CuptiTracer tracer;
  executor::CudaBackend backend(0);
  executor::SingleRankCommunicator communicator(backend);
  std::ostringstream log;
  executor::TrainingRun training(run, backend, communicator, log);
  tracer.flush();  // set-up work (initialization kernels) is not part of any iteration
  OpRangeObserver observer(tracer);
  backend.set_op_observer(&observer);
  std::vector<executor::IterationRecord> records;
  try {
    records = training.run();
  } catch (...) {
    backend.set_op_observer(nullptr);
    if (observer.op_open()) tracer.end_range();
    throw;
  }
  backend.set_op_observer(nullptr);
  const std::vector<TraceRecord> trace = tracer.flush();
  if (tracer.dropped_records() != 0)
    throw std::runtime_error("traced run: CUPTI dropped " + std::to_string(tracer.dropped_records()) +
                             " records (buffers overflowed); use fewer --train-iters or a smaller model");

  TracedTrainingResult result;
  result.iterations = iterations;
  const OpSlice last_ops = last_iteration(observer.ops());
  if (last_ops.count == 0 || last_ops.first == 0)
    throw std::runtime_error("traced run: " + std::to_string(observer.ops().size()) +
                             " ops observed, but no complete last iteration (grad-norm op) among them");
  result.ops_per_iteration = static_cast<int>(last_ops.count);
  // The last iteration, timed from its CUPTI records (device busy time of each op's range).
  const AttributedOps last = attribute_records(observer, trace, last_ops.first, last_ops.count);
  result.ops_without_activity = last.ops_without_activity;
  result.attributed_s = last.attributed_s;
  result.unattributed_s = last.unattributed_s / iterations;
  double busy_ns = 0;
  for (const TraceRecord& record : trace)
    if (record.kind == ActivityKind::kKernel) busy_ns += static_cast<double>(record.duration_ns());
  result.cupti_kernel_s = busy_ns * 1e-9 / iterations;
  result.slowest_ops = last.ops;
  std::stable_sort(result.slowest_ops.begin(), result.slowest_ops.end(),
                   [](const MeasuredOp& a, const MeasuredOp& b) { return a.measured_s > b.measured_s; });
  if (result.slowest_ops.size() > 5) result.slowest_ops.resize(5);

  const layouts::StepProgram program = layouts::build_step_program(model, config, 0);
  result.joined = join_to_step_program(last.ops, program, prices);
  result.iteration_s = records.back().step.elapsed_s;
  const double peak = prices.peak_flops_per_s(layouts::DType::kBF16);
  result.measured_mfu = run.flops_per_iteration / (result.iteration_s * peak);
  result.predicted_mfu = result.joined.predicted_total_s > 0
                             ? run.flops_per_iteration / (result.joined.predicted_total_s * peak)
                             : 0;

  cost_models::RunRecord row;
  row.predicted_step_time_s = result.joined.predicted_total_s;
  row.measured_step_time_s = result.iteration_s;
  row.predicted_mfu = result.predicted_mfu;
  row.measured_mfu = result.measured_mfu;
  row.gpu = identity.gpu;
  row.versions = identity.versions;
  row.started_at = cost_models::utc_now_iso8601();
  result.run_id = store_joined_run(database, row, result.joined);
  return result;
}

}  // namespace megatune::profiler::cuda
