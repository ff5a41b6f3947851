// Trainer: the iteration (schedule -> forward/backward, grad sync, norm, AdamW) and its checkpoint state.
#include "executor/training/trainer.h"

#include <chrono>
#include <cmath>
#include <map>
#include <stdexcept>

#include "executor/checkpoint/checkpoint_reader.h"
#include "executor/checkpoint/checkpoint_writer.h"
#include "layouts/user_error.h"

namespace megatune::executor {

using layouts::OpPhase;
using layouts::P2pDirection;
using layouts::P2pTensor;
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

std::vector<StageSpan> resolved_chunks(const TrainerConfig& config) {
  return config.chunks.empty() ? std::vector<StageSpan>{StageSpan{}} : config.chunks;
}

BatchShape chunk_batch(const TrainerConfig& config, int slots) {
  BatchShape batch = config.batch;
  batch.activation_slots = slots;
  batch.gradient_average_ranks = config.data_parallel_size;
  return batch;
}

// A (1, n) view of a 1-D slice of a flat fp32 buffer.
Tensor flat_view(Tensor buffer, std::int64_t offset, std::int64_t n) {
  Tensor v = buffer;
  if (buffer.data != nullptr) v.data = static_cast<float*>(buffer.data) + offset;
  v.rows = 1;
  v.cols = n;
  v.row_stride = n;
  return v;
}

// Recording off for bookkeeping collectives the step program does not hold (the logged loss).
class RecordingPause {
 public:
  explicit RecordingPause(OpRecorder& recorder) : recorder_(recorder), was_(recorder.enabled()) {
    recorder_.set_enabled(false);
  }
  ~RecordingPause() { recorder_.set_enabled(was_); }

 private:
  OpRecorder& recorder_;
  bool was_;
};

}  // namespace

std::vector<int> activation_slots_per_chunk(const layouts::RankSchedule& schedule,
                                            const std::vector<StageSpan>& chunks) {
  const int n = static_cast<int>(chunks.size());
  std::vector<int> peak(n, 1);
  std::vector<std::vector<bool>> live(n, std::vector<bool>(schedule.num_microbatches, false));
  std::vector<int> count(n, 0);
  auto acquire = [&](int chunk, int mb) {
    if (!live.at(chunk).at(mb)) {
      live[chunk][mb] = true;
      peak[chunk] = std::max(peak[chunk], ++count[chunk]);
    }
  };
  auto release = [&](int chunk, int mb) {
    if (live.at(chunk).at(mb)) {
      live[chunk][mb] = false;
      --count[chunk];
    }
  };
  for (const layouts::ScheduleItem& item : schedule.items) {
    if (item.kind == ScheduleItemKind::kForward) acquire(item.chunk, item.microbatch);
    if (item.kind == ScheduleItemKind::kBackward && chunks.at(item.chunk).has_embedding)
      release(item.chunk, item.microbatch);
    if (item.kind != ScheduleItemKind::kP2p) continue;
    // A batch's receive buffers are taken before its sent gradients' slots are free (both are in flight).
    for (const layouts::P2pTransfer& t : item.transfers)
      if (t.direction == P2pDirection::kRecv && t.tensor == P2pTensor::kActivation) acquire(t.chunk, t.microbatch);
    for (const layouts::P2pTransfer& t : item.transfers)
      if (t.direction == P2pDirection::kSend && t.tensor == P2pTensor::kGradient) release(t.chunk, t.microbatch);
  }
  return peak;
}

std::vector<ArenaUse> size_training_arena(const TrainerConfig& config, Backend& backend) {
  SingleRankCommunicator communicator(backend);
  backend.begin_sizing();
  for (const StageSpan& stage : resolved_chunks(config)) {
    GPTModel model(config.model, chunk_batch(config, 1), config.recompute, config.compute_dtype, backend,
                   communicator, stage);
    allocate_optimizer_state(backend, model.layout().total_elements());
  }
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
  const std::vector<StageSpan> chunks = resolved_chunks(config_);
  if (schedule_.vpp != static_cast<int>(chunks.size()))
    throw std::invalid_argument("the schedule has " + std::to_string(schedule_.vpp) + " model chunks, the " +
                                "trainer config " + std::to_string(chunks.size()));
  if (schedule_.num_microbatches != config_.batch.num_microbatches)
    throw std::invalid_argument("schedule and batch disagree on the number of micro-batches");
  if (communicator_.size(CommGroup::kPipeline) != schedule_.pp)
    throw std::invalid_argument("the communicator's pipeline group has " +
                                std::to_string(communicator_.size(CommGroup::kPipeline)) +
                                " ranks, the schedule " + std::to_string(schedule_.pp));
  if (communicator_.size(CommGroup::kDataContext) != config_.data_parallel_size)
    throw std::invalid_argument("the communicator's data-parallel group has " +
                                std::to_string(communicator_.size(CommGroup::kDataContext)) +
                                " ranks, the trainer config " + std::to_string(config_.data_parallel_size));
  slots_per_chunk_ = activation_slots_per_chunk(schedule_, chunks);
  last_backward_item_.assign(chunks.size(), -1);
  for (int i = 0; i < static_cast<int>(schedule_.items.size()); ++i)
    if (schedule_.items[i].kind == ScheduleItemKind::kBackward) last_backward_item_.at(schedule_.items[i].chunk) = i;
  backend_.begin_sizing();
  build(true);
  const std::int64_t bytes = backend_.end_sizing();
  backend_.reserve_arena(bytes);
  build(false);
  for (auto& chunk : chunks_) chunk->initialize_parameters(config_.seed);
}

