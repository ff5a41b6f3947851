// Per rank of parallel layouts on the CPU backend: the ops the executor issued in one iteration (kernels
// and collectives, p2p peers included) equal layouts::build_step_program(rank) op for op, each on the
// stream the step program (and so the simulator) puts it on: kernels on the compute stream, collectives on
// their group's communication stream.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>

#include "executor/training/thread_run.h"
#include "layouts/model_spec.h"
#include "layouts/parallel_config.h"
#include "layouts/step_program.h"
#include "tests/executor/parallel_test_models.h"

namespace megatune::executor {
namespace {

struct Case {
  std::string name;
  int tp = 1, pp = 1, dp = 1, vpp = 0;
  bool sp = false, overlap = false, gpt = false, tied = false;
  std::string layout;
  bool dist_opt = false;
  int cp = 1;
  // tiny-deepseek-v3-mla, with or without q_lora_rank
  enum class Mla { kNone, kQLora, kQProj };
  Mla mla = Mla::kNone;
  layouts::RecomputeGranularity recompute = layouts::RecomputeGranularity::kNone;
  int ep = 0;   // > 0: the MoE model (4 experts, top-2, a shared expert) at this expert-parallel size
  int etp = 0;  // --expert-tensor-parallel-size; 0: Megatron's default (tp)
  bool allgather = false;                             // --moe-token-dispatcher-type allgather
  int mtp = 0;                                        // --mtp-num-layers
  std::optional<layouts::DataParallelSharding> fsdp;  // --use-megatron-fsdp with this strategy
  // Full recomputation's unit rule (recompute kFull; kNone: uniform 1).
  layouts::RecomputeMethod recompute_method = layouts::RecomputeMethod::kNone;
  int recompute_num_layers = 0;
  bool qk_layernorm = false;  // --qk-layernorm's head norms
};

// The case with --qk-layernorm.
Case qk_layernorm(Case c) {
  c.qk_layernorm = true;
  return c;
}

// Partial full recomputation: `method` with `layers` over the case's layout.
Case partial_recompute(Case c, layouts::RecomputeMethod method, int layers) {
  c.recompute = layouts::RecomputeGranularity::kFull;
  c.recompute_method = method;
  c.recompute_num_layers = layers;
  return c;
}

// Megatron FSDP optim_grads_params (the per-segment gathers in the forward and the backward).
Case fsdp_case(std::string name, int tp, int pp, int dp, int ep, bool overlap) {
  Case c{std::move(name), tp, pp, dp};
  c.ep = ep;
  c.overlap = overlap;
  c.fsdp = layouts::DataParallelSharding::kOptimGradsParams;
  return c;
}

// The same case under another Megatron FSDP strategy (optim_grads: the sharded gradients' reduce-scatter
// after each bucket's backward in every micro-batch, the bf16 copy whole).
Case with_fsdp(Case c, layouts::DataParallelSharding sharding) {
  c.fsdp = sharding;
  return c;
}

// The case with `layers` MTP layers (--mtp-num-layers).
Case with_mtp(Case c, int layers) {
  c.mtp = layers;
  return c;
}

layouts::ModelSpec model_of(const Case& c) {
  layouts::ModelSpec m = c.mla != Case::Mla::kNone ? test::deepseek_mla_tiny(c.mla == Case::Mla::kQLora)
                         : c.gpt                   ? test::gpt_tiny(c.tied)
                                                   : test::llama_tiny(c.tied);
  m.mtp_num_layers = c.mtp;
  m.qk_layernorm = c.qk_layernorm;
  if (c.ep > 0) {
    m.num_experts = 4;
    m.moe_router_topk = 2;
    m.moe_ffn_hidden_size = 32;
    m.moe_shared_expert_intermediate_size = 48;
    m.moe_layer_pattern = {1, 0, 1, 1};
    m.add_bias_linear = false;  // experts have none
  }
  return m;
}

// Expert parallelism: the rows an expert receives follow the routing, the step program's follow uniform
// routing: the experts' GEMMs and activation, the all-to-alls of received rows and the alltoall dispatcher's
// ETP all-gathers and reduce-scatters (with the allgather dispatcher the permutation of the gathered rows
// too) are compared but for those sizes. The all-to-alls that send this rank's own token copies (the
// dispatch, and the combine's gradient) carry every choice (dropless, no padding): their bytes are compared
// too.
bool same_work(const layouts::Op& e, const layouts::Op& p, bool routed_sizes) {
  const bool sends_own_rows = e.label == "dispatch_a2a" || e.label == "combine_grad_a2a";
  const bool routed = e.label.rfind("expert_", 0) == 0 ||
                      (e.kind == layouts::OpKind::kAllToAll && !sends_own_rows) ||
                      e.kind == layouts::OpKind::kRouter || e.group == layouts::CommGroup::kExpertTensor;
  if (!routed_sizes || !routed) return e.same_work(p);
  layouts::Op sized = e;
  sized.m = p.m;
  sized.k = p.k;
  sized.bytes = p.bytes;
  return sized.same_work(p);
}

layouts::ParallelConfig config_of(const layouts::ModelSpec& m, const Case& c) {
  layouts::ParallelConfig p;
  p.tensor_model_parallel_size = c.tp;
  p.pipeline_model_parallel_size = c.pp;
  p.context_parallel_size = c.cp;
  p.expert_model_parallel_size = std::max(c.ep, 1);
  p.expert_tensor_parallel_size = c.etp;
  if (c.allgather) p.moe_token_dispatcher_type = layouts::MoeDispatcher::kAllGather;
  p.world_size = c.tp * c.pp * c.dp * c.cp;
  p.sequence_parallel = c.sp;
  p.micro_batch_size = 2;
  p.global_batch_size = 4 * c.dp;
  p.num_virtual_stages_per_pipeline_rank = c.vpp;
  p.overlap_p2p_comm = c.vpp > 0;
  p.pipeline_model_parallel_layout = c.layout;
  p.overlap_grad_reduce = c.overlap;
  p.use_distributed_optimizer = c.dist_opt;
  p.recompute_granularity = c.recompute;
  if (c.recompute == layouts::RecomputeGranularity::kFull) {
    const bool given = c.recompute_method != layouts::RecomputeMethod::kNone;
    p.recompute_method = given ? c.recompute_method : layouts::RecomputeMethod::kUniform;
    p.recompute_num_layers = given ? c.recompute_num_layers : 1;
  }
  p.overlap_param_gather = c.dist_opt && c.overlap;
  if (c.fsdp) {
    p.use_megatron_fsdp = true;
    p.data_parallel_sharding_strategy = *c.fsdp;
  }
  p.validate(m);
  return p;
}

class ParallelOpRecording : public ::testing::TestWithParam<Case> {};

TEST_P(ParallelOpRecording, EveryRankIssuesItsStepProgram) {
  const Case& c = GetParam();
  const layouts::ModelSpec model = model_of(c);
  const layouts::ParallelConfig config = config_of(model, c);
  TrainOptions options;
  options.train_iters = 1;
  options.mock_data = true;
  options.bf16 = true;  // the step program counts bf16 activations
  std::map<int, std::vector<layouts::Op>> issued;
  std::mutex mutex;
  std::ostringstream log;
  train_on_threads(
      model, config, options, log,
      [&](int rank, TrainingRun& run) {
        std::lock_guard<std::mutex> lock(mutex);
        issued[rank] = run.trainer().backend().recorder().ops();
      },
      /*record_first_iteration=*/true);
  ASSERT_EQ(static_cast<int>(issued.size()), config.world_size);
  for (const auto& [rank, ops] : issued) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const std::vector<layouts::Op> planned = layouts::build_step_program(model, config, rank).ops;
    const std::size_t n = std::min(ops.size(), planned.size());
    for (std::size_t i = 0; i < n; ++i) {
      const layouts::Op& e = ops[i];
      const layouts::Op& p = planned[i];
      ASSERT_TRUE(same_work(e, p, c.ep > 1 || c.etp > 1) && e.microbatch == p.microbatch &&
                  e.chunk == p.chunk && e.peer_rank == p.peer_rank && e.stream == p.stream)
          << "op " << i << "\n  executor: " << layouts::to_string(e) << " peer " << e.peer_rank << " stream "
          << layouts::comm_group_name(e.stream) << "\n  planner:  " << layouts::to_string(p) << " peer "
          << p.peer_rank << " stream " << layouts::comm_group_name(p.stream);
      ASSERT_EQ(e.is_communication(), e.stream != layouts::CommGroup::kNone) << layouts::to_string(e);
    }
    EXPECT_EQ(ops.size(), planned.size());
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, ParallelOpRecording,
    ::testing::Values(
        Case{"tp2_llama", 2}, Case{"tp2_sp_gpt_tied", 2, 1, 1, 0, true, false, true, true},
        Case{"dp2_overlap", 1, 1, 2, 0, false, true}, Case{"tp2_dp2_overlap", 2, 1, 2, 0, false, true},
        Case{"pp2_gpt_tied", 1, 2, 1, 0, false, false, true, true}, Case{"pp2_vpp2", 1, 2, 1, 2},
        Case{"pp4_custom", 1, 4, 1, 0, false, false, false, false, "Et|tt||tL"},
        Case{"tp2_sp_pp2_dp2", 2, 2, 2, 0, true, false, true, true},
        Case{"dp2_dist_opt", 1, 1, 2, 0, false, false, true, false, "", true},
        Case{"tp2_pp2_dp2_dist_opt_overlaps", 2, 2, 2, 0, false, true, false, true, "", true},
        Case{"cp2_llama", 1, 1, 1, 0, false, false, false, false, "", false, 2},
        Case{"tp2_sp_cp2_gpt_tied", 2, 1, 1, 0, true, false, true, true, "", false, 2},
        Case{"cp2_pp2_dp2_overlap", 1, 2, 2, 0, false, true, false, false, "", false, 2},
        Case{"cp4_gpt", 1, 1, 1, 0, false, false, true, false, "", false, 4},
        Case{"mla_tp2_sp", 2, 1, 1, 0, true, false, false, false, "", false, 1, Case::Mla::kQLora},
        Case{"mla_q_proj_tp2", 2, 1, 1, 0, false, false, false, false, "", false, 1, Case::Mla::kQProj},
        Case{"mla_q_proj_tp2_sp", 2, 1, 1, 0, true, false, false, false, "", false, 1, Case::Mla::kQProj},
        Case{"mla_tp2_pp2", 2, 2, 1, 0, false, false, false, false, "", false, 1, Case::Mla::kQLora},
        Case{"mla_tp2_sp_selective", 2, 1, 1, 0, true, false, false, false, "", false, 1, Case::Mla::kQLora,
             layouts::RecomputeGranularity::kSelective},
        Case{"mla_q_proj_tp2_sp_full", 2, 1, 1, 0, true, false, false, false, "", false, 1, Case::Mla::kQProj,
             layouts::RecomputeGranularity::kFull},
        Case{"moe_gpt_dp2", 1, 1, 2, 0, false, false, true, true, "", false, 1, Case::Mla::kNone,
             layouts::RecomputeGranularity::kNone, 1},
        Case{"moe_ep2_dist_opt_overlaps", 1, 1, 2, 0, false, true, false, false, "", true, 1,
             Case::Mla::kNone, layouts::RecomputeGranularity::kNone, 2},
        Case{"moe_ep2_pp2_custom", 1, 2, 2, 0, false, false, false, false, "Ett|ttL", false, 1,
             Case::Mla::kNone, layouts::RecomputeGranularity::kNone, 2},
        Case{"moe_ep2_etp1_tp2_sp_dp2", 2, 1, 2, 0, true, false, false, false, "", false, 1, Case::Mla::kNone,
             layouts::RecomputeGranularity::kNone, 2, 1},
        Case{"moe_ep2_etp1_tp2_sp_full_recompute", 2, 1, 1, 0, true, false, false, false, "", false, 1,
             Case::Mla::kNone, layouts::RecomputeGranularity::kFull, 2, 1},
        Case{"moe_allgather_ep2", 1, 1, 2, 0, false, false, false, false, "", false, 1, Case::Mla::kNone,
             layouts::RecomputeGranularity::kNone, 2, 1, true},
        Case{"moe_allgather_ep2_tp2_sp", 2, 1, 2, 0, true, false, false, false, "", false, 1,
             Case::Mla::kNone, layouts::RecomputeGranularity::kNone, 2, 1, true},
        // Multi-token prediction: MLA + MTP under TP/SP, an m stage in a layout string (with the final norm
        // on the last decoder layer's stage and the MTP stage's embedding copy), two MTP layers with a tied
        // head under the distributed optimizer.
        Case{"mtp_mla_tp2_sp", 2, 1, 1, 0, true, false, false, false, "", false, 1, Case::Mla::kQLora,
             layouts::RecomputeGranularity::kNone, 0, 0, false, 1},
        Case{"mtp_mla_pp2_layout", 1, 2, 1, 0, false, false, false, false, "Ettt|tmL", false, 1,
             Case::Mla::kQLora, layouts::RecomputeGranularity::kNone, 0, 0, false, 1},
        Case{"mtp_pp2_tied_m_stage", 1, 2, 1, 0, false, false, false, true, "Etttt|mL", false, 1,
             Case::Mla::kNone, layouts::RecomputeGranularity::kNone, 0, 0, false, 1},
        Case{"mtp2_gpt_tied_dp2_dist_opt", 1, 1, 2, 0, false, true, true, true, "", true, 1, Case::Mla::kNone,
             layouts::RecomputeGranularity::kSelective, 0, 0, false, 2},
        Case{"moe_ep2_etp2_tp2_sp_dp2", 2, 1, 2, 0, true, false, false, false, "", false, 1, Case::Mla::kNone,
             layouts::RecomputeGranularity::kNone, 2, 2},
        Case{"moe_etp2_tp2_sp_dp2_dist_opt_overlaps", 2, 1, 2, 0, true, true, false, false, "", true, 1,
             Case::Mla::kNone, layouts::RecomputeGranularity::kNone, 1, 2},
        Case{"moe_allgather_ep2_etp2_tp2_sp_dp2", 2, 1, 2, 0, true, false, false, false, "", false, 1,
             Case::Mla::kNone, layouts::RecomputeGranularity::kNone, 2, 2, true},
        fsdp_case("fsdp_zero3_dp2", 1, 1, 2, 0, false),
        fsdp_case("fsdp_zero3_tp2_pp2_dp2_overlap", 2, 2, 2, 0, true),
        fsdp_case("fsdp_zero3_moe_ep2_dp4", 1, 1, 4, 2, false),
        with_fsdp(Case{"fsdp_zero3_pp2_dp2_gpt_tied", 1, 2, 2, 0, false, false, true, true},
                  layouts::DataParallelSharding::kOptimGradsParams),
        with_fsdp(Case{"fsdp_zero2_pp2_dp2_gpt_tied", 1, 2, 2, 0, false, false, true, true},
                  layouts::DataParallelSharding::kOptimGrads),
        with_fsdp(fsdp_case("fsdp_zero2_moe_ep2_dp4", 1, 1, 4, 2, false),
                  layouts::DataParallelSharding::kOptimGrads),
        // FSDP with MTP: a chunk holding MTP layers keeps whole gradients, reduced once at its buckets'
        // points, beside a sharded chunk (pp2); with sequence parallelism the norms' TP all-reduce carries
        // only the parts inside the rank's gradient shards.
        with_mtp(with_fsdp(Case{"fsdp_zero2_mtp_gpt_tied_dp2", 1, 1, 2, 0, false, false, true, true},
                           layouts::DataParallelSharding::kOptimGrads),
                 1),
        with_mtp(with_fsdp(Case{"fsdp_zero2_mtp_pp2_dp2_layout", 1, 2, 2, 0, false, false, false, false,
                                "Ettt|tmL"},
                           layouts::DataParallelSharding::kOptimGrads),
                 1),
        with_mtp(with_fsdp(Case{"fsdp_zero3_mtp_pp2_dp2_tied_m_stage", 1, 2, 2, 0, false, false, false, true,
                                "Etttt|mL"},
                           layouts::DataParallelSharding::kOptimGradsParams),
                 1),
        with_fsdp(Case{"fsdp_zero2_tp2_sp_dp2", 2, 1, 2, 0, true},
                  layouts::DataParallelSharding::kOptimGrads),
        with_fsdp(Case{"fsdp_zero3_tp2_sp_dp2_gpt", 2, 1, 2, 0, true, false, true},
                  layouts::DataParallelSharding::kOptimGradsParams),
        // Partial full recomputation: units of two layers (norm recomputes inside a unit; a last unit of
        // one), block's first layers per chunk, MoE layers in a unit, FSDP's gathers for a unit's re-run, an
        // MTP layer kept under block.
        partial_recompute(Case{"uniform2_tp2_sp", 2, 1, 1, 0, true}, layouts::RecomputeMethod::kUniform, 2),
        partial_recompute(Case{"uniform2_pp2_uneven_gpt_tied", 1, 2, 1, 0, false, false, true, true,
                               "Et|tttL"},
                          layouts::RecomputeMethod::kUniform, 2),
        partial_recompute(Case{"block1_pp2", 1, 2}, layouts::RecomputeMethod::kBlock, 1),
        partial_recompute(Case{"block2_dp2_overlap", 1, 1, 2, 0, false, true},
                          layouts::RecomputeMethod::kBlock, 2),
        partial_recompute(Case{"uniform2_moe_ep2_dp2", 1, 1, 2, 0, false, false, false, false, "", false, 1,
                               Case::Mla::kNone, layouts::RecomputeGranularity::kNone, 2},
                          layouts::RecomputeMethod::kUniform, 2),
        partial_recompute(fsdp_case("uniform2_fsdp_zero3_dp2", 1, 1, 2, 0, true),
                          layouts::RecomputeMethod::kUniform, 2),
        partial_recompute(Case{"block2_mtp_mla_tp2_sp", 2, 1, 1, 0, true, false, false, false, "", false, 1,
                               Case::Mla::kQLora, layouts::RecomputeGranularity::kNone, 0, 0, false, 1},
                          layouts::RecomputeMethod::kBlock, 2),
        // --qk-layernorm: the head norms and, under TP with or without SP, their gradients' all-reduce;
        // LayerNorm's biases under full recomputation; selective recomputation over a pipeline; the
        // context-parallel ring on the normalized heads.
        qk_layernorm(Case{"qk_norm_tp2_llama", 2}),
        qk_layernorm(Case{"qk_norm_tp2_cp2_llama", 2, 1, 1, 0, false, false, false, false, "", false, 2}),
        qk_layernorm(Case{"qk_norm_tp2_sp_gpt_full", 2, 1, 1, 0, true, false, true, false, "", false, 1,
                          Case::Mla::kNone, layouts::RecomputeGranularity::kFull}),
        qk_layernorm(Case{"qk_norm_pp2_dp2_selective", 1, 2, 2, 0, false, false, false, false, "", false, 1,
                          Case::Mla::kNone, layouts::RecomputeGranularity::kSelective})),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace megatune::executor
