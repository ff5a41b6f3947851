// Trainer: the iteration (schedule -> forward/backward, grad sync, norm, AdamW) and its checkpoint state.
#include "executor/training/trainer.h"

#include <chrono>
#include <cmath>
#include <stdexcept>

#include "executor/checkpoint/checkpoint_reader.h"
#include "executor/checkpoint/checkpoint_writer.h"
#include "layouts/user_error.h"

namespace megatune::executor {

using layouts::OpPhase;
using layouts::ScheduleItemKind;

namespace {
struct OptimizerState {
  Tensor exp_avg, exp_avg_sq;  // (1, total) fp32
};
OptimizerState allocate_optimizer_state(Backend& backend, std::int64_t total) {
  OptimizerState state;
  state.exp_avg = backend.allocate(DType::kFP32, 1, total, "AdamW exp_avg, exp_avg_sq (fp32)");
  state.exp_avg_sq = backend.allocate(DType::kFP32, 1, total, "AdamW exp_avg, exp_avg_sq (fp32)");
  return state;
}
}  // namespace

std::vector<ArenaUse> size_training_arena(const TrainerConfig& config, Backend& backend) {
  SingleRankCommunicator communicator(backend);
  backend.begin_sizing();
  GPTModel model(config.model, config.batch, config.recompute, config.compute_dtype, backend, communicator);
  allocate_optimizer_state(backend, model.layout().total_elements());
  backend.end_sizing();
  return backend.arena_breakdown();
}

Trainer::Trainer(const TrainerConfig& config, const layouts::RankSchedule& schedule, Backend& backend,
                 Communicator& communicator)
    : config_(config),
      schedule_(schedule),
      backend_(backend),
      communicator_(communicator),
      schedule_lr_(config.lr) {
  if (schedule_.pp != 1 || schedule_.vpp != 1)
    throw UserError(
        "the executor runs --pipeline-model-parallel-size 1 only so far; plan PP layouts with `megatune "
        "plan`");
  if (schedule_.num_microbatches != config_.batch.num_microbatches)
    throw std::invalid_argument("schedule and batch disagree on the number of micro-batches");
  for (const layouts::ScheduleItem& item : schedule_.items)
    if (item.kind == ScheduleItemKind::kP2p)
      throw std::invalid_argument("p2p item in a single-stage schedule");
  backend_.begin_sizing();
  build(true);
  const std::int64_t bytes = backend_.end_sizing();
  backend_.reserve_arena(bytes);
  build(false);
  model_->initialize_parameters(config_.seed);
}

void Trainer::build(bool sizing) {
  model_ = std::make_unique<GPTModel>(config_.model, config_.batch, config_.recompute, config_.compute_dtype,
                                      backend_, communicator_);
  const std::int64_t total = model_->layout().total_elements();
  const OptimizerState state = allocate_optimizer_state(backend_, total);
  exp_avg_ = state.exp_avg;
  exp_avg_sq_ = state.exp_avg_sq;
  if (sizing) return;
  std::vector<OptimizerTensor> tensors;
  for (const ParameterEntry& e : model_->layout().entries()) {
    OptimizerTensor t;
    t.main_param = model_->view(model_->main_params(), e);
    t.main_grad = model_->view(model_->grads(), e);
    t.exp_avg = model_->view(exp_avg_, e);
    t.exp_avg_sq = model_->view(exp_avg_sq_, e);
    t.model_param = model_->view(model_->model_params(), e);
    t.apply_weight_decay = e.weight_decay;
    tensors.push_back(t);
  }
  backend_.prepare_optimizer(std::move(tensors));
}

StepResult Trainer::train_step(const std::vector<MicroBatch>& microbatches) {
  if (static_cast<int>(microbatches.size()) != config_.batch.num_microbatches)
    throw std::invalid_argument("train_step: wrong number of micro-batches");
  const auto start = std::chrono::steady_clock::now();
  OpRecorder& recorder = backend_.recorder();
  model_->zero_gradients();
  for (const layouts::ScheduleItem& item : schedule_.items) {
    recorder.set_position(item.microbatch, item.chunk);
    if (item.kind == ScheduleItemKind::kForward) {
      model_->forward(microbatches.at(item.microbatch), item.microbatch);
    } else if (item.kind == ScheduleItemKind::kBackward) {
      model_->backward(item.microbatch);
    }
  }
  recorder.set_position(-1, -1);
  // Data-parallel gradient reduction (Megatron's grad buffer all-reduce over dp-cp); a no-op on one rank.
  if (communicator_.size(CommGroup::kDataContext) > 1)
    communicator_.all_reduce(CommGroup::kDataContext, model_->grads(), ReduceOp::kSum,
                             {"grad_bucket", -1, OpPhase::kGradSync});

  StepResult result;
  result.learning_rate = schedule_lr_.lr(consumed_samples_);
  result.grad_norm = backend_.grad_norm({"grad_norm", -1, OpPhase::kOptimizer});
  result.skipped = !std::isfinite(result.grad_norm);
  if (!result.skipped) {
    AdamWHyper hyper;
    hyper.lr = static_cast<float>(result.learning_rate);
    hyper.beta1 = static_cast<float>(config_.optimizer.beta1);
    hyper.beta2 = static_cast<float>(config_.optimizer.beta2);
    hyper.eps = static_cast<float>(config_.optimizer.eps);
    hyper.weight_decay = static_cast<float>(config_.optimizer.weight_decay);
    hyper.step = iteration_ - skipped_iterations_ + 1;
    hyper.max_grad_norm = static_cast<float>(config_.optimizer.clip_grad);
    backend_.adamw_step(hyper, {"adamw", -1, OpPhase::kOptimizer});
  } else {
    ++skipped_iterations_;
  }
  const std::vector<double> losses = model_->microbatch_losses();  // synchronizes
  double sum = 0.0;
  for (double l : losses) sum += l;
  result.loss = sum / static_cast<double>(losses.size());
  ++iteration_;
  consumed_samples_ += config_.global_batch_size();
  backend_.synchronize();
  result.elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

void Trainer::save(checkpoint::CheckpointWriter& writer) const {
  const std::vector<float> params = model_->main_parameters();
  const std::int64_t total = model_->layout().total_elements();
  std::vector<float> m(total), v(total);
  backend_.download(exp_avg_, m.data());
  backend_.download(exp_avg_sq_, v.data());
  for (const ParameterEntry& e : model_->layout().entries()) {
    const std::vector<std::int64_t> shape =
        e.rows == 1 ? std::vector<std::int64_t>{e.cols} : std::vector<std::int64_t>{e.rows, e.cols};
    writer.add_tensor("model." + e.name, checkpoint::TensorDType::fp32, shape, params.data() + e.offset);
    writer.add_tensor("optimizer.exp_avg." + e.name, checkpoint::TensorDType::fp32, shape,
                      m.data() + e.offset);
    writer.add_tensor("optimizer.exp_avg_sq." + e.name, checkpoint::TensorDType::fp32, shape,
                      v.data() + e.offset);
  }
  writer.add_metadata_int("iteration", iteration_);
  writer.add_metadata_int("consumed_samples", consumed_samples_);
  writer.add_metadata_int("skipped_iterations", skipped_iterations_);
  writer.add_metadata_int("seed", static_cast<std::int64_t>(config_.seed));
  writer.add_metadata("model_config", config_.model.describe());
  writer.add_metadata("lr_decay_style", to_string(config_.lr.style));
}

void Trainer::load(const checkpoint::CheckpointReader& reader) {
  reader.require_metadata_equal("model_config", config_.model.describe());
  const std::int64_t total = model_->layout().total_elements();
  std::vector<float> params(total, 0.0f), m(total, 0.0f), v(total, 0.0f);
  for (const ParameterEntry& e : model_->layout().entries()) {
    const std::vector<std::int64_t> shape =
        e.rows == 1 ? std::vector<std::int64_t>{e.cols} : std::vector<std::int64_t>{e.rows, e.cols};
    reader.read_tensor("model." + e.name, checkpoint::TensorDType::fp32, shape, params.data() + e.offset);
    reader.read_tensor("optimizer.exp_avg." + e.name, checkpoint::TensorDType::fp32, shape,
                       m.data() + e.offset);
    reader.read_tensor("optimizer.exp_avg_sq." + e.name, checkpoint::TensorDType::fp32, shape,
                       v.data() + e.offset);
  }
  model_->set_main_parameters(params);
  backend_.upload(exp_avg_, m.data());
  backend_.upload(exp_avg_sq_, v.data());
  iteration_ = reader.metadata_int("iteration");
  consumed_samples_ = reader.metadata_int("consumed_samples");
  skipped_iterations_ = reader.metadata_int("skipped_iterations");
}

}  // namespace megatune::executor

namespace megatune::executor {
layouts::RankSchedule single_stage_schedule(int num_layers, int num_microbatches) {
  return layouts::build_rank_schedule(layouts::PipelineLayout::uniform(num_layers, 1), num_microbatches, 1,
                                      0);
}
}  // namespace megatune::executor
