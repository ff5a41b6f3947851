// Trainer: the iteration (schedule -> forward/backward, grad sync, norm, AdamW) and its checkpoint state.
#include "executor/training/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <stdexcept>

#include "executor/backend/recording_pause.h"
#include "executor/checkpoint/checkpoint_reader.h"
#include "executor/checkpoint/checkpoint_writer.h"
#include "executor/parallel/context_parallel_split.h"
#include "executor/training/checkpoint_shards.h"
#include "executor/training/expert_bias_state.h"
#include "layouts/user_error.h"

namespace megatune::executor {

using layouts::OpPhase;
using layouts::P2pDirection;
using layouts::P2pTensor;
using layouts::ScheduleItemKind;

namespace {

std::vector<StageSpan> resolved_chunks(const TrainerConfig& config) {
  std::vector<StageSpan> chunks = config.chunks.empty() ? std::vector<StageSpan>{StageSpan{}} : config.chunks;
  for (StageSpan& c : chunks)
    if (c.num_layers < 0) c.num_layers = config.model.num_layers - c.first_layer;
  return chunks;
}

// A chunk's batch shape and buffer bucketing: its regions bucketed over the communicator's dp-cp and
// expert-dp groups (shared_embedding: the chunk's word embedding is a tied copy another stage owns).
BatchShape chunk_batch(const TrainerConfig& config, int slots, const Communicator& communicator,
                       bool shared_embedding) {
  BatchShape batch = config.batch;
  batch.activation_slots = slots;
  batch.gradient_average_ranks = config.gradient_reduction_size();
  batch.main_parameters_sharded = config.use_distributed_optimizer;
  for (const bool expert : {false, true}) {
    GradBucketOptions& o = expert ? batch.bucketing.expert : batch.bucketing.dense;
    o.data_parallel_size = communicator.size(expert ? CommGroup::kExpertData : CommGroup::kDataContext);
    o.overlap_grad_reduce = config.overlap_grad_reduce;
    o.distributed_optimizer = config.use_distributed_optimizer;
  }
  batch.bucketing.shared_embedding = shared_embedding;
  return batch;
}

DataParallelOptions data_parallel_options(const TrainerConfig& config) {
  DataParallelOptions o;
  o.overlap_grad_reduce = config.overlap_grad_reduce;
  o.overlap_param_gather = config.overlap_param_gather;
  return o;
}

}  // namespace

DataParallelChunk data_parallel_chunk(const GPTModel& model) {
  DataParallelChunk c;
  c.expert_buffer = model.layout().expert_buffer();
  c.dense_buffer = &model.layout().dense_buffer();
  c.grads = model.grads();
  c.model_params = model.model_params();
  c.main_params = model.main_params();
  return c;
}

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
      if (t.direction == P2pDirection::kRecv && t.tensor == P2pTensor::kActivation)
        acquire(t.chunk, t.microbatch);
    for (const layouts::P2pTransfer& t : item.transfers)
      if (t.direction == P2pDirection::kSend && t.tensor == P2pTensor::kGradient)
        release(t.chunk, t.microbatch);
  }
  return peak;
}

std::vector<ArenaUse> size_training_arena(const TrainerConfig& config, const layouts::RankSchedule& schedule,
                                          Backend& backend, Communicator& communicator) {
  const Trainer sizing(config, schedule, backend, communicator, /*size_only=*/true);
  return backend.arena_breakdown();
}

std::vector<ArenaUse> size_training_arena(const TrainerConfig& config, Backend& backend) {
  SingleRankCommunicator communicator(backend);
  backend.begin_sizing();
  std::vector<std::unique_ptr<GPTModel>> models;
  std::vector<DataParallelChunk> chunks;
  for (const StageSpan& stage : resolved_chunks(config)) {
    models.push_back(std::make_unique<GPTModel>(config.model, chunk_batch(config, 1, communicator, false),
                                                config.recompute, config.compute_dtype, backend, communicator,
                                                stage));
    chunks.push_back(data_parallel_chunk(*models.back()));
  }
  make_data_parallel_strategy(config.use_distributed_optimizer, communicator, std::move(chunks), {},
                              data_parallel_options(config), /*sizing=*/true);
  backend.end_sizing();
  return backend.arena_breakdown();
}

