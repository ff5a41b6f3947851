// MoeLayers: the MoE MLP blocks of a pipeline stage, as Megatron's MoELayer runs them with the alltoall
// dispatcher: router GEMM -> routing on the host (moe_router.h) -> permute the token copies into expert
// order -> all-to-all over the expert-parallel group and, under expert tensor parallelism, all-gather over
// the expert-tensor-parallel group (moe_dispatch.h; neither at EP 1 and ETP 1) -> per local expert fc1
// (column-parallel over ETP), activation, fc2 (row-parallel) over its rows -> reduce-scatter over ETP and
// all-to-all back -> unpermute (weighted by the routing probabilities) -> + the shared expert's MLP; and the
// backward of all of it. With --moe-token-dispatcher-type allgather the
// routing and rows are all-gathered over the tp-ep group instead, the local experts run over the gathered
// rows routed to them, and a reduce-scatter brings each rank its rows back (moe_allgather_dispatch.h). Under
// tensor parallelism (sequence parallel, as Megatron requires for MoE) the layer sees the TP rank's T / tp
// rows: the router, the permutation and the dispatch work on them, the shared expert (split over TP like the
// dense MLP) gathers them and reduce-scatters its output, and the load-balancing loss counts its experts'
// tokens over the TP group.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "executor/backend/backend.h"
#include "executor/model/moe_allgather_dispatch.h"
#include "executor/model/moe_dispatch.h"
#include "executor/model/moe_router.h"
#include "executor/model/moe_row_arena.h"
#include "executor/model/transformer_config.h"
#include "executor/parallel/tensor_parallel.h"

namespace megatune::executor {

// One MoE layer's linears on this rank (with their weights and gradients; the model owns them).
struct MoeLayerLinears {
  const TensorParallelLinear* router = nullptr;  // (E, h), replicated
  const ExpertLinears* fc1 = nullptr;            // per local expert (glu * F_moe / etp, h)
  const ExpertLinears* fc2 = nullptr;            // per local expert (h, F_moe / etp)
  // (glu * F_shared / tp, h) column- and (h, F_shared / tp) row-parallel; null without a shared expert
  const TensorParallelLinear* shared_fc1 = nullptr;
  const TensorParallelLinear* shared_fc2 = nullptr;
};

class MoeLayers {
 public:
  // Buffers for `layers` local MoE layers (local index 0..layers-1), `slots` micro-batches in flight,
  // micro-batches of the shape's tokens in sequences of its seq_local (the layer sees tokens / tp of them; TP
  // > 1 needs sequence parallelism).
  MoeLayers(const TransformerConfig& config, const layouts::RankShape& shape, int layers, int slots,
            DType compute_dtype, Backend& backend, Communicator& communicator);

  // y (T / tp, h) = the MoE MLP of x (T / tp, h) (the pre-MLP norm output's shard); x_full (T, h): where
  // the shared expert gathers x at tp > 1 (x itself at tp 1). Keeps what the backward needs in (slot,
  // local). `layer` (global) and `phase` tag the ops. Adds the micro-batch's load-balancing loss (divided by
  // its coefficient, as Megatron logs it; this shard's part under TP) to the logged sum unless phase is a
  // recompute.
  void forward(const MoeLayerLinears& w, Tensor x, Tensor x_full, Tensor y, int slot, int local, int layer,
               layouts::OpPhase phase);
  // The backward in two parts, with the recompute of x (the pre-MLP norm output) between them: the routed
  // experts' (d_x (T / tp, h) = their part of x's gradient, written) from d_y (T / tp, h), then the shared
  // expert's and the router's (added to d_x; they read x, and x_full as in forward). Weight gradients into
  // the linears' gradients, accumulated when `accumulate` (else the iteration's first write overwrites).
  // aux_loss_scale: the factor the load-balancing loss's gradient carries (1 / (micro-batches *
  // data-parallel ranks)).
  void backward_routed(const MoeLayerLinears& w, Tensor d_y, Tensor d_x, int slot, int local, int layer,
                       bool accumulate);
  void backward_dense(const MoeLayerLinears& w, Tensor x, Tensor x_full, Tensor d_y, Tensor d_x, int slot,
                      int local, int layer, bool accumulate, float aux_loss_scale);

  // --moe-router-enable-expert-bias: each layer's expert bias (E) and the tokens its experts got in the
  // forward passes since the last update (E); apply_expert_bias_update moves the biases by the counts
  // summed over the data-parallel ranks (all_counts: (layers, E), local layer order) and clears them.
  bool has_expert_bias() const { return config_.router.enable_expert_bias; }
  std::vector<float>& expert_bias(int local) { return expert_bias_.at(local); }
  const std::vector<double>& tokens_since_update(int local) const { return tokens_seen_.at(local); }
  void apply_expert_bias_update(const std::vector<double>& all_counts);
  int layers() const { return layers_; }
  // Sum over the forward passes since the last reset of the load-balancing loss / coefficient.
  double logged_load_balancing_loss() const { return logged_aux_loss_; }
  void reset_logged_load_balancing_loss() { logged_aux_loss_ = 0.0; }
  // The routing of (slot, local)'s last forward (tests).
  const MoeRouting& routing(int slot, int local) const { return saved(slot, local).routing; }
  // The expert rows' blocks: their rows now, their bound, how often a step grew them (tests, reports).
  const MoeRowArena& expert_rows() const { return *rows_; }

