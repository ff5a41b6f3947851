// Trainer: building the model chunks and their data-parallel strategy, and the iteration's loop (the walk's
// items -> forward/backward, p2p, grad buckets, grad sync, norm, AdamW, param gathers). Its reported metrics,
// checkpoint state and schedule glue live in trainer_metrics.cpp, trainer_checkpoint.cpp,
// trainer_schedule.cpp.
#include "executor/training/trainer.h"

#include <chrono>
#include <cmath>
#include <stdexcept>

#include "executor/backend/recording_pause.h"
#include "executor/parallel/context_parallel_split.h"
#include "executor/training/expert_bias_state.h"
#include "executor/training/trainer_schedule.h"

namespace megatune::executor {

using layouts::OpPhase;
using layouts::P2pDirection;
using layouts::P2pTensor;

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
  batch.parameters_gathered_at_use = config.fsdp == layouts::DataParallelSharding::kOptimGradsParams;
  batch.gradients_sharded = config.fsdp && *config.fsdp >= layouts::DataParallelSharding::kOptimGrads;
  for (const bool expert : {false, true}) {
    GradBucketOptions& o = expert ? batch.bucketing.expert : batch.bucketing.dense;
    o.data_parallel_size = communicator.size(expert ? CommGroup::kExpertData : CommGroup::kDataContext);
    // Megatron FSDP overlaps the reduction of sharded gradients: buckets as with --overlap-grad-reduce.
    o.overlap_grad_reduce = config.overlap_grad_reduce || batch.gradients_sharded;
    o.distributed_optimizer = config.use_distributed_optimizer;
    // FSDP optim_grads_params: a bucket per parameter entry (layouts::grad_sync_buckets' rule).
    if (config.fsdp == layouts::DataParallelSharding::kOptimGradsParams) {
      o.overlap_grad_reduce = true;
      o.bucket_size_elements = 1;
    }
  }
  batch.bucketing.shared_embedding = shared_embedding;
  return batch;
}

DataParallelOptions data_parallel_options(const TrainerConfig& config,
                                          const std::vector<std::unique_ptr<GPTModel>>& models) {
  DataParallelOptions o;
  o.overlap_grad_reduce = config.overlap_grad_reduce;
  o.overlap_param_gather = config.overlap_param_gather;
  o.fsdp = config.fsdp;
  for (const std::unique_ptr<GPTModel>& model : models)
    o.gathered_entries_in_use = std::max(
        o.gathered_entries_in_use, layouts::fsdp_gathered_entries(model->recompute_plan().largest_unit(),
                                                                  model->head_reads_embedding()));
  return o;
}

}  // namespace

DataParallelChunk data_parallel_chunk(GPTModel& model) {
  DataParallelChunk c;
  c.expert_buffer = model.layout().expert_buffer();
  c.dense_buffer = &model.layout().dense_buffer();
  c.grads = model.grads();
  c.model_params = model.model_params();
  c.main_params = model.main_params();
  if (model.parameters_gathered_at_use()) {
    c.residence = &model;
    c.head_reads_embedding = model.head_reads_embedding();
  }
  if (model.gradients_sharded()) {
    c.gradient_residence = &model;
    c.head_weight_offset = model.stage().has_loss ? model.head_entry().offset : -1;
  }
  return c;
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
                              data_parallel_options(config, models), /*sizing=*/true);
  backend.end_sizing();
  return backend.arena_breakdown();
}

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
  microbatch_capacity_ = config_.batch.num_microbatches;
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
    GPTModel& model = *chunks_.back();
    views.push_back(data_parallel_chunk(model));
    step_buckets.push_back(config_.step && c < config_.step->buckets.size()
                               ? config_.step->buckets[c]
                               : std::vector<layouts::GradBucket>{});
    for (const ParameterEntry* e : model.sequence_parallel_grad_entries()) sp_elements += e->numel();
  }
  data_parallel_ =
      make_data_parallel_strategy(config_.use_distributed_optimizer, communicator_, std::move(views),
                                  step_buckets, data_parallel_options(config_, chunks_), sizing);
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

void Trainer::set_num_microbatches(int count, const layouts::RankSchedule& schedule,
                                   const std::optional<layouts::RankStep>& step) {
  if (count < 1 || count > microbatch_capacity_)
    throw std::invalid_argument("Trainer::set_num_microbatches: " + std::to_string(count) +
                                " micro-batches, the trainer was built for 1 to " +
                                std::to_string(microbatch_capacity_));
  if (schedule.num_microbatches != count || schedule.pp != schedule_.pp || schedule.vpp != schedule_.vpp)
    throw std::invalid_argument("Trainer::set_num_microbatches: the schedule is not this rank's for " +
                                std::to_string(count) + " micro-batches");
  if (step.has_value() != config_.step.has_value() ||
      (step && step->buckets.size() != config_.step->buckets.size()))
    throw std::invalid_argument("Trainer::set_num_microbatches: the walk is not this rank's");
  const std::vector<StageSpan> chunks = resolved_chunks(config_);
  const std::vector<int> slots = activation_slots_per_chunk(schedule, chunks);
  for (std::size_t c = 0; c < slots.size(); ++c)
    if (slots[c] > slots_per_chunk_.at(c))
      throw std::logic_error("the schedule of " + std::to_string(count) + " micro-batches needs " +
                             std::to_string(slots[c]) + " activation slots in chunk " + std::to_string(c) +
                             ", the trainer holds " + std::to_string(slots_per_chunk_[c]));
  schedule_ = schedule;
  items_ = step ? step->items : items_from_schedule(schedule_, chunks, config_.model.mtp_num_layers);
  config_.batch.num_microbatches = count;
  for (auto& chunk : chunks_) chunk->set_num_microbatches(count);
}