namespace {

// The items of an iteration without a walk: the schedule's own (a single rank: no p2p, no buckets), then the
// grad norm and AdamW.
std::vector<layouts::StepItem> items_from_schedule(const layouts::RankSchedule& schedule,
                                                   const std::vector<StageSpan>& chunks, int mtp_num_layers) {
  std::vector<layouts::StepItem> items;
  for (int i = 0; i < static_cast<int>(schedule.items.size()); ++i) {
    const layouts::ScheduleItem& s = schedule.items[i];
    if (s.kind == ScheduleItemKind::kP2p)
      throw std::invalid_argument("p2p item in a schedule without a walk");
    layouts::StepItem item;
    item.kind = s.kind == ScheduleItemKind::kForward ? layouts::StepItemKind::kForward
                                                     : layouts::StepItemKind::kBackward;
    item.schedule_item = i;
    item.microbatch = s.microbatch;
    item.chunk = s.chunk;
    const StageSpan& c = chunks.at(s.chunk);
    // The loss stage holds the MTP layers (GPTModel::with_mtp_layers).
    const int mtp = c.num_mtp_layers > 0 ? c.num_mtp_layers : c.has_loss ? mtp_num_layers : 0;
    item.entry_count = c.num_layers + mtp + (c.has_embedding ? 1 : 0) + (c.has_loss ? 1 : 0);
    item.entry_end = item.entry_count;
    items.push_back(item);
  }
  for (layouts::OptimizerStep step : {layouts::OptimizerStep::kGradNorm, layouts::OptimizerStep::kAdamW}) {
    layouts::StepItem item;
    item.kind = layouts::StepItemKind::kOptimizer;
    item.optimizer_step = step;
    items.push_back(item);
  }
  return items;
}

}  // namespace

Trainer::Trainer(const TrainerConfig& config, const layouts::RankSchedule& schedule, Backend& backend,
                 Communicator& communicator, bool size_only)
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
  if (communicator_.size(CommGroup::kDataContext) != config_.gradient_reduction_size() ||
      communicator_.size(CommGroup::kContext) != config_.context_parallel_size)
    throw std::invalid_argument(
        "the communicator's dp-cp group has " + std::to_string(communicator_.size(CommGroup::kDataContext)) +
        " ranks and its cp group " + std::to_string(communicator_.size(CommGroup::kContext)) +
        ", the trainer config dp " + std::to_string(config_.data_parallel_size) + " x cp " +
        std::to_string(config_.context_parallel_size));
  items_ = config_.step ? config_.step->items
                        : items_from_schedule(schedule_, chunks, config_.model.mtp_num_layers);
  if (config_.forward_step) {
    forward_items_ = config_.forward_step->items;
  } else {
    for (const layouts::StepItem& item : items_)
      if (item.kind == layouts::StepItemKind::kForward) forward_items_.push_back(item);
  }
  slots_per_chunk_ = activation_slots_per_chunk(schedule_, chunks);
  backend_.begin_sizing();
  build(true);
  const std::int64_t bytes = backend_.end_sizing();
  if (size_only) return;
  backend_.reserve_arena(bytes);
  build(false);
  for (std::size_t c = 0; c < chunks_.size(); ++c)
    data_parallel_->set_main_parameters(static_cast<int>(c), chunks_[c]->initial_parameters(config_.seed));
}