void Trainer::build(bool sizing) {
  const std::vector<StageSpan> chunks = resolved_chunks(config_);
  chunks_.clear();
  optimizer_state_.clear();
  std::int64_t sp_elements = 0;
  for (std::size_t c = 0; c < chunks.size(); ++c) {
    chunks_.push_back(std::make_unique<GPTModel>(config_.model, chunk_batch(config_, slots_per_chunk_[c]),
                                                 config_.recompute, config_.compute_dtype, backend_,
                                                 communicator_, chunks[c]));
    const OptimizerState state = allocate_optimizer_state(backend_, chunks_.back()->layout().total_elements());
    optimizer_state_.push_back({state.exp_avg, state.exp_avg_sq});
    for (const ParameterEntry* e : chunks_.back()->sequence_parallel_grad_entries()) sp_elements += e->numel();
  }
  sp_norm_grads_ = sp_elements > 0 ? backend_.allocate(DType::kFP32, 1, sp_elements, "sequence-parallel norm grads")
                                   : Tensor{};
  scalar_ = backend_.allocate(DType::kFP32, 1, 2, "grad norm and loss reductions");
  if (sizing) return;
  std::vector<OptimizerTensor> tensors;
  for (std::size_t c = 0; c < chunks_.size(); ++c) {
    const GPTModel& model = *chunks_[c];
    for (const ParameterEntry& e : model.layout().entries()) {
      OptimizerTensor t;
      t.main_param = model.view(model.main_params(), e);
      t.main_grad = model.view(model.grads(), e);
      t.exp_avg = model.view(optimizer_state_[c].exp_avg, e);
      t.exp_avg_sq = model.view(optimizer_state_[c].exp_avg_sq, e);
      t.model_param = model.view(model.model_params(), e);
      t.apply_weight_decay = e.weight_decay;
      tensors.push_back(t);
    }
  }
  backend_.prepare_optimizer(std::move(tensors));
}

void Trainer::run_p2p(const layouts::ScheduleItem& item) {
  std::vector<P2pTransferArgs> transfers;
  for (const layouts::P2pTransfer& t : item.transfers) {
    GPTModel& model = *chunks_.at(t.chunk);
    P2pTransferArgs a;
    a.send = t.direction == P2pDirection::kSend;
    const bool activation = t.tensor == P2pTensor::kActivation;
    if (activation)
      a.tensor = a.send ? model.stage_output(t.microbatch) : model.stage_input(t.microbatch);
    else
      a.tensor = a.send ? model.input_grad(t.microbatch) : model.output_grad(t.microbatch);
    a.peer_rank = communicator_.global_rank(CommGroup::kPipeline, t.peer_pp_rank);
    a.tag = {activation ? "p2p_activation" : "p2p_gradient", -1,
             activation ? OpPhase::kForward : OpPhase::kBackward,
             activation ? layouts::OpRole::kP2pActivation : layouts::OpRole::kP2pGradient};
    a.microbatch = t.microbatch;
    a.chunk = t.chunk;
    transfers.push_back(a);
  }
  communicator_.batch_p2p(CommGroup::kPipeline, transfers);
  // A sent input gradient ends its micro-batch's use of the chunk's activation slot.
  for (const layouts::P2pTransfer& t : item.transfers)
    if (t.direction == P2pDirection::kSend && t.tensor == P2pTensor::kGradient)
      chunks_.at(t.chunk)->release(t.microbatch);
}