void Trainer::run_forward(const layouts::StepItem& item, const MicroBatch& batch, bool evaluation) {
  GPTModel& model = *chunks_.at(item.chunk);
  const std::vector<int>& groups = item.forward_groups;
  if (groups != model.forward_segment_groups())
    throw std::logic_error("forward of chunk " + std::to_string(item.chunk) +
                           ": the walk's segments are not the model chunk's");
  const auto run = [&](int begin, int end) {
    if (evaluation)
      model.forward_only(batch, item.microbatch, begin, end);
    else
      model.forward(batch, item.microbatch, begin, end);
  };
  if (groups.empty()) run(0, 0);  // an empty stage: its output is its input
  for (int s = 0; s < static_cast<int>(groups.size()); ++s) {
    if (!evaluation) data_parallel_->prepare_forward_gradients(item.chunk, groups[s]);
    data_parallel_->before_forward(item.chunk, groups[s]);
    if (forward_segment_hook_) forward_segment_hook_(item.chunk, item.microbatch, groups[s]);
    run(s, s + 1);
    data_parallel_->after_forward(item.chunk, groups[s]);
  }
}

void Trainer::run_backward(const layouts::StepItem& item) {
  GPTModel& model = *chunks_.at(item.chunk);
  if (!data_parallel_->runs_backward_by_entry()) {
    model.backward(item.microbatch, item.entry_begin, item.entry_end);
    return;
  }
  // Entry by entry, each after its parameters' gather and before its gradient buckets' reduction (the
  // entries run in reverse symbol order).
  if (!config_.step) throw std::logic_error("FSDP's backward by entry needs the rank's walk");
  const std::vector<int> codes = layouts::stage_symbol_layers(config_.step->stages.at(item.chunk));
  const layouts::RecomputePlan& plan = model.recompute_plan();
  for (int e = item.entry_begin; e < item.entry_end; ++e) {
    const int code = codes.at(codes.size() - 1 - static_cast<std::size_t>(e));
    data_parallel_->before_backward(item.chunk, code);
    // A unit's re-run runs its layers' forward segments again: the other layers' parameters are gathered
    // as before their forward (layouts::step_item_ops issues the same gathers).
    if (const layouts::RecomputeUnit* unit = plan.unit_ending_at(code))
      for (int layer : unit->layers)
        if (layer != code)
          data_parallel_->before_forward(item.chunk, layouts::forward_segment_group_of(layer));
    model.backward(item.microbatch, e, e + 1);
    data_parallel_->after_backward(item.chunk, code);
  }
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
        CommGroup::kEmbedding, data_parallel_->gathered_grads(static_cast<int>(c), e.offset, e.numel()),
        ReduceOp::kSum,
        {"embedding_grad_ar", -1, OpPhase::kOptimizer, layouts::OpRole::kEmbeddingGradReduce});
    data_parallel_->end_gathered_grads(static_cast<int>(c));
  }
}

void Trainer::reduce_sequence_parallel_norms() {
  // Each TP rank's norm gradients cover its sequence shard; sum them over TP.
  if (sp_norm_grads_.empty()) return;
  auto each = [&](auto&& move) {
    std::int64_t at = 0;
    for (std::size_t c = 0; c < chunks_.size(); ++c)
      for (const ParameterEntry* e : chunks_[c]->sequence_parallel_grad_entries()) {
        for (const Tensor& piece :
             data_parallel_->reduced_grad_pieces(static_cast<int>(c), e->offset, e->numel())) {
          move(piece, flat_range(backend_, sp_norm_grads_, at, piece.numel()));
          at += piece.numel();
        }
      }
    return at;
  };
  const std::int64_t packed = each([&](Tensor grad, Tensor gathered) { backend_.copy(grad, gathered); });
  communicator_.all_reduce(
      CommGroup::kTensor, flat_range(backend_, sp_norm_grads_, 0, packed), ReduceOp::kSum,
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
      hyper.decoupled_lr = static_cast<float>(schedule_lr_.decoupled_lr(consumed_samples_));
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
        run_forward(item, microbatches.at(item.microbatch), /*evaluation=*/false);
        break;
      case layouts::StepItemKind::kBackward:
        recorder.set_position(item.microbatch, item.chunk);
        run_backward(item);
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

const std::vector<MicroBatch>& Trainer::context_parallel_share(const std::vector<MicroBatch>& microbatches) {
  if (config_.context_parallel_size == 1) return microbatches;
  cp_local_.resize(microbatches.size());
  for (std::size_t i = 0; i < microbatches.size(); ++i)
    context_parallel_slice(microbatches[i], config_.context_parallel_size,
                           communicator_.rank(CommGroup::kContext), cp_local_[i]);
  return cp_local_;
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

}  // namespace megatune::executor