void Trainer::build(bool sizing) {
  const std::vector<StageSpan> chunks = resolved_chunks(config_);
  data_parallel_.reset();
  chunks_.clear();
  std::int64_t sp_elements = 0;
  std::vector<DataParallelChunk> views;
  std::vector<std::vector<layouts::GradBucket>> step_buckets;
  for (std::size_t c = 0; c < chunks.size(); ++c) {
    const bool shared_embedding = (config_.model.tied_embeddings || config_.model.mtp_num_layers > 0) &&
                                  schedule_.pp > 1 && !chunks[c].has_embedding;
    chunks_.push_back(std::make_unique<GPTModel>(
        config_.model, chunk_batch(config_, slots_per_chunk_[c], communicator_, shared_embedding),
        config_.recompute, config_.compute_dtype, backend_, communicator_, chunks[c]));
    const GPTModel& model = *chunks_.back();
    views.push_back(data_parallel_chunk(model));
    step_buckets.push_back(config_.step && c < config_.step->buckets.size()
                               ? config_.step->buckets[c]
                               : std::vector<layouts::GradBucket>{});
    for (const ParameterEntry* e : model.sequence_parallel_grad_entries()) sp_elements += e->numel();
  }
  data_parallel_ =
      make_data_parallel_strategy(config_.use_distributed_optimizer, communicator_, std::move(views),
                                  step_buckets, data_parallel_options(config_), sizing);
  for (std::size_t c = 0; c < chunks_.size(); ++c)
    chunks_[c]->set_forward_pre_hook(
        [this, c](int group) { data_parallel_->before_forward(static_cast<int>(c), group); });
  sp_norm_grads_ = sp_elements > 0
                       ? backend_.allocate(DType::kFP32, 1, sp_elements, "sequence-parallel norm grads")
                       : Tensor{};
  scalar_ = backend_.allocate(DType::kFP32, 1, 2, "grad norm and loss reductions");
  cp_loss_sums_ =
      backend_.allocate(DType::kFP32, 1, 2 * config_.batch.num_microbatches, "grad norm and loss reductions");
  if (config_.model.is_moe() && config_.model.router.enable_expert_bias)
    expert_counts_ = backend_.allocate(DType::kFP32, 1, config_.model.num_layers * config_.model.num_experts,
                                       "grad norm and loss reductions");
}

void Trainer::run_p2p(const layouts::StepItem& item, bool evaluation) {
  std::vector<P2pTransferArgs> transfers;
  for (const layouts::StepTransfer& t : item.transfers) {
    GPTModel& model = *chunks_.at(t.chunk);
    P2pTransferArgs a;
    a.send = t.direction == P2pDirection::kSend;
    const bool activation = t.tensor == P2pTensor::kActivation;
    if (activation)
      a.tensor = a.send ? model.stage_output(t.microbatch) : model.stage_input(t.microbatch);
    else
      a.tensor = a.send ? model.input_grad(t.microbatch) : model.output_grad(t.microbatch);
    a.peer_rank = t.peer_rank;
    a.tag = {activation ? "p2p_activation" : "p2p_gradient", -1,
             activation ? OpPhase::kForward : OpPhase::kBackward,
             activation ? layouts::OpRole::kP2pActivation : layouts::OpRole::kP2pGradient};
    a.microbatch = t.microbatch;
    a.chunk = t.chunk;
    transfers.push_back(a);
  }
  communicator_.batch_p2p(CommGroup::kPipeline, transfers);
  // A sent input gradient ends its micro-batch's use of the chunk's activation slot; in an evaluation pass
  // a sent activation does.
  const P2pTensor last_use = evaluation ? P2pTensor::kActivation : P2pTensor::kGradient;
  for (const layouts::StepTransfer& t : item.transfers)
    if (t.direction == P2pDirection::kSend && t.tensor == last_use)
      chunks_.at(t.chunk)->release(t.microbatch);
}

void Trainer::reduce_tied_embedding() {
  // Tied word embedding (or MTP's) under pipelining: the first stage's table and the last stage's copy hold
  // one parameter; their gradients are summed over the embedding group.
  for (std::size_t c = 0; c < chunks_.size(); ++c) {
    GPTModel* chunk = chunks_[c].get();
    const StageSpan& st = chunk->stage();
    if (!st.has_embedding && !st.has_loss) continue;
    const ParameterEntry& e = chunk->layout().find("embedding.word_embeddings.weight");
    // Under the distributed optimizer only this rank's shard of each bucket is reduced, and the two stages'
    // shards cover different rows: gather the reduced buckets holding the embedding first.
    backend_.recorder().set_position(-1, static_cast<int>(c));
    data_parallel_->gather_reduced_grads(
        static_cast<int>(c), e.offset, e.numel(),
        {"embedding_grad_ag", -1, OpPhase::kOptimizer, layouts::OpRole::kEmbeddingGradReduce});
    backend_.recorder().set_position(-1, -1);
    communicator_.all_reduce(
        CommGroup::kEmbedding, chunk->view(chunk->grads(), e), ReduceOp::kSum,
        {"embedding_grad_ar", -1, OpPhase::kOptimizer, layouts::OpRole::kEmbeddingGradReduce});
  }
}

