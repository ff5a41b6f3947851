// MoeLayers: router, permutation, local experts, combine and shared expert, forward and backward.
#include "executor/model/moe_layer.h"

#include <algorithm>
#include <stdexcept>

#include "executor/backend/recording_pause.h"

namespace megatune::executor {
namespace {

using layouts::OpPhase;
constexpr OpPhase kB = OpPhase::kBackward;

}  // namespace

MoeLayers::MoeLayers(const TransformerConfig& config, std::int64_t tokens, std::int64_t seq, int layers,
                     int slots, DType compute_dtype, Backend& backend, Communicator& communicator)
    : config_(config),
      tokens_(tokens),
      seq_(seq),
      layers_(layers),
      tp_(communicator.size(CommGroup::kTensor)),
      tp_rank_(communicator.rank(CommGroup::kTensor)),
      dtype_(compute_dtype),
      backend_(backend),
      communicator_(communicator) {
  if (tokens % seq != 0) throw std::invalid_argument("MoeLayers: tokens must be whole sequences");
  if (tokens % tp_ != 0) throw std::invalid_argument("MoeLayers: tokens must split over the TP ranks");
  if (tp_ > 1 && !config_.sequence_parallel)
    throw std::invalid_argument("MoeLayers: tensor parallelism needs sequence parallelism");
  local_tokens_ = tokens_ / tp_;
  const std::int64_t h = config_.hidden, glu = config_.glu_factor(), ffn = config_.moe_ffn_per_rank(),
                     shared = config_.shared_expert_ffn / config_.tensor_parallel_size;
  max_local_rows_ = local_tokens_ * config_.router.topk;  // dropless: every choice of every token
  max_expert_rows_ = max_local_rows_;
  if (layers > 0 && config_.moe_allgather_dispatcher && communicator.size(CommGroup::kTensorExpert) > 1) {
    allgather_ = std::make_unique<MoeAllGatherDispatcher>(backend_, communicator, config_.num_experts,
                                                          local_tokens_, h, dtype_);
    max_local_rows_ = max_expert_rows_ = allgather_->max_expert_rows(config_.router.topk);
  } else if (layers > 0 && communicator.size(CommGroup::kTensorExpert) > 1) {
    dispatcher_ = std::make_unique<MoeDispatcher>(backend_, communicator, config_.num_experts,
                                                  max_local_rows_, h, dtype_);
    max_expert_rows_ = dispatcher_->max_received_rows();
  }
  saved_.resize(static_cast<std::size_t>(slots * layers));
  if (config_.router.enable_expert_bias) {
    expert_bias_.assign(static_cast<std::size_t>(layers), std::vector<float>(config_.num_experts, 0.0f));
    tokens_seen_.assign(static_cast<std::size_t>(layers), std::vector<double>(config_.num_experts, 0.0));
  }
  const char* rows_label = "saved: MoE permuted tokens and expert outputs";
  for (Saved& s : saved_) {
    s.permuted = backend_.allocate(dtype_, max_local_rows_, h, rows_label);
    s.expert_in = expert_parallel() ? backend_.allocate(dtype_, max_expert_rows_, h, rows_label) : s.permuted;
    s.fc1 = backend_.allocate(dtype_, max_expert_rows_, glu * ffn, "saved: MoE expert fc1 outputs");
    s.expert_out = backend_.allocate(dtype_, max_expert_rows_, h, rows_label);
    s.returned = expert_parallel() ? backend_.allocate(dtype_, max_local_rows_, h, rows_label) : s.expert_out;
    if (shared > 0)
      s.shared_fc1 = backend_.allocate(dtype_, tokens_, glu * shared, "saved: MoE expert fc1 outputs");
  }
  if (layers == 0) return;
  const char* scratch = "MoE scratch (shared)";
  act_ = backend_.allocate(dtype_, max_expert_rows_, ffn, scratch);
  d_rows_ = backend_.allocate(dtype_, max_expert_rows_, h, scratch);
  d_x_rows_ = backend_.allocate(dtype_, max_expert_rows_, h, scratch);
  d_local_rows_ = expert_parallel() ? backend_.allocate(dtype_, max_local_rows_, h, scratch) : d_rows_;
  d_x_local_rows_ = expert_parallel() ? backend_.allocate(dtype_, max_local_rows_, h, scratch) : d_x_rows_;
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
  // then contiguous), tokens in order within an expert.
  const MoeRouting& r = s.routing;
  const int k = r.topk;
  MoePermutation& p = s.plan;
  p.tokens = r.tokens;
  p.topk = k;
  p.row_token.clear();
  p.token_rows.assign(static_cast<std::size_t>(r.tokens * k), -1);
  p.token_probs.assign(static_cast<std::size_t>(r.tokens * k), 0.0f);
  // A counting sort (one pass to count, one to place), as the host builds it while the GPU waits.
  const std::int64_t E = config_.num_experts;
  std::vector<std::int64_t> first_row(static_cast<std::size_t>(E + 1), 0);
  for (std::int64_t i = 0; i < r.tokens * k; ++i)
    if (r.kept[i]) ++first_row[r.expert[i] + 1];
  for (std::int64_t e = 0; e < E; ++e) first_row[e + 1] += first_row[e];
  p.row_token.resize(static_cast<std::size_t>(first_row[E]));
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
  if (!expert_parallel()) s.expert_offset = first_row;  // EP 1: every expert is local
}

void MoeLayers::forward(const MoeLayerLinears& w, Tensor x, Tensor x_full, Tensor y, int slot, int local,
                        int layer, OpPhase phase) {
  Saved& s = saved(slot, local);
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
    for (std::int64_t e = 0; e < config_.num_experts; ++e)
      tokens_seen_[local][e] += static_cast<double>(s.routing.tokens_per_expert[e]);
  if (allgather_) {
    s.plan = allgather_->dispatch(s.routing, x, s.expert_offset, layer, phase);
    const std::int64_t R = s.plan.rows();
    backend_.moe_permute(allgather_->gathered_rows(), s.plan, rows(s.permuted, 0, R),
                         {"permute", layer, phase});
    experts_forward(w, s, layer, phase);
    add_aux_loss();
    backend_.moe_unpermute(rows(s.expert_out, 0, R), s.plan, true, allgather_->combine_rows(),
                           {"unpermute", layer, phase});
    allgather_->combine(y, layer, phase);
    if (config_.shared_expert_ffn > 0) shared_forward(w, x, x_full, y, s, layer, phase);
    return;
  }
  build_permutation(s);
  const std::int64_t R = s.plan.rows();
  backend_.moe_permute(x, s.plan, rows(s.permuted, 0, R), {"permute", layer, phase});
  if (expert_parallel()) {
    s.dispatch = dispatcher_->plan(s.routing.tokens_per_expert, layer, phase);
    s.expert_offset = s.dispatch.expert_offsets();
    dispatcher_->dispatch(s.dispatch, s.permuted, s.expert_in, "dispatch_a2a", "dispatch_ag", layer, phase);
  }
  experts_forward(w, s, layer, phase);
  add_aux_loss();
  if (expert_parallel())
    dispatcher_->combine(s.dispatch, s.expert_out, s.returned, "combine_rs", "combine_a2a", layer, phase);
  backend_.moe_unpermute(rows(s.returned, 0, R), s.plan, true, y, {"unpermute", layer, phase});
  if (config_.shared_expert_ffn > 0) shared_forward(w, x, x_full, y, s, layer, phase);
}

void MoeLayers::experts_forward(const MoeLayerLinears& w, Saved& s, int layer, OpPhase phase) {
  // The local experts' rows are consecutive: one grouped GEMM per linear, one activation pass over all rows.
  const std::int64_t R = s.expert_offset.back();
  if (R == 0) return;
  w.fc1->forward(s.expert_in, s.fc1, s.expert_offset, phase);
  backend_.activation_forward(config_.activation, rows(s.fc1, 0, R), rows(act_, 0, R),
                              {"expert_act", layer, phase});
  w.fc2->forward(act_, s.expert_out, s.expert_offset, phase);
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
  const std::int64_t R = s.plan.rows();
  if (allgather_) {
    std::vector<float> plan_d_probs;
    backend_.moe_unpermute_backward(allgather_->gather_output_grad(d_y, layer), rows(s.expert_out, 0, R),
                                    s.plan, rows(d_rows_, 0, R), plan_d_probs, {"unpermute", layer, kB});
    experts_backward(w, s, layer, accumulate);
    backend_.moe_unpermute(rows(d_x_rows_, 0, R), s.plan, false, allgather_->input_grad_rows(),
                           {"permute", layer, kB});
    allgather_->scatter_input_grad(d_x, s.plan, plan_d_probs, s.routing, d_probs_, layer);
    return;
  }
  backend_.moe_unpermute_backward(d_y, rows(s.returned, 0, R), s.plan, rows(d_local_rows_, 0, R), d_probs_,
                                  {"unpermute", layer, kB});
  if (expert_parallel())
    dispatcher_->dispatch(s.dispatch, d_local_rows_, d_rows_, "combine_grad_a2a", "combine_grad_ag", layer,
                          kB);
  experts_backward(w, s, layer, accumulate);
  if (expert_parallel())
    dispatcher_->combine(s.dispatch, d_x_rows_, d_x_local_rows_, "dispatch_grad_rs", "dispatch_grad_a2a",
                         layer, kB);
  backend_.moe_unpermute(rows(d_x_local_rows_, 0, R), s.plan, false, d_x, {"permute", layer, kB});
}

void MoeLayers::backward_dense(const MoeLayerLinears& w, Tensor x, Tensor x_full, Tensor d_y, Tensor d_x,
                               int slot, int local, int layer, bool accumulate, float aux_loss_scale) {
  Saved& s = saved(slot, local);
  if (config_.shared_expert_ffn > 0) shared_backward(w, x, x_full, d_y, d_x, s, layer, accumulate);
  router_backward(w, x, d_x, s, d_probs_, accumulate, aux_loss_scale);
}

void MoeLayers::experts_backward(const MoeLayerLinears& w, Saved& s, int layer, bool accumulate) {
  // As the dense MLP's backward, grouped over the local experts: fc2's data gradient into the activation
  // scratch, one pass turning it into fc1's output gradient (over the saved fc1 output) and recomputing the
  // activation output, then the weight gradients. The iteration's first write overwrites an expert's
  // gradient; an expert without rows then gets zeros.
  const std::int64_t R = s.expert_offset.back();
  w.fc2->data_grad(d_rows_, act_, s.expert_offset);
  if (R > 0)
    backend_.activation_backward_recompute(config_.activation, rows(s.fc1, 0, R), rows(act_, 0, R),
                                           rows(s.fc1, 0, R), rows(act_, 0, R), {"expert_act", layer, kB});
  w.fc2->weight_grad(d_rows_, act_, s.expert_offset, accumulate);
  w.fc1->data_grad(s.fc1, d_x_rows_, s.expert_offset);
  w.fc1->weight_grad(s.fc1, s.expert_in, s.expert_offset, accumulate);
}

void MoeLayers::shared_backward(const MoeLayerLinears& w, Tensor x, Tensor x_full, Tensor d_y, Tensor d_x,
                                Saved& s, int layer, bool accumulate) {
  // TP > 1: over the gathered output gradient and block input; fc1's data gradient reduce-scattered and
  // added to the routed experts'. At TP 1 fc1's data-gradient GEMM adds to theirs.
  const bool split = tp_ > 1;
  const Tensor dy = w.shared_fc2->gather_output_grad(d_y, d_y_full_);
  w.shared_fc2->data_grad(dy, shared_act_);
  backend_.activation_backward_recompute(config_.activation, s.shared_fc1, shared_act_, s.shared_fc1,
                                         shared_act_, {"act", layer, kB});
  w.shared_fc2->weight_grad(dy, shared_act_, accumulate);
  w.shared_fc1->data_grad(s.shared_fc1, split ? shared_full_ : d_x, /*accumulate=*/!split);
  w.shared_fc1->weight_grad(s.shared_fc1, w.shared_fc1->gather_input(x, x_full, kB), accumulate);
  if (!split) return;
  const Tensor shared = w.shared_fc1->reduce_input_grad(shared_full_, shared_shard_);
  backend_.add(d_x, shared, d_x, {"shared_dgrad_add", layer, kB});
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
