// MoeLayers: router, permutation, local experts, combine and shared expert, forward and backward.
#include "executor/model/moe_layer.h"

#include <algorithm>
#include <stdexcept>

#include "executor/backend/recording_pause.h"

namespace megatune::executor {
namespace {

using layouts::OpPhase;
constexpr OpPhase kMoeBackward = OpPhase::kBackward;

}  // namespace

MoeLayers::MoeLayers(const TransformerConfig& config, const layouts::RankShape& shape, int layers, int slots,
                     DType compute_dtype, Backend& backend, Communicator& communicator)
    : config_(config),
      tokens_(shape.tokens),
      seq_(shape.seq_local),
      layers_(layers),
      tp_(communicator.size(CommGroup::kTensor)),
      tp_rank_(communicator.rank(CommGroup::kTensor)),
      dtype_(compute_dtype),
      backend_(backend),
      communicator_(communicator) {
  if (tokens_ % seq_ != 0) throw std::invalid_argument("MoeLayers: tokens must be whole sequences");
  if (tokens_ % tp_ != 0) throw std::invalid_argument("MoeLayers: tokens must split over the TP ranks");
  if (tp_ > 1 && !config_.sequence_parallel)
    throw std::invalid_argument("MoeLayers: tensor parallelism needs sequence parallelism");
  local_tokens_ = tokens_ / tp_;
  const std::int64_t h = config_.hidden, glu = shape.glu_factor(), ffn = shape.moe_ffn_per_rank(),
                     shared = shape.shared_ffn_per_rank();
  max_local_rows_ = local_tokens_ * config_.router.topk;  // dropless: every choice of every token
  if (config_.router.pad_to_capacity)                     // every expert its capacity
    max_local_rows_ = config_.num_experts * config_.router.expert_capacity(local_tokens_);
  const int ep = communicator.size(CommGroup::kExpert), etp = communicator.size(CommGroup::kExpertTensor);
  if (layers > 0 && config_.moe_allgather_dispatcher && communicator.size(CommGroup::kTensorExpert) > 1) {
    allgather_ = std::make_unique<MoeAllGatherDispatcher>(backend_, communicator, config_.num_experts,
                                                          local_tokens_, h, dtype_);
  } else if (layers > 0 && communicator.size(CommGroup::kTensorExpert) > 1) {
    dispatcher_ = std::make_unique<MoeDispatcher>(backend_, communicator, config_.num_experts);
  }
  saved_.resize(static_cast<std::size_t>(slots * layers));
  if (config_.router.enable_expert_bias) {
    expert_bias_.assign(static_cast<std::size_t>(layers), std::vector<float>(config_.num_experts, 0.0f));
    tokens_seen_.assign(static_cast<std::size_t>(layers), std::vector<double>(config_.num_experts, 0.0));
  }
  const char* rows_label = "saved: MoE expert outputs in token order";
  for (Saved& s : saved_) {
    if (expert_parallel()) s.returned = backend_.allocate(dtype_, max_local_rows_, h, rows_label);
    if (shared > 0)
      s.shared_fc1 = backend_.allocate(dtype_, tokens_, glu * shared, "saved: MoE shared expert fc1 outputs");
  }
  if (layers == 0) return;
  // The expert rows: saved expert input and fc1 output (and the fc2 output unless the alltoall dispatcher
  // moves it at once); scratch: the activation output, the row gradients, the dispatch's received and
  // gathered rows.
  std::vector<std::int64_t> saved_cols{h, glu * ffn}, scratch_cols{ffn, h, h};
  if (!expert_parallel()) saved_cols.push_back(h);
  if (expert_parallel()) scratch_cols.push_back(h);
  if (expert_parallel() && etp > 1) scratch_cols.push_back(h);
  rows_ = std::make_unique<MoeRowArena>(backend_, dtype_, slots * layers, saved_cols, scratch_cols,
                                        moe_expert_rows(config_, local_tokens_, ep, etp));
  const char* scratch = "MoE scratch (shared)";
  // One buffer for the three: the forward's permuted rows are sent at once; in the backward the combine's
  // gradient is dispatched before the permutation's gradient comes back into it.
  if (expert_parallel())
    permuted_ = d_local_rows_ = d_x_local_rows_ = backend_.allocate(dtype_, max_local_rows_, h, scratch);
  logits_ = backend_.allocate(dtype_, local_tokens_, config_.num_experts, scratch);
  d_logits_ = backend_.allocate(dtype_, local_tokens_, config_.num_experts, scratch);
  if (shared > 0) shared_act_ = backend_.allocate(dtype_, tokens_, shared, scratch);
  if (tp_ > 1 && shared > 0) {
    shared_full_ = backend_.allocate(dtype_, tokens_, h, scratch);
    shared_shard_ = backend_.allocate(dtype_, local_tokens_, h, scratch);
    d_y_full_ = backend_.allocate(dtype_, tokens_, h, scratch);
  }
  if (tp_ > 1 && config_.router.has_aux_loss()) {
    const std::int64_t groups =
        config_.router.load_balancing == LoadBalancingType::kSeqAuxLoss ? tokens_ / seq_ : 1;
    aux_counts_ = backend_.allocate(DType::kFP32, 1, groups * config_.num_experts, scratch);
  }
}

void MoeLayers::reduce_aux_loss_counts(std::vector<double>& counts) {
  // Bookkeeping of E (or sequences x E) integers, exact in fp32; the step program does not hold it (the
  // load-balancing flags are training options, not model facts), so it is not recorded.
  if (tp_ == 1) return;
  std::vector<float> values(counts.begin(), counts.end());
  RecordingPause pause(backend_);
  backend_.upload(aux_counts_, values.data());
  communicator_.all_reduce(CommGroup::kTensor, aux_counts_, ReduceOp::kSum,
                           {"aux_loss_counts_ar", -1, layouts::OpPhase::kForward});
  backend_.download(aux_counts_, values.data());
  counts.assign(values.begin(), values.end());
}

Tensor MoeLayers::rows(Tensor t, std::int64_t first, std::int64_t count) const {
  return rows_of(t, first, count, backend_.storage_bytes(t.dtype));
}

void MoeLayers::build_permutation(Saved& s) const {
  // Megatron's permute: the kept (token, choice) pairs sorted by expert (all E: the rows for each EP rank are
  // then contiguous), tokens in order within an expert; padded to the capacity, each expert's rows are its
  // capacity, the kept ones first.
  const MoeRouting& r = s.routing;
  const int k = r.topk;
  MoePermutation& p = s.plan;
  p.tokens = r.tokens;
  p.topk = k;
  p.row_token.clear();
  p.pad_runs.clear();
  p.token_rows.assign(static_cast<std::size_t>(r.tokens * k), -1);
  p.token_probs.assign(static_cast<std::size_t>(r.tokens * k), 0.0f);
  // A counting sort (one pass to count, one to place), as the host builds it while the GPU waits.
  const std::int64_t E = config_.num_experts;
  const bool pad = config_.router.pad_to_capacity;
  const std::int64_t capacity = pad ? config_.router.expert_capacity(r.tokens) : 0;
  std::vector<std::int64_t> first_row(static_cast<std::size_t>(E + 1), 0);
  for (std::int64_t i = 0; i < r.tokens * k; ++i)
    if (r.kept[i]) ++first_row[r.expert[i] + 1];
  s.rows_per_expert.assign(first_row.begin() + 1, first_row.end());
  if (pad) std::fill(first_row.begin() + 1, first_row.end(), capacity);
  for (std::int64_t e = 0; e < E; ++e) first_row[e + 1] += first_row[e];
  p.row_token.assign(static_cast<std::size_t>(first_row[E]), 0);  // pad rows copy token 0, weighted 0
  std::vector<std::int64_t> next(first_row.begin(), first_row.end() - 1);
  for (std::int64_t t = 0; t < r.tokens; ++t)
    for (int j = 0; j < k; ++j) {
      const std::int64_t i = t * k + j;
      if (!r.kept[i]) continue;
      const std::int64_t row = next[r.expert[i]]++;
      p.token_rows[i] = static_cast<std::int32_t>(row);
      p.token_probs[i] = r.prob[i];
      p.row_token[row] = static_cast<std::int32_t>(t);
    }
  if (pad)
    for (std::int64_t e = 0; e < E; ++e) {
      p.pad_runs.emplace_back(next[e], first_row[e + 1] - next[e]);
      s.rows_per_expert[e] = capacity;
    }
  if (!expert_parallel()) s.expert_offset = first_row;  // EP 1: every expert is local
}

MoeDispatchBuffers MoeLayers::dispatch_buffers() const {
  MoeDispatchBuffers b;
  b.received = rows_->scratch(kReceived);
  if (communicator_.size(CommGroup::kExpertTensor) > 1) b.gathered = rows_->scratch(kGathered);
  return b;
}

void MoeLayers::forward(const MoeLayerLinears& w, Tensor x, Tensor x_full, Tensor y, int slot, int local,
                        int layer, OpPhase phase) {
  Saved& s = saved(slot, local);
  const int e = entry(slot, local);
  w.router->forward_gemm(x, logits_, phase);
  std::vector<float> logits(static_cast<std::size_t>(logits_.numel()));
  backend_.download(logits_, logits.data());
  const bool biased = config_.router.enable_expert_bias;
  const TokenShard shard{tp_rank_ * local_tokens_, tokens_};
  // The choice first: the permutation waits for it; the load-balancing loss (only the backward reads it) is
  // added once the experts' work is queued, while the GPU runs it.
  s.routing = route_tokens_choice(logits.data(), local_tokens_, seq_, config_.router,
                                  biased ? expert_bias_[local].data() : nullptr);
  auto add_aux_loss = [&] {
    add_load_balancing_loss(s.routing, config_.router, shard,
                            [this](std::vector<double>& counts) { reduce_aux_loss_counts(counts); });
    if (phase != OpPhase::kRecompute && config_.router.has_aux_loss())
      logged_aux_loss_ += s.routing.aux_loss / config_.router.aux_loss_coeff;
  };
  if (phase != OpPhase::kRecompute && biased)
    for (std::int64_t i = 0; i < config_.num_experts; ++i)
      tokens_seen_[local][i] += static_cast<double>(s.routing.tokens_per_expert[i]);
  if (allgather_) {
    s.plan = allgather_->dispatch(s.routing, x, s.expert_offset, layer, phase);
    const std::int64_t R = s.plan.rows();
    rows_->reserve(R);
    backend_.moe_permute(allgather_->gathered_rows(), s.plan, rows(permuted(e), 0, R),
                         {"permute", layer, phase});
    experts_forward(w, e, layer, phase);
    add_aux_loss();
    backend_.moe_unpermute(rows(expert_out(e), 0, R), s.plan, true, allgather_->combine_rows(),
                           {"unpermute", layer, phase});
    allgather_->combine(y, layer, phase);
    if (config_.shared_expert_ffn > 0) shared_forward(w, x, x_full, y, s, layer, phase);
    return;
  }
  build_permutation(s);
  const std::int64_t R = s.plan.rows();
  if (!expert_parallel()) rows_->reserve(R);  // the permuted rows are the experts' (at EP > 1 local ones)
  backend_.moe_permute(x, s.plan, rows(permuted(e), 0, R), {"permute", layer, phase});
  if (expert_parallel()) {
    s.dispatch = dispatcher_->plan(s.rows_per_expert, layer, phase);
    s.expert_offset = s.dispatch.expert_offsets();
    rows_->reserve(s.dispatch.expert_side_rows());
    dispatcher_->dispatch(s.dispatch, rows(permuted(e), 0, R), dispatch_buffers(), expert_in(e),
                          "dispatch_a2a", "dispatch_ag", layer, phase);
  }
  experts_forward(w, e, layer, phase);
  add_aux_loss();
  if (expert_parallel())
    dispatcher_->combine(s.dispatch, expert_out(e), dispatch_buffers(), rows(s.returned, 0, R), "combine_rs",
                         "combine_a2a", layer, phase);
  backend_.moe_unpermute(rows(returned(e), 0, R), s.plan, true, y, {"unpermute", layer, phase});
  if (config_.shared_expert_ffn > 0) shared_forward(w, x, x_full, y, s, layer, phase);
}

void MoeLayers::experts_forward(const MoeLayerLinears& w, int e, int layer, OpPhase phase) {
  // The local experts' rows are consecutive: one grouped GEMM per linear, one activation pass over all rows.
  const std::vector<std::int64_t>& offset = saved_[e].expert_offset;
  const std::int64_t R = offset.back();
  if (R == 0) return;
  const Tensor fc1 = expert_fc1(e), act = rows_->scratch(kAct);
  w.fc1->forward(expert_in(e), fc1, offset, phase);
  backend_.activation_forward(config_.activation, rows(fc1, 0, R), rows(act, 0, R),
                              {"expert_act", layer, phase});
  w.fc2->forward(act, expert_out(e), offset, phase);
}

void MoeLayers::shared_forward(const MoeLayerLinears& w, Tensor x, Tensor x_full, Tensor y, Saved& s,
                               int layer, OpPhase phase) {
  // As the dense MLP: GELU in fc1's GEMM epilogue, SwiGLU as its own pass. TP > 1: over the gathered
  // block input, fc2's partial sums reduce-scattered and added to the routed output; at TP 1 fc2's GEMM
  // adds its output to the routed one.
  const Tensor input = w.shared_fc1->gather_input(x, x_full, phase);
  if (config_.activation == ActivationKind::kGelu) {
    w.shared_fc1->forward_gemm_gelu(input, s.shared_fc1, shared_act_, phase);
  } else {
    w.shared_fc1->forward_gemm(input, s.shared_fc1, phase);
    backend_.activation_forward(config_.activation, s.shared_fc1, shared_act_, {"act", layer, phase});
  }
  if (tp_ == 1) {
    w.shared_fc2->forward_gemm(shared_act_, y, phase, /*accumulate=*/true);
    return;
  }
  w.shared_fc2->forward_gemm(shared_act_, shared_full_, phase);
  const Tensor shared = w.shared_fc2->reduce_output(shared_full_, shared_shard_, phase);
  backend_.add(y, shared, y, {"shared_add", layer, phase});
}

void MoeLayers::backward_routed(const MoeLayerLinears& w, Tensor d_y, Tensor d_x, int slot, int local,
                                int layer, bool accumulate) {
  Saved& s = saved(slot, local);
  const int e = entry(slot, local);
  const std::int64_t R = s.plan.rows();
  const Tensor d_rows = rows_->scratch(kDRows), d_x_rows = rows_->scratch(kDxRows);
  if (allgather_) {
    std::vector<float> plan_d_probs;
    backend_.moe_unpermute_backward(allgather_->gather_output_grad(d_y, layer), rows(expert_out(e), 0, R),
                                    s.plan, rows(d_rows, 0, R), plan_d_probs, {"unpermute", layer, kMoeBackward});
    experts_backward(w, e, layer, accumulate);
    backend_.moe_unpermute(rows(d_x_rows, 0, R), s.plan, false, allgather_->input_grad_rows(),
                           {"permute", layer, kMoeBackward});
    allgather_->scatter_input_grad(d_x, s.plan, plan_d_probs, s.routing, d_probs_, layer);
    return;
  }
  const Tensor d_local = expert_parallel() ? d_local_rows_ : d_rows;
  const Tensor d_x_local = expert_parallel() ? d_x_local_rows_ : d_x_rows;
  backend_.moe_unpermute_backward(d_y, rows(returned(e), 0, R), s.plan, rows(d_local, 0, R), d_probs_,
                                  {"unpermute", layer, kMoeBackward});
  if (expert_parallel())
    dispatcher_->dispatch(s.dispatch, rows(d_local, 0, R), dispatch_buffers(), d_rows, "combine_grad_a2a",
                          "combine_grad_ag", layer, kMoeBackward);
  experts_backward(w, e, layer, accumulate);
  if (expert_parallel())
    dispatcher_->combine(s.dispatch, d_x_rows, dispatch_buffers(), rows(d_x_local, 0, R), "dispatch_grad_rs",
                         "dispatch_grad_a2a", layer, kMoeBackward);
  backend_.moe_unpermute(rows(d_x_local, 0, R), s.plan, false, d_x, {"permute", layer, kMoeBackward});
}

void MoeLayers::backward_dense(const MoeLayerLinears& w, Tensor x, Tensor x_full, Tensor d_y, Tensor d_x,
                               int slot, int local, int layer, bool accumulate, float aux_loss_scale) {
  Saved& s = saved(slot, local);
  if (config_.shared_expert_ffn > 0) shared_backward(w, x, x_full, d_y, d_x, s, layer, accumulate);
  router_backward(w, x, d_x, s, d_probs_, accumulate, aux_loss_scale);
}

void MoeLayers::experts_backward(const MoeLayerLinears& w, int e, int layer, bool accumulate) {
  // As the dense MLP's backward, grouped over the local experts: fc2's data gradient into the activation
  // scratch, one pass turning it into fc1's output gradient (over the saved fc1 output) and recomputing the
  // activation output, then the weight gradients. The iteration's first write overwrites an expert's
  // gradient; an expert without rows then gets zeros.
  const std::vector<std::int64_t>& offset = saved_[e].expert_offset;
  const std::int64_t R = offset.back();
  const Tensor fc1 = expert_fc1(e), act = rows_->scratch(kAct), d_rows = rows_->scratch(kDRows);
  w.fc2->data_grad(d_rows, act, offset);
  if (R > 0)
    backend_.activation_backward_recompute(config_.activation, rows(fc1, 0, R), rows(act, 0, R),
                                           rows(fc1, 0, R), rows(act, 0, R), {"expert_act", layer, kMoeBackward});
  w.fc2->weight_grad(d_rows, act, offset, accumulate);
  w.fc1->data_grad(fc1, rows_->scratch(kDxRows), offset);
  w.fc1->weight_grad(fc1, expert_in(e), offset, accumulate);
}

void MoeLayers::shared_backward(const MoeLayerLinears& w, Tensor x, Tensor x_full, Tensor d_y, Tensor d_x,
                                Saved& s, int layer, bool accumulate) {
  // TP > 1: over the gathered output gradient and block input; fc1's data gradient reduce-scattered and
  // added to the routed experts'. At TP 1 fc1's data-gradient GEMM adds to theirs.
  const bool split = tp_ > 1;
  const Tensor dy = w.shared_fc2->gather_output_grad(d_y, d_y_full_);
  w.shared_fc2->data_grad(dy, shared_act_);
  backend_.activation_backward_recompute(config_.activation, s.shared_fc1, shared_act_, s.shared_fc1,
                                         shared_act_, {"act", layer, kMoeBackward});
  w.shared_fc2->weight_grad(dy, shared_act_, accumulate);
  w.shared_fc1->data_grad(s.shared_fc1, split ? shared_full_ : d_x, /*accumulate=*/!split);
  w.shared_fc1->weight_grad(s.shared_fc1, w.shared_fc1->gather_input(x, x_full, kMoeBackward), accumulate);
  if (!split) return;
  const Tensor shared = w.shared_fc1->reduce_input_grad(shared_full_, shared_shard_);
  backend_.add(d_x, shared, d_x, {"shared_dgrad_add", layer, kMoeBackward});
}

void MoeLayers::router_backward(const MoeLayerLinears& w, Tensor x, Tensor d_x, Saved& s,
                                const std::vector<float>& d_probs, bool accumulate, float aux_loss_scale) {
  std::vector<float> d_logits(static_cast<std::size_t>(d_logits_.numel()));
  route_tokens_backward(s.routing, config_.router, d_probs.data(), aux_loss_scale, d_logits.data());
  backend_.upload(d_logits_, d_logits.data());
  w.router->data_grad(d_logits_, d_x, /*accumulate=*/true);
  w.router->weight_grad(d_logits_, x, accumulate);
}

void MoeLayers::apply_expert_bias_update(const std::vector<double>& all_counts) {
  const std::int64_t E = config_.num_experts;
  for (int l = 0; l < layers_; ++l) {
    const std::vector<double> counts(all_counts.begin() + l * E, all_counts.begin() + (l + 1) * E);
    update_expert_bias(counts, config_.router.bias_update_rate, expert_bias_[l]);
    std::fill(tokens_seen_[l].begin(), tokens_seen_[l].end(), 0.0);
  }
}

}  // namespace megatune::executor