 private:
  // Rows: "local" ones are this rank's token copies in global expert order (R_local <= T * k); "expert" ones
  // are what this rank's experts process, sorted by local expert (the same rows as the local ones at EP 1 and
  // ETP 1). The expert rows live in rows_ (moe_row_arena.h), sized to what the step routes: fetch their
  // views after rows_.reserve(), never keep them across one.
  struct Saved {
    MoeRouting routing;
    MoePermutation plan;
    MoeDispatchPlan dispatch;                   // etp x ep > 1: where the rows went
    std::vector<std::int64_t> expert_offset;    // (local experts + 1) first expert row of each local expert
    std::vector<std::int64_t> rows_per_expert;  // (E) this rank's rows for each expert (padded: capacity)
    Tensor returned;    // (R_local max, h) the alltoall dispatcher's expert outputs back in local order
    Tensor shared_fc1;  // (T, glu * F_shared / tp) pre-activation
  };
  // rows_'s saved buffers (per (slot, local)) and scratch buffers.
  enum SavedRows { kExpertIn, kExpertFc1, kExpertOut };
  enum ScratchRows { kAct, kDRows, kDxRows, kReceived, kGathered };
  int entry(int slot, int local) const { return slot * layers_ + local; }
  Tensor expert_in(int e) const { return rows_->saved(e, kExpertIn); }    // (R_expert, h)
  Tensor expert_fc1(int e) const { return rows_->saved(e, kExpertFc1); }  // (R_expert, glu * F_moe / etp)
  // (R_expert, h) fc2 outputs (partial sums over ETP); the alltoall dispatcher combines them at once
  // (scratch)
  Tensor expert_out(int e) const {
    return expert_parallel() ? rows_->scratch(kDRows) : rows_->saved(e, kExpertOut);
  }
  // (R_local, h) the token copies in expert order (the experts' input unless the alltoall dispatcher moves
  // them)
  Tensor permuted(int e) const { return expert_parallel() ? permuted_ : expert_in(e); }
  // (R_local, h) the expert outputs in local order (what the weighted combine's backward reads)
  Tensor returned(int e) const { return expert_parallel() ? saved_[e].returned : expert_out(e); }
  MoeDispatchBuffers dispatch_buffers() const;
  Saved& saved(int slot, int local) { return saved_[slot * layers_ + local]; }
  const Saved& saved(int slot, int local) const { return saved_[slot * layers_ + local]; }
  void build_permutation(Saved& s) const;
  bool expert_parallel() const { return dispatcher_ != nullptr; }
  void experts_forward(const MoeLayerLinears& w, int e, int layer, layouts::OpPhase phase);
  void experts_backward(const MoeLayerLinears& w, int e, int layer, bool accumulate);
  void shared_forward(const MoeLayerLinears& w, Tensor x, Tensor x_full, Tensor y, Saved& s, int layer,
                      layouts::OpPhase phase);
  void shared_backward(const MoeLayerLinears& w, Tensor x, Tensor x_full, Tensor d_y, Tensor d_x, Saved& s,
                       int layer, bool accumulate);
  // The load-balancing loss's token counts summed over the TP group (the shards of the micro-batch).
  void reduce_aux_loss_counts(std::vector<double>& counts);
  void router_backward(const MoeLayerLinears& w, Tensor x, Tensor d_x, Saved& s,
                       const std::vector<float>& d_probs, bool accumulate, float aux_loss_scale);
  Tensor rows(Tensor t, std::int64_t first, std::int64_t count) const;

  TransformerConfig config_;
  // tokens_: the micro-batch's T; local_tokens_: this TP rank's T / tp rows, from row tp_rank * T / tp.
  std::int64_t tokens_ = 0, local_tokens_ = 0, seq_ = 0, max_local_rows_ = 0;
  int layers_ = 0, tp_ = 1, tp_rank_ = 0;
  DType dtype_;
  Backend& backend_;
  Communicator& communicator_;
  std::vector<Saved> saved_;  // (slot, local)
  // Shared by the layers: the logits and their gradient (T, E), the shared expert's activation (T, F_s).
  // (The activation output (R_expert, F_moe / etp), recomputed in the backward, and the expert rows'
  // gradients are rows_'s scratch.)
  Tensor logits_, d_logits_, shared_act_;
  // EP or ETP > 1 (alltoall): the permuted local rows and the gradients of the local rows (the combine's and
  // the permutation's), (R_local max, h), one buffer (their lifetimes do not overlap).
  Tensor permuted_, d_local_rows_, d_x_local_rows_;
  std::unique_ptr<MoeRowArena> rows_;
  // TP > 1: the shared expert's (T, h) partial output or input gradient, its reduce-scattered shard
  // (T / tp, h) and the gathered output gradient (T, h); the aux-loss counts' all-reduce buffer.
  Tensor shared_full_, shared_shard_, d_y_full_, aux_counts_;
  std::unique_ptr<MoeDispatcher> dispatcher_;          // etp x ep > 1, alltoall
  std::unique_ptr<MoeAllGatherDispatcher> allgather_;  // tp-ep > 1, allgather (moe_allgather_dispatch.h)
  std::vector<float> d_probs_;                    // (T * k) host: the routed backward's probability gradients
  std::vector<std::vector<float>> expert_bias_;   // per local layer (E), with --moe-router-enable-expert-bias
  std::vector<std::vector<double>> tokens_seen_;  // per local layer (E)
  double logged_aux_loss_ = 0.0;
};

}  // namespace megatune::executor