void Trainer::reduce_sequence_parallel_norms() {
  // Each TP rank's norm gradients cover its sequence shard; sum them over TP.
  if (sp_norm_grads_.empty()) return;
  auto each = [&](auto&& move) {
    std::int64_t at = 0;
    for (auto& chunk : chunks_)
      for (const ParameterEntry* e : chunk->sequence_parallel_grad_entries()) {
        move(flat_range(backend_, chunk->grads(), e->offset, e->numel()),
             flat_range(backend_, sp_norm_grads_, at, e->numel()));
        at += e->numel();
      }
  };
  each([&](Tensor grad, Tensor gathered) { backend_.copy(grad, gathered); });
  communicator_.all_reduce(
      CommGroup::kTensor, sp_norm_grads_, ReduceOp::kSum,
      {"sp_norm_grad_ar", -1, OpPhase::kOptimizer, layouts::OpRole::kSequenceParallelNormGrad});
  each([&](Tensor grad, Tensor gathered) { backend_.copy(gathered, grad); });
}

void Trainer::run_optimizer_step(layouts::OptimizerStep step, StepResult& result) {
  switch (step) {
    case layouts::OptimizerStep::kEmbeddingGradReduce:
      reduce_tied_embedding();
      return;
    case layouts::OptimizerStep::kSequenceParallelNormGradReduce:
      reduce_sequence_parallel_norms();
      return;
    case layouts::OptimizerStep::kGradNorm:
      result.grad_norm = data_parallel_->grad_norm();
      require_finite("gradient norm", result.grad_norm, data_parallel_->local_grad_norm());
      result.skipped = !std::isfinite(result.grad_norm);
      return;
    case layouts::OptimizerStep::kAdamW: {
      if (result.skipped) return;
      AdamWHyper hyper;
      hyper.lr = static_cast<float>(result.learning_rate);
      hyper.beta1 = static_cast<float>(config_.optimizer.beta1);
      hyper.beta2 = static_cast<float>(config_.optimizer.beta2);
      hyper.eps = static_cast<float>(config_.optimizer.eps);
      hyper.weight_decay = static_cast<float>(config_.optimizer.weight_decay);
      hyper.step = iteration_ - skipped_iterations_ + 1;
      hyper.max_grad_norm = static_cast<float>(config_.optimizer.clip_grad);
      data_parallel_->step(hyper);
      return;
    }
  }
}

void Trainer::run_items(const std::vector<MicroBatch>& microbatches) {
  OpRecorder& recorder = backend_.recorder();
  bool reductions_done = false;
  for (const layouts::StepItem& item : items_) {
    switch (item.kind) {
      case layouts::StepItemKind::kForward:
        recorder.set_position(item.microbatch, item.chunk);
        chunks_.at(item.chunk)->forward(microbatches.at(item.microbatch), item.microbatch);
        break;
      case layouts::StepItemKind::kBackward:
        recorder.set_position(item.microbatch, item.chunk);
        chunks_.at(item.chunk)->backward(item.microbatch, item.entry_begin, item.entry_end);
        break;
      case layouts::StepItemKind::kP2p:
        run_p2p(item);
        break;
      case layouts::StepItemKind::kGradBucket:
        recorder.set_position(-1, item.chunk);
        data_parallel_->launch_bucket(item.chunk, item.bucket);
        break;
      case layouts::StepItemKind::kOptimizer:
        recorder.set_position(-1, -1);
        if (!reductions_done) {
          data_parallel_->finish_grad_reduction();
          update_expert_biases();
          reductions_done = true;
          pending_result_.learning_rate = schedule_lr_.lr(consumed_samples_);
        }
        run_optimizer_step(item.optimizer_step, pending_result_);
        break;
      case layouts::StepItemKind::kParamGather:
        recorder.set_position(-1, item.chunk);
        if (!pending_result_.skipped) data_parallel_->gather_params(item.chunk, item.bucket);
        break;
    }
  }
  recorder.set_position(-1, -1);
  if (!reductions_done) {
    data_parallel_->finish_grad_reduction();
    update_expert_biases();
  }
}

void Trainer::update_expert_biases() {
  for (auto& chunk : chunks_) update_router_expert_biases(*chunk, communicator_, expert_counts_);
}

