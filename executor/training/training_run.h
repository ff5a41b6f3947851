// TrainingRun: a whole `megatune train` run: datasets and loader, the Trainer, Megatron-style log lines,
// periodic and final checkpoints, and resuming from --load.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "executor/checkpoint/run_lineage.h"
#include "executor/data/dataset_builder.h"
#include "executor/training/batch_size_rampup.h"
#include "executor/training/run_trace.h"
#include "executor/training/tensorboard_writer.h"
#include "executor/training/trainer.h"

namespace megatune::executor {

// A rank's pipeline schedule and walk (layouts::walk_rank_step) for one micro-batch count; no walk: a single
// rank's.
struct RankProgram {
  layouts::RankSchedule schedule;
  std::optional<layouts::RankStep> step;
};

struct RunConfig {
  TrainerConfig trainer;
  std::int64_t train_iters = 0;        // --train-iters
  data::DataConfig data;               // --data-path / --mock-data, --split, sequence length, seed
  std::string save;                    // --save: checkpoint root ("" = none)
  std::string load;                    // --load: resume from its latest checkpoint when one exists
  std::int64_t save_interval = 0;      // --save-interval (0: only at the end when --save is given)
  bool overwrite_checkpoints = false;  // --overwrite-checkpoints (executor/checkpoint/run_lineage.h)
  // --finetune: only the weights come from --load; the iteration, the data position and the run are new.
  bool finetune = false;
  bool load_optimizer = true;      // false: --no-load-optim (or --finetune): the optimizer starts anew
  std::int64_t exit_interval = 0;  // --exit-interval: save and stop after an iteration it divides
  double exit_duration_s = 0;      // --exit-duration-in-mins * 60: save and stop once the run took that long
  std::int64_t log_interval = 10;  // --log-interval
  // Validation (Megatron's evaluate): every eval_interval iterations and after training, eval_iters global
  // batches of the validation split; after training also eval_iters of the test split. 0 = none.
  std::int64_t eval_interval = 1000;  // --eval-interval
  std::int64_t eval_iters = 0;        // --eval-iters
  double flops_per_iteration = 0;     // Megatron's model FLOPs of one iteration (recompute not counted)
  double peak_tflops = 0;             // per GPU; 0: MFU is not printed (CPU)
  int gpus = 1;
  bool record_first_iteration = false;  // the backend records the ops of the first iteration run
  // Parallel runs: this rank's schedule (no items: the no-pipelining schedule of the whole model), its
  // data-parallel rank (the loader's slice of each global batch), and the layout (describe_layout) that its
  // checkpoints record: each rank saves its shard rank_NNNNN of the iteration directory; a checkpoint of
  // another layout is resharded on load.
  layouts::RankSchedule schedule;
  int data_parallel_rank = 0;
  std::string layout_description;
  RunTraceOptions trace;  // --trace-dir: per-op timing over a window of iterations (run_trace.h)
  // --tensorboard-dir: the last rank writes Megatron's scalars (tensorboard_writer.h) every
  // tensorboard_log_interval iterations, the timing ones and validation losses when they are logged.
  std::string tensorboard_dir;
  std::int64_t tensorboard_log_interval = 1;
  // --rampup-batch-size: Megatron's calculator gives each iteration's global batch from the samples consumed
  // before it (the trainer is built for the final one, trainer.batch); unset: every iteration runs
  // trainer.batch.
  std::optional<MicroBatchCalculator> batch_sizes;
  // The rank's program for a micro-batch count of the ramp-up; unset: a single rank's (the no-pipelining
  // schedule, no walk).
  std::function<RankProgram(int num_microbatches)> program_for;
  // --train-samples: the samples the training split is built for (0: train_iters global batches).
  std::int64_t train_samples = 0;
};

struct IterationRecord {
  std::int64_t iteration = 0;  // 1-based
  StepResult step;
};

// One evaluation: after `iteration`, over eval_iters global batches of the validation or test split.
struct EvaluationRecord {
  std::int64_t iteration = 0;
  std::string split;   // "validation" | "test"
  bool final = false;  // the evaluation after training (Megatron's "on validation set" / "on test set")
  double loss = 0.0;   // summed token losses / counted tokens, over every data-parallel rank
  double tokens = 0.0;
};

class TrainingRun {
 public:
  // `log` receives the run's lines (Megatron format); `ops` (optional) is called after each iteration with
  // the backend, for callers that inspect the recorded ops.
  TrainingRun(RunConfig config, Backend& backend, Communicator& communicator, std::ostream& log);
  ~TrainingRun();
  // Runs from the current iteration to train_iters; returns every iteration's result.
  std::vector<IterationRecord> run();
  Trainer& trainer() { return *trainer_; }
  // Every evaluation run so far, in order (the same on every rank).
  const std::vector<EvaluationRecord>& evaluations() const { return evaluations_; }
  // Writes a checkpoint of the current state under config.save.
  void save_checkpoint();

 private:
  void load_checkpoint();
  // Megatron's update_num_microbatches before an iteration: the trainer runs the batch of the samples
  // consumed so far. Returns whether the micro-batch count changed.
  bool follow_batch_size_rampup();
  // eval_iters global batches of `loader`'s split, logged as Megatron's framed validation line.
  void evaluate(data::PretrainingDataLoader& loader, const std::string& split, bool final);
  // After the iterations, one memory line per model chunk with MoE layers: the expert rows' blocks (sized
  // to what was routed) against the count they began with and their bound.
  void log_moe_rows();
  // Megatron's "exiting program ..." reason when --exit-duration-in-mins or --exit-interval ends the run
  // after `iteration` ("" otherwise); the same on every rank.
  std::string exit_reason(std::int64_t iteration);
  RunConfig config_;
  Backend& backend_;
  Communicator& communicator_;
  std::ostream& log_;
  std::unique_ptr<Trainer> trainer_;
  std::string run_id_;           // this run's id: the resumed checkpoint's, else new (run_lineage.h)
  bool run_id_resumed_ = false;  // run_id_ came from the checkpoint under --load
  checkpoint::SaveDirectoryClaim save_claim_;  // rank 0: the --save directory's lock, held while training
  std::shared_ptr<const data::SampleDataset> train_dataset_, valid_dataset_, test_dataset_;
  std::vector<EvaluationRecord> evaluations_;
  std::unique_ptr<RankTracer> tracer_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;  // the last rank's, with --tensorboard-dir
  std::chrono::steady_clock::time_point started_;   // --exit-duration-in-mins counts from here
  std::int64_t saved_iteration_ = -1;               // the iteration the last checkpoint holds
};

// The Megatron log line of one interval (exposed for tests).
struct LogInterval {
  std::int64_t iteration = 0, train_iters = 0, consumed_samples = 0, global_batch_size = 0;
  double elapsed_ms_per_iteration = 0, tflops_per_gpu = 0, mfu_percent = -1, learning_rate = 0, loss = 0;
  double grad_norm = 0;
  double load_balancing_loss = -1;  // MoE: mean over the interval; < 0: not logged
  std::vector<double> mtp_losses;   // MTP: each layer's loss, mean over the interval ("mtp_1 loss", ...)
  std::int64_t skipped_iterations = 0;
};
std::string format_log_line(const LogInterval& interval);
// Megatron's evaluate_and_print_results lines: the " validation loss at PREFIX | lm loss value: X | lm loss
// PPL: Y | " line between two dashed lines of its length + 1 (PPL = exp(min(20, loss))).
std::string format_evaluation_lines(const std::string& prefix, double loss);

}  // namespace megatune::executor