void Trainer::reduce_chunk_gradients(int chunk) {
  // Megatron's grad buffer reduced over dp-cp (the loss gradient is already scaled to the mean over the
  // data-parallel ranks, so the reduction is a sum).
  if (communicator_.size(CommGroup::kDataContext) <= 1) return;
  OpRecorder& recorder = backend_.recorder();
  recorder.set_position(-1, chunk);
  pending_reductions_.push_back(communicator_.all_reduce_async(
      CommGroup::kDataContext, chunks_[chunk]->grads(), ReduceOp::kSum, {"grad_bucket", -1, OpPhase::kGradSync, layouts::OpRole::kGradReduce}));
}

void Trainer::run_schedule(const std::vector<MicroBatch>& microbatches) {
  OpRecorder& recorder = backend_.recorder();
  std::vector<int> deferred;  // chunks whose reduction waits for the end of the schedule
  for (int i = 0; i < static_cast<int>(schedule_.items.size()); ++i) {
    const layouts::ScheduleItem& item = schedule_.items[i];
    if (item.kind == ScheduleItemKind::kP2p) {
      run_p2p(item);
      continue;
    }
    recorder.set_position(item.microbatch, item.chunk);
    GPTModel& model = *chunks_.at(item.chunk);
    if (item.kind == ScheduleItemKind::kForward) {
      model.forward(microbatches.at(item.microbatch), item.microbatch);
      continue;
    }
    model.backward(item.microbatch);
    if (i == last_backward_item_[item.chunk]) {
      if (config_.overlap_grad_reduce)
        reduce_chunk_gradients(item.chunk);
      else
        deferred.push_back(item.chunk);
    }
  }
  for (int chunk : deferred) reduce_chunk_gradients(chunk);
  recorder.set_position(-1, -1);
  for (CommHandle& h : pending_reductions_)
    if (h) h->wait();
  pending_reductions_.clear();
}

void Trainer::finish_gradients() {
  // Tied word embedding under pipelining: the first stage's table and the last stage's copy hold one
  // parameter; their gradients are summed over the embedding group.
  if (config_.model.tied_embeddings && schedule_.pp > 1)
    for (auto& chunk : chunks_) {
      const StageSpan& st = chunk->stage();
      if (!st.has_embedding && !st.has_loss) continue;
      const ParameterEntry& e = chunk->layout().find("embedding.word_embeddings.weight");
      communicator_.all_reduce(CommGroup::kEmbedding, chunk->view(chunk->grads(), e), ReduceOp::kSum,
                               {"embedding_grad_ar", -1, OpPhase::kOptimizer, layouts::OpRole::kEmbeddingGradReduce});
    }
  // Sequence parallelism: each TP rank's norm gradients cover its sequence shard; sum them over TP.
  if (!sp_norm_grads_.empty()) {
    std::int64_t at = 0;
    for (auto& chunk : chunks_)
      for (const ParameterEntry* e : chunk->sequence_parallel_grad_entries()) {
        backend_.copy(flat_view(chunk->grads(), e->offset, e->numel()), flat_view(sp_norm_grads_, at, e->numel()));
        at += e->numel();
      }
    communicator_.all_reduce(CommGroup::kTensor, sp_norm_grads_, ReduceOp::kSum,
                             {"sp_norm_grad_ar", -1, OpPhase::kOptimizer, layouts::OpRole::kSequenceParallelNormGrad});
    at = 0;
    for (auto& chunk : chunks_)
      for (const ParameterEntry* e : chunk->sequence_parallel_grad_entries()) {
        backend_.copy(flat_view(sp_norm_grads_, at, e->numel()), flat_view(chunk->grads(), e->offset, e->numel()));
        at += e->numel();
      }
  }
}