double Trainer::reported_loss(double& local) {
  // The last pipeline stage holds the losses; their mean over the data-parallel ranks is what Megatron logs.
  // Under context parallelism a micro-batch's loss is the sum of its CP ranks' token losses over the sum of
  // their counted tokens.
  bool holds_loss = false;
  double sum = 0.0;
  for (auto& chunk : chunks_)
    if (chunk->stage().has_loss) {
      holds_loss = true;
      const std::vector<double> losses = context_parallel_losses(*chunk);  // synchronizes
      for (double l : losses) sum += l;
      sum /= static_cast<double>(losses.size());
    }
  local = sum;
  if (communicator_.world_size() == 1) return sum;
  const bool counts = holds_loss && communicator_.rank(CommGroup::kTensor) == 0 &&
                      communicator_.rank(CommGroup::kContext) == 0;
  if (!counts) local = 0.0;
  return world_sum(local) / static_cast<double>(config_.data_parallel_size);
}

const std::vector<MicroBatch>& Trainer::context_parallel_share(const std::vector<MicroBatch>& microbatches) {
  if (config_.context_parallel_size == 1) return microbatches;
  cp_local_.resize(microbatches.size());
  for (std::size_t i = 0; i < microbatches.size(); ++i)
    context_parallel_slice(microbatches[i], config_.context_parallel_size,
                           communicator_.rank(CommGroup::kContext), cp_local_[i]);
  return cp_local_;
}

std::vector<double> Trainer::context_parallel_losses(GPTModel& chunk) {
  std::vector<double> losses = chunk.microbatch_losses();
  if (config_.context_parallel_size == 1) return losses;
  const std::size_t m = losses.size();
  std::vector<float> sums(2 * m);  // (loss sum, counted tokens) per micro-batch
  for (std::size_t i = 0; i < m; ++i) {
    sums[2 * i] = static_cast<float>(losses[i] * chunk.counted_tokens()[i]);
    sums[2 * i + 1] = static_cast<float>(chunk.counted_tokens()[i]);
  }
  RecordingPause pause(backend_);
  backend_.upload(cp_loss_sums_, sums.data());
  communicator_.all_reduce(CommGroup::kContext, cp_loss_sums_, ReduceOp::kSum,
                           {"cp_loss_sum", -1, OpPhase::kOptimizer});
  backend_.download(cp_loss_sums_, sums.data());
  for (std::size_t i = 0; i < m; ++i) losses[i] = sums[2 * i + 1] > 0 ? sums[2 * i] / sums[2 * i + 1] : 0.0;
  return losses;
}

double Trainer::reported_load_balancing_loss() {
  const TransformerConfig& model = config_.model;
  if (!model.is_moe() || !model.router.has_aux_loss()) return -1.0;
  double sum = 0.0;
  for (auto& chunk : chunks_) sum += chunk->moe_load_balancing_loss();
  sum /= static_cast<double>(config_.batch.num_microbatches);
  int moe_layers = 0;
  for (int flag : model.moe_layers) moe_layers += flag != 0 ? 1 : 0;
  // Each TP rank's loss is its sequence shard's part of the micro-batch's (moe_layer.h): summed over TP,
  // averaged over the data-parallel ranks, as Megatron's tracker reduces it.
  if (communicator_.world_size() > 1)
    sum = world_sum(sum) / static_cast<double>(config_.gradient_reduction_size());
  return sum / static_cast<double>(moe_layers);
}

std::vector<double> Trainer::reported_mtp_losses() {
  // Megatron's MTPLossLoggingHelper: each MTP layer's loss, mean over micro-batches, averaged over dp-cp.
  std::vector<double> losses(config_.model.mtp_num_layers, 0.0);
  for (auto& chunk : chunks_) {
    const std::vector<double> own = chunk->mtp_losses();
    for (std::size_t i = 0; i < own.size(); ++i) losses[chunk->stage().first_mtp_layer + i] = own[i];
  }
  if (communicator_.world_size() == 1) return losses;
  const bool counts = communicator_.rank(CommGroup::kTensor) == 0;
  for (double& loss : losses)
    loss = world_sum(counts ? loss : 0.0) / static_cast<double>(config_.gradient_reduction_size());
  return losses;
}

double Trainer::world_sum(double value) { return world_reduce(value, ReduceOp::kSum); }

