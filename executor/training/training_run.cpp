// TrainingRun: data, iterations, Megatron-style logging and checkpoints of a `megatune train` run.
#include "executor/training/training_run.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <iomanip>
#include <optional>
#include <ostream>
#include <sstream>

#include "base/user_error.h"
#include "executor/checkpoint/checkpoint_reader.h"
#include "executor/checkpoint/checkpoint_writer.h"
#include "executor/checkpoint/run_lineage.h"
#include "executor/checkpoint/saved_iteration.h"
#include "executor/data/gpt_dataset_indices.h"
#include "executor/training/checkpoint_shards.h"

namespace megatune::executor {
namespace {

std::string timestamp() {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char buffer[32];
  std::strftime(buffer, sizeof(buffer), "%Y-%m-%d %H:%M:%S", &local);
  return buffer;
}

bool has_checkpoint(const std::string& root) {
  return !root.empty() &&
         std::filesystem::exists(std::filesystem::path(root) / "latest_checkpointed_iteration.txt");
}

}  // namespace

std::string format_log_line(const LogInterval& v) {
  std::ostringstream out;
  out << " [" << timestamp() << "] iteration " << std::setw(8) << v.iteration << "/" << std::setw(8)
      << v.train_iters << " | consumed samples: " << std::setw(12) << v.consumed_samples
      << " | elapsed time per iteration (ms): " << std::fixed << std::setprecision(1)
      << v.elapsed_ms_per_iteration << " | throughput per GPU (TFLOP/s/GPU): " << std::setprecision(1)
      << v.tflops_per_gpu << " | MFU: ";
  if (v.mfu_percent >= 0) {
    out << std::setprecision(1) << v.mfu_percent << "%";
  } else {
    out << "n/a";
  }
  out << " | learning rate: " << std::scientific << std::uppercase << std::setprecision(6) << v.learning_rate
      << " | global batch size: " << std::setw(5) << v.global_batch_size
      << " | lm loss: " << std::setprecision(6) << v.loss;
  for (std::size_t k = 0; k < v.mtp_losses.size(); ++k)
    out << " | mtp_" << k + 1 << " loss: " << v.mtp_losses[k];
  out << std::nouppercase << std::fixed;
  if (v.load_balancing_loss >= 0)
    out << " | load_balancing_loss: " << std::setprecision(2) << v.load_balancing_loss;
  out << " | grad norm: " << std::setprecision(3) << v.grad_norm
      << " | number of skipped iterations: " << std::setw(3) << v.skipped_iterations << " |";
  return out.str();
}

std::string format_evaluation_lines(const std::string& prefix, double loss) {
  std::ostringstream line;
  line << std::scientific << std::uppercase << std::setprecision(6) << " validation loss at " << prefix
       << " | lm loss value: " << loss << " | lm loss PPL: " << std::exp(std::min(20.0, loss)) << " | ";
  const std::string dashes(line.str().size() + 1, '-');
  return dashes + "\n" + line.str() + "\n" + dashes;
}

TrainingRun::TrainingRun(RunConfig config, Backend& backend, Communicator& communicator, std::ostream& log)
    : config_(std::move(config)),
      backend_(backend),
      communicator_(communicator),
      log_(log),
      started_(std::chrono::steady_clock::now()) {
  if (config_.train_iters <= 0) throw UserError("--train-iters must be >= 1");
  if (config_.log_interval <= 0) throw UserError("--log-interval must be >= 1");
  if (config_.save_interval < 0) throw UserError("--save-interval must be >= 0");
  if (config_.eval_iters < 0) throw UserError("--eval-iters must be >= 0");
  if (config_.eval_interval < 0) throw UserError("--eval-interval must be >= 0");
  const TrainerConfig& t = config_.trainer;
  if (config_.schedule.items.empty())
    config_.schedule = single_stage_schedule(t.model.num_layers, t.batch.num_microbatches);
  trainer_ = std::make_unique<Trainer>(t, config_.schedule, backend, communicator);
  if (config_.batch_sizes && !config_.program_for) {
    if (t.step) throw std::invalid_argument("a batch-size ramp-up of a parallel run needs its program_for");
    const int layers = t.model.num_layers;
    config_.program_for = [layers](int count) {
      return RankProgram{single_stage_schedule(layers, count), {}};
    };
  }
  load_checkpoint();
  // Refuses a --save directory that another run trains into now or whose checkpoints are another run's.
  if (communicator_.world_rank() == 0)
    save_claim_ = checkpoint::claim_save_directory(config_.save, run_id_, run_id_resumed_ ? config_.load : "",
                                                   config_.overwrite_checkpoints);
  data::DataConfig data = config_.data;
  data.gpt.sequence_length = t.batch.seq;
  data.skip_empty_evaluation_splits = true;
  // Megatron's sample counts: train_iters, (train_iters / eval_interval + 1) * eval_iters and eval_iters
  // global batches; a split of weight 0 is not evaluated.
  // The ramp-up's iterations consume what the calculator gives; Megatron builds the split for
  // --train-samples.
  const std::int64_t gbs = t.global_batch_size();
  const std::int64_t train_samples = std::max(
      config_.train_samples, config_.batch_sizes ? config_.batch_sizes->samples_after(config_.train_iters)
                                                 : config_.train_iters * gbs);
  const std::array<double, 3> weights = data::parse_split(data.split);
  const std::int64_t evaluations =
      config_.eval_interval > 0 ? config_.train_iters / config_.eval_interval + 1 : 1;
  const std::int64_t valid_samples = weights[1] > 0 ? evaluations * config_.eval_iters * gbs : 0;
  const std::int64_t test_samples = weights[2] > 0 ? config_.eval_iters * gbs : 0;
  const data::TrainValidTestDatasets datasets =
      data::build_train_valid_test_datasets(data, {train_samples, valid_samples, test_samples});
  train_dataset_ = datasets.train;
  valid_dataset_ = datasets.valid;
  test_dataset_ = datasets.test;
  if (!train_dataset_) throw UserError("--split gives the training split no data; give it a non-zero weight");
  if (valid_samples > 0 && !valid_dataset_) log_ << "no validation: --split leaves its split no sequences\n";
  if (test_samples > 0 && !test_dataset_)
    log_ << "no test evaluation: --split leaves its split no sequences\n";
  if (!config_.trace.dir.empty()) tracer_ = std::make_unique<RankTracer>(config_.trace, backend_);
  if (config_.tensorboard_log_interval < 1) throw UserError("--tensorboard-log-interval must be >= 1");
  if (!config_.tensorboard_dir.empty() && communicator_.world_rank() == communicator_.world_size() - 1)
    tensorboard_ = std::make_unique<TensorBoardWriter>(config_.tensorboard_dir);
}

TrainingRun::~TrainingRun() = default;

void TrainingRun::save_checkpoint() {
  const int world = communicator_.world_size(), rank = communicator_.world_rank();
  if (world == 1) {
    checkpoint::CheckpointWriter writer(config_.save, trainer_->iteration(), {.run_id = run_id_});
    trainer_->save(writer);
    writer.commit();
  } else {
    // Every rank writes its shard; once all are written (the world sum is a barrier) rank 0 moves the
    // iteration into place and updates the tracker; nobody continues before that.
    checkpoint::CheckpointWriteOptions options;
    options.shard_name = rank_shard_name(rank);
    if (rank == 0) options.run_id = run_id_;  // rank 0 checks the directory's owner and records the id
    checkpoint::CheckpointWriter writer(config_.save, trainer_->iteration(), options);
    trainer_->save(writer);
    record_shard_coordinates(writer, communicator_, config_.layout_description);
    writer.commit_shard();
    trainer_->world_sum(0.0);
    if (rank == 0) {
      std::vector<std::string> shards;
      for (int r = 0; r < world; ++r) shards.push_back(rank_shard_name(r));
      checkpoint::CheckpointWriter::finalize_iteration(config_.save, trainer_->iteration(), shards);
    }
    trainer_->world_sum(0.0);
  }
  saved_iteration_ = trainer_->iteration();
  log_ << "saved checkpoint at iteration " << std::setw(8) << trainer_->iteration() << " to " << config_.save
       << "\n";
}

void TrainingRun::load_checkpoint() {
  if (!has_checkpoint(config_.load)) {  // cmd_train's check_load_path said so (or refused the path)
    run_id_ = checkpoint::new_run_id();
    return;
  }
  const int world = communicator_.world_size(), rank = communicator_.world_rank();
  // Every shard is checked against the tracker's iteration and the checksum shards.txt recorded for it
  // (SavedIteration), and against the rank its name says wrote it.
  const checkpoint::SavedIteration saved = checkpoint::SavedIteration::open_latest(config_.load);
  const bool parallel_save = !saved.single_shard();
  std::vector<checkpoint::CheckpointReader> shards;
  shards.push_back(saved.open_shard(parallel_save ? rank_shard_name(0) : checkpoint::kDefaultShardName));
  if (parallel_save) require_shard_of_rank(shards.front(), 0, shards.front());
  // A fine-tuning run is a run of its own: it saves under a new id (so it never adds iterations to the
  // run it started from) and counts from iteration 0.
  run_id_ = config_.finetune ? checkpoint::new_run_id() : checkpoint::run_id_for(&shards.front());
  run_id_resumed_ = !config_.finetune;
  const CheckpointLoadScope scope{config_.load_optimizer, !config_.finetune};
  const std::string saved_layout =
      shards.front().has_metadata("layout") ? shards.front().metadata_value("layout") : "a single rank";
  const std::string this_layout = world == 1 ? "a single rank" : config_.layout_description;
  if (saved_layout == this_layout) {
    if (world == 1) {
      trainer_->load(shards.front(), scope);
    } else {
      const checkpoint::CheckpointReader mine =
          rank == 0 ? std::move(shards.front()) : saved.open_shard(rank_shard_name(rank));
      if (rank != 0) require_shard_of_rank(mine, rank, shards.front());
      require_own_coordinates(mine, communicator_);
      trainer_->load(mine, scope);
    }
  } else {
    const std::int64_t saved_world =
        shards.front().has_metadata("world_size") ? shards.front().metadata_int("world_size") : 1;
    for (int r = 1; r < saved_world; ++r) {
      shards.push_back(saved.open_shard(rank_shard_name(r)));
      require_shard_of_rank(shards.back(), r, shards.front());
    }
    trainer_->load_resharded(shards, scope);
    log_ << "resharded the checkpoint saved under " << saved_layout << " to " << this_layout << "\n";
  }
  // Every rank must resume the same iteration (a save interrupted between shards is never in place, but a
  // --load directory assembled by hand could mix them).
  const double iterations = trainer_->world_sum(static_cast<double>(trainer_->iteration()));
  if (iterations != static_cast<double>(trainer_->iteration()) * world)
    throw UserError("--load " + config_.load +
                    ": the ranks' checkpoints hold different iterations; resume from "
                    "a directory written by one run");
  if (config_.finetune) {
    log_ << "loaded the weights of checkpoint " << saved.directory()
         << " for fine-tuning (--finetune): iteration, data position and optimizer state start anew\n";
    return;
  }
  log_ << "loaded checkpoint " << saved.directory() << " at iteration " << trainer_->iteration()
       << " (consumed samples " << trainer_->consumed_samples() << ")"
       << (config_.load_optimizer ? "" : "; the optimizer state starts anew (--no-load-optim)") << "\n";
}

void TrainingRun::log_moe_rows() {
  for (int c = 0; c < trainer_->num_chunks(); ++c) {
    const MoeLayers* moe = trainer_->model(c).moe_layers();
    if (moe == nullptr || moe->layers() == 0) continue;
    const MoeRowArena& rows = moe->expert_rows();
    log_ << "memory: MoE expert rows" << (trainer_->num_chunks() > 1 ? " of chunk " + std::to_string(c) : "")
         << ": " << rows.capacity_rows() << " per layer and micro-batch (began at " << rows.start_rows()
         << ", grown " << rows.growths() << " time" << (rows.growths() == 1 ? "" : "s")
         << " by steps that routed more; at most " << rows.bound_rows() << ")" << std::endl;
  }
  if (backend_.block_bytes() > 0)
    log_ << "memory: " << std::fixed << std::setprecision(1)
         << static_cast<double>(backend_.block_bytes()) / (1 << 20) << " MiB outside the arena"
         << std::defaultfloat << std::endl;
}

void TrainingRun::evaluate(data::PretrainingDataLoader& loader, const std::string& split, bool final) {
  const TrainerConfig& t = config_.trainer;
  std::vector<MicroBatch> microbatches(t.batch.num_microbatches);
  EvaluationRecord record;
  record.iteration = trainer_->iteration();
  record.split = split;
  record.final = final;
  double loss_sum = 0;
  for (std::int64_t i = 0; i < config_.eval_iters; ++i) {
    for (MicroBatch& mb : microbatches)
      if (!loader.next(mb))
        throw UserError("the " + split + " data ran out before --eval-iters; lower --eval-iters");
    const EvaluationResult result = trainer_->evaluate(microbatches);
    loss_sum += result.loss_sum;
    record.tokens += result.tokens;
  }
  record.loss = record.tokens > 0 ? loss_sum / record.tokens : std::nan("");
  std::string prefix = "iteration " + std::to_string(record.iteration);
  if (final) prefix += " on " + split + " set";
  log_ << format_evaluation_lines(prefix, record.loss) << std::endl;
  if (tensorboard_) {  // Megatron's evaluate_and_print_results scalars
    const std::string tag = split == "test" ? "lm loss test" : "lm loss validation";
    tensorboard_->add_scalar(tag, record.loss, record.iteration);
    tensorboard_->add_scalar(tag + " vs samples", record.loss, trainer_->consumed_samples());
    tensorboard_->add_scalar(tag + " ppl", std::exp(std::min(20.0, record.loss)), record.iteration);
    tensorboard_->add_scalar(tag + " ppl vs samples", std::exp(std::min(20.0, record.loss)),
                             trainer_->consumed_samples());
    tensorboard_->flush();
  }
  evaluations_.push_back(record);
}

std::string TrainingRun::exit_reason(std::int64_t iteration) {
  if (config_.exit_duration_s > 0) {
    const double minutes =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count() / 60.0;
    // Every rank decides alike (Megatron's MAX all-reduce of each rank's own clock).
    if (trainer_->world_sum(minutes * 60.0 > config_.exit_duration_s ? 1.0 : 0.0) > 0.0) {
      std::ostringstream why;
      why << "exiting program after " << minutes << " minutes";
      return why.str();
    }
  }
  if (config_.exit_interval > 0 && iteration % config_.exit_interval == 0 && iteration < config_.train_iters)
    return "exiting program at iteration " + std::to_string(iteration);
  return "";
}

bool TrainingRun::follow_batch_size_rampup() {
  if (!config_.batch_sizes) return false;
  const int count = config_.batch_sizes->num_microbatches(trainer_->consumed_samples());
  if (count == trainer_->num_microbatches()) return false;
  if (count > trainer_->microbatch_capacity())
    throw UserError("--rampup-batch-size: the global batch after " +
                    std::to_string(trainer_->consumed_samples()) + " samples exceeds --global-batch-size");
  const RankProgram program = config_.program_for(count);
  trainer_->set_num_microbatches(count, program.schedule, program.step);
  return true;
}

std::vector<IterationRecord> TrainingRun::run() {
  const TrainerConfig& t = config_.trainer;
  data::DataLoaderConfig loader_config;
  loader_config.global_batch_size = t.global_batch_size();
  loader_config.micro_batch_size = t.batch.micro_batch;
  loader_config.data_parallel_rank = config_.data_parallel_rank;
  loader_config.data_parallel_size = t.data_parallel_size;
  loader_config.consumed_samples = trainer_->consumed_samples();
  data::PretrainingDataLoader loader(train_dataset_, loader_config);
  // The validation split is read on across evaluations; a resumed run skips what the evaluations before
  // its checkpoint read.
  const bool do_valid = valid_dataset_ && config_.eval_iters > 0,
             do_test = test_dataset_ && config_.eval_iters > 0;
  std::optional<data::PretrainingDataLoader> valid_loader, test_loader;
  if (do_valid) {
    data::DataLoaderConfig valid_config = loader_config;
    valid_config.consumed_samples =
        config_.eval_interval > 0
            ? trainer_->iteration() / config_.eval_interval * config_.eval_iters * t.global_batch_size()
            : 0;
    valid_loader.emplace(valid_dataset_, valid_config);
  }
  if (do_test) {
    data::DataLoaderConfig test_config = loader_config;
    test_config.consumed_samples = 0;
    test_loader.emplace(test_dataset_, test_config);
  }
  // The batch of the samples consumed so far (a resumed ramp-up continues at its checkpoint's batch).
  follow_batch_size_rampup();
  if (config_.batch_sizes && trainer_->iteration() == 0 && !config_.batch_sizes->describe().empty())
    log_ << config_.batch_sizes->describe() << std::endl;
  std::vector<MicroBatch> microbatches;
  std::vector<IterationRecord> records;
  const double flops_per_sample = config_.flops_per_iteration / static_cast<double>(t.global_batch_size());

  double interval_time_s = 0, interval_loss = 0, interval_balance = 0, interval_samples = 0;
  std::vector<double> interval_mtp;  // per MTP layer
  std::int64_t interval_iters = 0, interval_skipped = 0;
  while (trainer_->iteration() < config_.train_iters) {
    // Megatron saves a checkpoint (with --save) when the ramp-up changes the micro-batch count.
    const std::int64_t before = trainer_->iteration(),
                       previous_batch = trainer_->config().global_batch_size();
    if (follow_batch_size_rampup()) {
      log_ << "ramping up batch size from " << previous_batch << " to "
           << trainer_->config().global_batch_size() << std::endl;
      if (!config_.save.empty() && before != 0 && saved_iteration_ != before) save_checkpoint();
    }
    const std::int64_t batch_samples = trainer_->config().global_batch_size();
    microbatches.resize(static_cast<std::size_t>(trainer_->num_microbatches()));
    for (MicroBatch& mb : microbatches)
      if (!loader.next(mb))
        throw UserError("the training data ran out before --train-iters; lower --train-iters");
    IterationRecord record;
    const bool recording = config_.record_first_iteration && records.empty();
    backend_.recorder().set_enabled(recording);
    if (tracer_) tracer_->before_step(trainer_->iteration() + 1);
    record.step = trainer_->train_step(microbatches);
    if (recording) backend_.recorder().set_enabled(false);
    record.iteration = trainer_->iteration();
    if (tracer_) tracer_->after_step(record.iteration, record.step);
    records.push_back(record);
    interval_time_s += record.step.elapsed_s;
    interval_samples += static_cast<double>(batch_samples);
    interval_loss += record.step.skipped ? 0.0 : record.step.loss;
    interval_balance += record.step.skipped ? 0.0 : record.step.load_balancing_loss;
    interval_mtp.resize(record.step.mtp_losses.size(), 0.0);
    for (std::size_t k = 0; k < interval_mtp.size() && !record.step.skipped; ++k)
      interval_mtp[k] += record.step.mtp_losses[k];
    interval_skipped += record.step.skipped ? 1 : 0;
    ++interval_iters;
    if (tensorboard_ && record.iteration % config_.tensorboard_log_interval == 0) {
      // Megatron's training_log scalars, each also against the consumed samples.
      const std::int64_t samples = trainer_->consumed_samples();
      const auto both = [&](const std::string& tag, double value) {
        tensorboard_->add_scalar(tag, value, record.iteration);
        tensorboard_->add_scalar(tag + " vs samples", value, samples);
      };
      both("learning-rate", trainer_->current_learning_rate());
      both("batch-size", static_cast<double>(batch_samples));
      if (!record.step.skipped) {
        both("lm loss", record.step.loss);
        both("grad-norm", record.step.grad_norm);
        if (record.step.load_balancing_loss >= 0)
          both("load_balancing_loss", record.step.load_balancing_loss);
        for (std::size_t k = 0; k < record.step.mtp_losses.size(); ++k)
          both("mtp_" + std::to_string(k + 1) + " loss", record.step.mtp_losses[k]);
      }
      tensorboard_->add_scalar("world-size", static_cast<double>(communicator_.world_size()),
                               record.iteration);
    }
    if (record.iteration % config_.log_interval == 0 || record.iteration == config_.train_iters) {
      LogInterval v;
      v.iteration = record.iteration;
      v.train_iters = config_.train_iters;
      v.consumed_samples = trainer_->consumed_samples();
      v.global_batch_size = batch_samples;
      const double seconds = interval_time_s / static_cast<double>(interval_iters);
      v.elapsed_ms_per_iteration = seconds * 1e3;
      // Megatron's FLOPs since the last log over its time: the ramp-up's batches counted as run.
      v.tflops_per_gpu = flops_per_sample * interval_samples / (interval_time_s * 1e12 * config_.gpus);
      v.mfu_percent = config_.peak_tflops > 0 ? 100.0 * v.tflops_per_gpu / config_.peak_tflops : -1.0;
      v.learning_rate = trainer_->current_learning_rate();
      const std::int64_t counted = interval_iters - interval_skipped;
      v.loss = counted > 0 ? interval_loss / static_cast<double>(counted) : std::nan("");
      if (record.step.load_balancing_loss >= 0 && counted > 0)
        v.load_balancing_loss = interval_balance / static_cast<double>(counted);
      for (double sum : interval_mtp)
        v.mtp_losses.push_back(counted > 0 ? sum / static_cast<double>(counted) : std::nan(""));
      interval_mtp.assign(interval_mtp.size(), 0.0);
      v.grad_norm = record.step.grad_norm;
      v.skipped_iterations = interval_skipped;
      log_ << format_log_line(v) << std::endl;
      if (tensorboard_) {  // Megatron's --log-throughput and timer scalars, at the log interval
        tensorboard_->add_scalar("iteration-time", seconds, record.iteration);
        tensorboard_->add_scalar("throughput", v.tflops_per_gpu, record.iteration);
        if (v.mfu_percent >= 0) tensorboard_->add_scalar("mfu", v.mfu_percent, record.iteration);
        tensorboard_->add_scalar("mem-arena-bytes", static_cast<double>(backend_.arena_capacity_bytes()),
                                 record.iteration);
        tensorboard_->flush();
      }
      interval_time_s = interval_loss = interval_balance = interval_samples = 0;
      interval_iters = interval_skipped = 0;
    }
    if (do_valid && config_.eval_interval > 0 && record.iteration % config_.eval_interval == 0)
      evaluate(*valid_loader, "validation", false);
    const bool saved_now =
        !config_.save.empty() && config_.save_interval > 0 && record.iteration % config_.save_interval == 0;
    if (saved_now) save_checkpoint();
    if (const std::string why = exit_reason(record.iteration); !why.empty()) {
      // Megatron's exit: save first (unless this iteration just did), no evaluation after training.
      if (!config_.save.empty() && !saved_now) save_checkpoint();
      log_ << "[" << why << "] datetime: " << timestamp() << " " << std::endl;
      if (tracer_) tracer_->finish();
      if (tensorboard_) tensorboard_->flush();
      return records;
    }
  }
  log_moe_rows();
  if (do_valid) evaluate(*valid_loader, "validation", true);
  if (do_test) evaluate(*test_loader, "test", true);
  const bool saved_last = config_.save_interval > 0 && trainer_->iteration() % config_.save_interval == 0;
  if (!config_.save.empty() && !records.empty() && !saved_last) save_checkpoint();
  if (tracer_) tracer_->finish();
  if (tensorboard_) tensorboard_->flush();
  return records;
}

}  // namespace megatune::executor