double Trainer::global_grad_norm() {
  // This rank's sum of squares over the gradients it holds, less the copies another rank also counts:
  // parameters replicated over TP count on TP rank 0 only, the last stage's copy of a tied embedding not at
  // all (the first stage counts it), and every data-parallel rank holds the same gradients (dp rank 0 counts).
  const double local = backend_.grad_norm({"grad_norm", -1, OpPhase::kOptimizer});
  double sum_sq = local * local;
  const bool tp_duplicate = communicator_.rank(CommGroup::kTensor) != 0;
  auto subtract = [&](const GPTModel& model, const ParameterEntry& e) {
    std::vector<float> host(static_cast<std::size_t>(e.numel()));
    backend_.download(model.view(model.grads(), e), host.data());
    for (float g : host) sum_sq -= static_cast<double>(g) * g;
  };
  for (auto& chunk : chunks_)
    for (const ParameterEntry& e : chunk->layout().entries()) {
      const bool tied_copy = config_.model.tied_embeddings && schedule_.pp > 1 && !chunk->stage().has_embedding &&
                             e.name == "embedding.word_embeddings.weight";
      if (tied_copy || (tp_duplicate && e.split == TensorParallelSplit::kReplicated)) subtract(*chunk, e);
    }
  if (communicator_.rank(CommGroup::kDataContext) != 0) sum_sq = 0.0;
  if (!std::isfinite(local)) sum_sq = local;  // keep the non-finite verdict
  if (communicator_.world_size() > 1) {
    const float values[2] = {static_cast<float>(std::max(0.0, sum_sq)), 0.0f};
    backend_.upload(scalar_, values);
    communicator_.all_reduce(CommGroup::kWorld, flat_view(scalar_, 0, 1), ReduceOp::kSum,
                             {"grad_norm_ar", -1, OpPhase::kOptimizer, layouts::OpRole::kGradNormReduce});
    float reduced[2];
    backend_.download(scalar_, reduced);
    sum_sq = std::isfinite(local) ? reduced[0] : local;
  }
  const double norm = std::isfinite(sum_sq) ? std::sqrt(std::max(0.0, sum_sq)) : sum_sq;
  backend_.set_grad_norm(static_cast<float>(norm));
  return norm;
}

double Trainer::reported_loss() {
  // The last pipeline stage holds the losses; their mean over the data-parallel ranks is what Megatron logs.
  bool holds_loss = false;
  double sum = 0.0;
  for (auto& chunk : chunks_)
    if (chunk->stage().has_loss) {
      holds_loss = true;
      const std::vector<double> losses = chunk->microbatch_losses();  // synchronizes
      for (double l : losses) sum += l;
      sum /= static_cast<double>(losses.size());
    }
  if (communicator_.world_size() == 1) return sum;
  const bool counts = holds_loss && communicator_.rank(CommGroup::kTensor) == 0;
  return world_sum(counts ? sum : 0.0) / static_cast<double>(config_.data_parallel_size);
}

double Trainer::world_sum(double value) {
  if (communicator_.world_size() == 1) return value;
  const float values[2] = {static_cast<float>(value), 0.0f};
  RecordingPause pause(backend_.recorder());
  backend_.upload(scalar_, values);
  communicator_.all_reduce(CommGroup::kWorld, flat_view(scalar_, 0, 1), ReduceOp::kSum,
                           {"world_sum", -1, OpPhase::kOptimizer});
  float reduced[2];
  backend_.download(scalar_, reduced);
  return reduced[0];
}