double Trainer::world_reduce(double value, ReduceOp op) {
  if (communicator_.world_size() == 1) return value;
  const float values[2] = {static_cast<float>(value), 0.0f};
  RecordingPause pause(backend_);
  backend_.upload(scalar_, values);
  communicator_.all_reduce(CommGroup::kWorld, flat_range(backend_, scalar_, 0, 1), op,
                           {"world_sum", -1, OpPhase::kOptimizer});
  float reduced[2];
  backend_.download(scalar_, reduced);
  return reduced[0];
}

StepResult Trainer::train_step(const std::vector<MicroBatch>& microbatches) {
  if (static_cast<int>(microbatches.size()) != config_.batch.num_microbatches)
    throw std::invalid_argument("train_step: wrong number of micro-batches");
  const auto start = std::chrono::steady_clock::now();
  // --overlap-param-gather: the previous step's gathers are waited in the forward pre-hooks.
  for (auto& chunk : chunks_) chunk->zero_gradients();
  pending_result_ = StepResult{};
  run_items(context_parallel_share(microbatches));
  StepResult result = pending_result_;
  if (result.skipped) ++skipped_iterations_;
  double local_loss = 0.0;
  result.loss = reported_loss(local_loss);
  require_finite("loss", result.loss, local_loss);
  result.load_balancing_loss = reported_load_balancing_loss();
  result.mtp_losses = reported_mtp_losses();
  ++iteration_;
  consumed_samples_ += config_.global_batch_size();
  backend_.synchronize();
  result.elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

void Trainer::save(checkpoint::CheckpointWriter& writer) const {
  // Parameters whole (the distributed optimizer gathers its fp32 shards: every rank saves together); the
  // AdamW moments per parameter, or under the distributed optimizer this rank's shard of them as one tensor
  // per chunk ("optimizer.shard.*"), which resumes under the same layout only.
  for (std::size_t c = 0; c < chunks_.size(); ++c) {
    const GPTModel& model = *chunks_[c];
    const std::vector<float> params = data_parallel_->main_parameters(static_cast<int>(c));
    const DataParallelStrategy::Moments moments = data_parallel_->moments(static_cast<int>(c));
    const std::vector<float>& m = moments.exp_avg;
    const std::vector<float>& v = moments.exp_avg_sq;
    for (const ParameterEntry& e : model.layout().entries()) {
      const std::vector<std::int64_t> shape =
          e.rows == 1 ? std::vector<std::int64_t>{e.cols} : std::vector<std::int64_t>{e.rows, e.cols};
      writer.add_tensor("model." + e.name, checkpoint::TensorDType::fp32, shape, params.data() + e.offset);
      if (config_.use_distributed_optimizer) continue;
      writer.add_tensor("optimizer.exp_avg." + e.name, checkpoint::TensorDType::fp32, shape,
                        m.data() + e.offset);
      writer.add_tensor("optimizer.exp_avg_sq." + e.name, checkpoint::TensorDType::fp32, shape,
                        v.data() + e.offset);
    }
    save_expert_biases(writer, *chunks_[c]);
    if (config_.use_distributed_optimizer) {
      const std::string chunk = std::to_string(c);
      writer.add_tensor("optimizer.shard.exp_avg.chunk" + chunk, checkpoint::TensorDType::fp32,
                        {static_cast<std::int64_t>(m.size())}, m.data());
      writer.add_tensor("optimizer.shard.exp_avg_sq.chunk" + chunk, checkpoint::TensorDType::fp32,
                        {static_cast<std::int64_t>(v.size())}, v.data());
    }
  }
  if (config_.use_distributed_optimizer) writer.add_metadata_int("distributed_optimizer_shards", 1);
  writer.add_metadata_int("iteration", iteration_);
  writer.add_metadata_int("consumed_samples", consumed_samples_);
  writer.add_metadata_int("skipped_iterations", skipped_iterations_);
  writer.add_metadata_int("seed", static_cast<std::int64_t>(config_.seed));
  writer.add_metadata("model_config", config_.model.describe());
  if (!config_.model_args.empty()) writer.add_metadata("model_args", config_.model_args);
  writer.add_metadata("lr_decay_style", to_string(config_.lr.style));
}

void Trainer::load(const checkpoint::CheckpointReader& reader) {
  reader.require_metadata_equal("model_config", config_.model.describe());
  const bool shards = reader.has_metadata("distributed_optimizer_shards");
  if (shards != config_.use_distributed_optimizer)
    throw UserError("checkpoint " + reader.directory() + (shards ? " holds" : " does not hold") +
                    " distributed-optimizer shards but this run " + (shards ? "does not use" : "uses") +
                    " --use-distributed-optimizer; resume with the flags it was saved with");
  for (std::size_t c = 0; c < chunks_.size(); ++c) {
    GPTModel& model = *chunks_[c];
    const std::int64_t total = model.layout().total_elements();
    std::vector<float> params(total, 0.0f), m(total, 0.0f), v(total, 0.0f);
    for (const ParameterEntry& e : model.layout().entries()) {
      const std::vector<std::int64_t> shape =
          e.rows == 1 ? std::vector<std::int64_t>{e.cols} : std::vector<std::int64_t>{e.rows, e.cols};
      reader.read_tensor("model." + e.name, checkpoint::TensorDType::fp32, shape, params.data() + e.offset);
      if (shards) continue;
      reader.read_tensor("optimizer.exp_avg." + e.name, checkpoint::TensorDType::fp32, shape,
                         m.data() + e.offset);
      reader.read_tensor("optimizer.exp_avg_sq." + e.name, checkpoint::TensorDType::fp32, shape,
                         v.data() + e.offset);
    }
    data_parallel_->set_main_parameters(static_cast<int>(c), params);
    load_expert_biases({&reader}, *chunks_[c]);
    if (shards) {
      DataParallelStrategy::Moments own;
      const std::int64_t owned = data_parallel_->owned_elements(static_cast<int>(c));
      own.exp_avg.resize(static_cast<std::size_t>(owned));
      own.exp_avg_sq.resize(own.exp_avg.size());
      const std::string chunk = std::to_string(c);
      reader.read_tensor("optimizer.shard.exp_avg.chunk" + chunk, checkpoint::TensorDType::fp32, {owned},
                         own.exp_avg.data());
      reader.read_tensor("optimizer.shard.exp_avg_sq.chunk" + chunk, checkpoint::TensorDType::fp32, {owned},
                         own.exp_avg_sq.data());
      data_parallel_->set_moments(static_cast<int>(c), own);
    } else {
      data_parallel_->set_moments_from_whole(static_cast<int>(c), {std::move(m), std::move(v)});
    }
  }
  iteration_ = reader.metadata_int("iteration");
  consumed_samples_ = reader.metadata_int("consumed_samples");
  skipped_iterations_ = reader.metadata_int("skipped_iterations");
}

void Trainer::load_resharded(const std::vector<checkpoint::CheckpointReader>& shards) {
  if (shards.empty()) throw std::invalid_argument("load_resharded: no shards");
  shards.front().require_metadata_equal("model_config", config_.model.describe());
  // Slices of one save only: a shard of another iteration or run would be assembled into the parameters.
  for (const checkpoint::CheckpointReader& shard : shards)
    for (const char* key : {"iteration", "consumed_samples", "model_config"})
      if (shard.metadata_value(key) != shards.front().metadata_value(key))
        throw UserError("checkpoint shard " + shard.directory() + " holds " + key + " " +
                        shard.metadata_value(key) + " but " + shards.front().directory() + " holds " +
                        shards.front().metadata_value(key) +
                        "; the shards come from different saves: resume from a directory one save wrote");
  if (shards.front().has_metadata("distributed_optimizer_shards"))
    throw UserError(
        "checkpoint " + shards.front().directory() + " was saved under " +
        (shards.front().has_metadata("layout") ? shards.front().metadata_value("layout") : "another layout") +
        " with per-rank distributed-optimizer shards, which resume under that layout only; rerun with it");
  // One tensor's unsharded values from the shards' TP slices (checkpoint_shards.h), sliced for this rank.
  auto assemble = [&](const ParameterEntry& e, const std::string& name) {
    const CommGroup group = e.expert >= 0 ? CommGroup::kExpertTensor : CommGroup::kTensor;
    return tensor_parallel_slice(e, assemble_unsharded(shards, e, name), communicator_.rank(group),
                                 communicator_.size(group));
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
    data_parallel_->set_main_parameters(static_cast<int>(c), params);
    std::vector<const checkpoint::CheckpointReader*> readers;
    for (const checkpoint::CheckpointReader& shard : shards) readers.push_back(&shard);
    load_expert_biases(readers, *chunks_[c]);
    data_parallel_->set_moments_from_whole(static_cast<int>(c), {std::move(m), std::move(v)});
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