StepResult Trainer::train_step(const std::vector<MicroBatch>& microbatches) {
  if (static_cast<int>(microbatches.size()) != config_.batch.num_microbatches)
    throw std::invalid_argument("train_step: wrong number of micro-batches");
  const auto start = std::chrono::steady_clock::now();
  for (auto& chunk : chunks_) chunk->zero_gradients();
  run_schedule(microbatches);
  finish_gradients();

  StepResult result;
  result.learning_rate = schedule_lr_.lr(consumed_samples_);
  result.grad_norm = static_cast<float>(global_grad_norm());
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
  result.loss = reported_loss();
  ++iteration_;
  consumed_samples_ += config_.global_batch_size();
  backend_.synchronize();
  result.elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

void Trainer::save(checkpoint::CheckpointWriter& writer) const {
  for (std::size_t c = 0; c < chunks_.size(); ++c) {
    const GPTModel& model = *chunks_[c];
    const std::vector<float> params = model.main_parameters();
    const std::int64_t total = model.layout().total_elements();
    std::vector<float> m(total), v(total);
    backend_.download(optimizer_state_[c].exp_avg, m.data());
    backend_.download(optimizer_state_[c].exp_avg_sq, v.data());
    for (const ParameterEntry& e : model.layout().entries()) {
      const std::vector<std::int64_t> shape =
          e.rows == 1 ? std::vector<std::int64_t>{e.cols} : std::vector<std::int64_t>{e.rows, e.cols};
      writer.add_tensor("model." + e.name, checkpoint::TensorDType::fp32, shape, params.data() + e.offset);
      writer.add_tensor("optimizer.exp_avg." + e.name, checkpoint::TensorDType::fp32, shape, m.data() + e.offset);
      writer.add_tensor("optimizer.exp_avg_sq." + e.name, checkpoint::TensorDType::fp32, shape,
                        v.data() + e.offset);
    }
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
  for (std::size_t c = 0; c < chunks_.size(); ++c) {
    GPTModel& model = *chunks_[c];
    const std::int64_t total = model.layout().total_elements();
    std::vector<float> params(total, 0.0f), m(total, 0.0f), v(total, 0.0f);
    for (const ParameterEntry& e : model.layout().entries()) {
      const std::vector<std::int64_t> shape =
          e.rows == 1 ? std::vector<std::int64_t>{e.cols} : std::vector<std::int64_t>{e.rows, e.cols};
      reader.read_tensor("model." + e.name, checkpoint::TensorDType::fp32, shape, params.data() + e.offset);
      reader.read_tensor("optimizer.exp_avg." + e.name, checkpoint::TensorDType::fp32, shape, m.data() + e.offset);
      reader.read_tensor("optimizer.exp_avg_sq." + e.name, checkpoint::TensorDType::fp32, shape,
                         v.data() + e.offset);
    }
    model.set_main_parameters(params);
    backend_.upload(optimizer_state_[c].exp_avg, m.data());
    backend_.upload(optimizer_state_[c].exp_avg_sq, v.data());
  }
  iteration_ = reader.metadata_int("iteration");
  consumed_samples_ = reader.metadata_int("consumed_samples");
  skipped_iterations_ = reader.metadata_int("skipped_iterations");
}

void Trainer::load_resharded(const std::vector<checkpoint::CheckpointReader>& shards) {
  if (shards.empty()) throw std::invalid_argument("load_resharded: no shards");
  shards.front().require_metadata_equal("model_config", config_.model.describe());
  const int tp_rank = communicator_.rank(CommGroup::kTensor), tp_size = communicator_.size(CommGroup::kTensor);
  // One tensor's unsharded values from the shards' TP slices (any data-parallel copy of each slice).
  auto assemble = [&](const ParameterEntry& e, const std::string& name) {
    std::map<std::int64_t, std::vector<float>> slices;
    std::int64_t source_tp = 0;
    for (const checkpoint::CheckpointReader& shard : shards) {
      const checkpoint::TensorInfo* info = shard.find_tensor(name);
      if (info == nullptr) continue;
      const std::int64_t r = shard.has_metadata("tp_rank") ? shard.metadata_int("tp_rank") : 0;
      source_tp = shard.has_metadata("tp_size") ? shard.metadata_int("tp_size") : 1;
      if (slices.count(r)) continue;
      std::vector<float> values(static_cast<std::size_t>(info->num_elements()));
      shard.read_tensor(name, checkpoint::TensorDType::fp32, info->shape, values.data());
      slices.emplace(r, std::move(values));
    }
    if (source_tp == 0 || static_cast<std::int64_t>(slices.size()) != source_tp)
      throw UserError("checkpoint " + shards.front().directory() + " lacks tensor-parallel slices of " + name +
                      "; resume from a complete save");
    std::vector<std::vector<float>> ordered;
    for (auto& [r, values] : slices) ordered.push_back(std::move(values));
    return tensor_parallel_slice(e, tensor_parallel_assemble(e, ordered), tp_rank, tp_size);
  };
  for (std::size_t c = 0; c < chunks_.size(); ++c) {
    GPTModel& model = *chunks_[c];
    const std::int64_t total = model.layout().total_elements();
    std::vector<float> params(total, 0.0f), m(total, 0.0f), v(total, 0.0f);
    for (const ParameterEntry& e : model.layout().entries()) {
      const auto put = [&](std::vector<float>& buffer, const std::string& prefix) {
        const std::vector<float> local = assemble(e, prefix + e.name);
        std::copy(local.begin(), local.end(), buffer.begin() + e.offset);
      };
      put(params, "model.");
      put(m, "optimizer.exp_avg.");
      put(v, "optimizer.exp_avg_sq.");
    }
    model.set_main_parameters(params);
    backend_.upload(optimizer_state_[c].exp_avg, m.data());
    backend_.upload(optimizer_state_[c].exp_avg_sq, v.data());
  }
  iteration_ = shards.front().metadata_int("iteration");
  consumed_samples_ = shards.front().metadata_int("consumed_samples");
  skipped_iterations_ = shards.front().metadata_int("skipped_iterations");
}

}  // namespace megatune::executor

namespace megatune::executor {
layouts::RankSchedule single_stage_schedule(int num_layers, int num_microbatches) {
  return layouts::build_rank_schedule(layouts::PipelineLayout::uniform(num_layers, 1), num_microbatches, 1,
                                      0);
}
}  // namespace megatune::executor
