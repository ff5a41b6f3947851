// The parallel-layout matrix on the CPU backend (ranks as threads): every dense layout the planner can pick
// trains the tiny models from the same seed and reproduces the single-rank loss curve and the single-rank
// weights after training (the single-rank reference of each model is trained once per test binary:
// tests/executor/reference_run_cache.h). Tolerance: fp32 on the CPU, relative 2e-5 on each iteration's loss;
// on each weight relative 1e-4 plus an absolute 2e-5 (AdamW moves a parameter whose gradient is ~0, e.g. a
// bias, by up to lr per step whatever the gradient's rounding, lr 3e-3): TP, PP and DP change the order of
// floating-point sums only. The multi-latent-attention model (tiny-deepseek-v3-mla) runs its own, smaller
// matrix.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>

#include "executor/training/thread_run.h"
#include "layouts/model_spec.h"
#include "layouts/parallel_config.h"
#include "layouts/rank_grid.h"
#include "tests/executor/parallel_test_models.h"
#include "tests/executor/reference_run_cache.h"

namespace megatune::executor {
namespace {

constexpr int kIterations = 20;

using test::deepseek_mla_tiny;
using test::gpt_tiny;
using test::llama_tiny;

TrainOptions options() {
  TrainOptions o;
  o.lr = 3e-3;
  o.min_lr = 3e-4;
  o.lr_decay_style = "cosine";
  o.lr_warmup_iters = 3;
  o.train_iters = kIterations;
  o.mock_data = true;
  o.log_interval = kIterations;
  o.seed = 1234;
  return o;
}

struct Layout {
  std::string name;
  int tp = 1, pp = 1, dp = 1, vpp = 0;
  bool sp = false, dist_opt = false, overlap = false;
  std::string layout_string;
  int cp = 1;
  int ep = 1;
  bool sigmoid_bias = false;  // MoE: sigmoid routing with DeepSeek-V3's expert bias (no aux loss)
  int etp = 1;                // MoE: --expert-tensor-parallel-size
  bool allgather = false;     // MoE: --moe-token-dispatcher-type allgather
  int micro_batch = 2, global_batch = 8;
  bool capacity_pad = false;  // MoE: --moe-expert-capacity-factor 1 --moe-pad-expert-input-to-capacity
  std::optional<layouts::DataParallelSharding> fsdp;  // --use-megatron-fsdp with this strategy
  // --recompute-granularity full with this --recompute-method and --recompute-num-layers (kNone: none).
  layouts::RecomputeMethod recompute_method = layouts::RecomputeMethod::kNone;
  int recompute_num_layers = 0;
};

layouts::ParallelConfig parallel_config(const layouts::ModelSpec& model, const Layout& l) {
  layouts::ParallelConfig c;
  c.tensor_model_parallel_size = l.tp;
  c.pipeline_model_parallel_size = l.pp;
  c.context_parallel_size = l.cp;
  c.expert_model_parallel_size = l.ep;
  c.expert_tensor_parallel_size = l.etp;
  if (l.allgather) c.moe_token_dispatcher_type = layouts::MoeDispatcher::kAllGather;
  c.world_size = l.tp * l.pp * l.dp * l.cp;
  c.sequence_parallel = l.sp;
  c.micro_batch_size = l.micro_batch;
  c.global_batch_size = l.global_batch;
  c.num_virtual_stages_per_pipeline_rank = l.vpp;
  c.pipeline_model_parallel_layout = l.layout_string;
  c.use_distributed_optimizer = l.dist_opt;
  c.overlap_grad_reduce = l.overlap;
  c.overlap_param_gather = l.overlap && l.dist_opt;
  c.overlap_p2p_comm = l.vpp > 0;  // Megatron runs pp 2 with virtual stages only so
  if (l.fsdp) {
    c.use_megatron_fsdp = true;
    c.data_parallel_sharding_strategy = *l.fsdp;
  }
  if (l.recompute_method != layouts::RecomputeMethod::kNone) {
    c.recompute_granularity = layouts::RecomputeGranularity::kFull;
    c.recompute_method = l.recompute_method;
    c.recompute_num_layers = l.recompute_num_layers;
  }
  c.validate(model);
  return c;
}

struct Slice {
  int tp_rank = 0, tp_size = 1;  // a routed expert's: its expert-tensor-parallel rank and size
  ParameterEntry entry;
  std::vector<float> values;
};
struct Trained {
  std::vector<double> losses;
  std::map<std::string, std::vector<Slice>> weights;  // every rank's slice of every parameter
  int moe_row_growths = 0;  // times a step grew some rank's MoE expert rows (moe_row_arena.h)
};

Trained train(const layouts::ModelSpec& model, const Layout& l) {
  const layouts::ParallelConfig config = parallel_config(model, l);
  std::ostringstream log;
  Trained out;
  std::mutex mutex;
  TrainOptions o = options();
  if (model.is_moe()) o.moe_aux_loss_coeff = 1e-2;
  if (l.sigmoid_bias) {
    o.moe_aux_loss_coeff = 0.0;
    o.moe_router_score_function = "sigmoid";
    o.moe_router_enable_expert_bias = true;
    o.moe_router_bias_update_rate = 1e-2;
  }
  if (l.capacity_pad) {
    o.moe_expert_capacity_factor = 1.0;
    o.moe_pad_expert_input_to_capacity = true;
  }
  const std::vector<IterationRecord> records =
      train_on_threads(model, config, o, log, [&](int rank, TrainingRun& run) {
        Trainer& trainer = run.trainer();
        const layouts::RankGrid grid = layouts::RankGrid::from_config(config);
        const int tp_rank = grid.dense_coordinates(rank).tp, etp_rank = grid.expert_coordinates(rank).etp;
        // Under FSDP's sharded parameters the model holds its shard only after the step: the whole ones
        // come from the strategy (a collective: every rank calls it, as a checkpoint save does).
        std::vector<std::vector<float>> chunk_params;
        for (int c = 0; c < trainer.num_chunks(); ++c)
          chunk_params.push_back(l.fsdp ? trainer.data_parallel().main_parameters(c)
                                        : trainer.model(c).main_parameters());
        std::lock_guard<std::mutex> lock(mutex);
        for (int c = 0; c < trainer.num_chunks(); ++c) {
          GPTModel& m = trainer.model(c);
          if (m.moe_layers() != nullptr && m.moe_layers()->layers() > 0)
            out.moe_row_growths += m.moe_layers()->expert_rows().growths();
          const std::vector<float>& params = chunk_params[c];
          for (const ParameterEntry& e : m.layout().entries()) {
            const bool expert = e.expert >= 0;  // split over the expert-tensor-parallel group
            out.weights[e.name].push_back(
                {expert ? etp_rank : tp_rank, expert ? config.etp() : config.tp(), e,
                 std::vector<float>(params.begin() + e.offset, params.begin() + e.offset + e.numel())});
          }
        }
      });
  for (const IterationRecord& r : records) out.losses.push_back(r.step.loss);
  return out;
}

// The single-rank run a layout is held against: from the on-disk cache when this binary made it before.
Trained single_rank_reference(const layouts::ModelSpec& model, const Layout& l, const std::string& key) {
  Trained single;
  if (const std::optional<test::ReferenceRun> cached = test::load_reference_run("layout-matrix-" + key)) {
    single.losses = cached->losses;
    for (const auto& [name, values] : cached->weights) single.weights[name].push_back({0, 1, {}, values});
    return single;
  }
  Layout single_rank{"single"};
  single_rank.sigmoid_bias = l.sigmoid_bias;
  single_rank.capacity_pad = l.capacity_pad;
  single_rank.micro_batch = l.micro_batch;
  single_rank.global_batch = l.global_batch;
  single = train(model, single_rank);
  test::ReferenceRun run{single.losses, {}};
  for (const auto& [name, copies] : single.weights) run.weights[name] = copies.front().values;
  test::store_reference_run("layout-matrix-" + key, run);
  return single;
}

void expect_matches_single_rank(const layouts::ModelSpec& model, const Layout& l) {
  SCOPED_TRACE(l.name);
  static std::map<std::string, Trained> reference_cache;
  const std::string key = model.multi_latent_attention ? "mla-q" + std::to_string(model.q_lora_rank)
                          : model.normalization == layouts::Normalization::kLayerNorm ? "gpt"
                                                                                      : "llama";
  const std::string ref_key =
      key + (model.untie_embeddings_and_output_weights ? "-untied" : "-tied") +
      (model.is_moe() ? "-moe" + std::to_string(model.moe_shared_expert_intermediate_size) : "") +
      (l.sigmoid_bias ? "-sigmoid-bias" : "") + (l.capacity_pad ? "-capacity-pad" : "") +
      (model.mtp_num_layers > 0 ? "-mtp" + std::to_string(model.mtp_num_layers) : "") +
      (model.qk_layernorm ? "-qk-norm" : "") +
      (key == "gpt" && model.position_embedding == layouts::PositionEmbedding::kRope ? "-rope" : "") +
      "-mbs" + std::to_string(l.micro_batch) + "-gbs" + std::to_string(l.global_batch);
  if (!reference_cache.count(ref_key)) reference_cache[ref_key] = single_rank_reference(model, l, ref_key);
  const Trained& single = reference_cache[ref_key];
  const Trained parallel = train(model, l);
  ASSERT_EQ(parallel.losses.size(), single.losses.size());
  for (std::size_t i = 0; i < single.losses.size(); ++i)
    EXPECT_NEAR(parallel.losses[i], single.losses[i], 2e-5 * std::abs(single.losses[i]))
        << "iteration " << i + 1;
  EXPECT_LT(single.losses.back(), single.losses.front() - 0.5);  // the run learns something
  // Weights: each rank's slice of each parameter against the single-rank tensor's slice.
  std::size_t compared = 0;
  for (const auto& [name, copies] : parallel.weights) {
    ASSERT_TRUE(single.weights.count(name)) << name;
    const std::vector<float>& whole = single.weights.at(name).front().values;
    for (const Slice& slice : copies) {
      const std::vector<float> expected =
          tensor_parallel_slice(slice.entry, whole, slice.tp_rank, slice.tp_size);
      ASSERT_EQ(slice.values.size(), expected.size()) << name;
      for (std::size_t j = 0; j < expected.size(); ++j)
        ASSERT_NEAR(slice.values[j], expected[j], 2e-5 + 1e-4 * std::abs(expected[j]))
            << name << "[" << j << "]";
      ++compared;
    }
  }
  EXPECT_EQ(parallel.weights.size(), single.weights.size());  // every parameter lives on some rank
  EXPECT_GT(compared, 0u);
}

const std::vector<Layout>& matrix() {
  static const std::vector<Layout> layouts = {
      {"tp2", 2},
      {"tp2 sp", 2, 1, 1, 0, true},
      {"dp2", 1, 1, 2},
      {"dp2 overlap", 1, 1, 2, 0, false, false, true},
      {"dp2 dist-opt", 1, 1, 2, 0, false, true},
      {"dp2 dist-opt overlaps", 1, 1, 2, 0, false, true, true},
      {"pp2 1f1b", 1, 2},
      {"pp2 vpp2", 1, 2, 1, 2},
      {"pp4 custom uneven with an empty stage", 1, 4, 1, 0, false, false, false, "Et|tt||tL"},
      {"tp2 pp2 dp2", 2, 2, 2},
      {"tp2 sp pp2 dp2 overlap", 2, 2, 2, 0, true, false, true},
      {"tp2 pp2 vpp2 dp2 dist-opt overlaps", 2, 2, 2, 2, false, true, true},
      {"cp2", 1, 1, 1, 0, false, false, false, "", 2},
      {"tp2 sp cp2", 2, 1, 1, 0, true, false, false, "", 2},
      {"cp2 pp2", 1, 2, 1, 0, false, false, false, "", 2},
      {"cp4", 1, 1, 1, 0, false, false, false, "", 4},
  };
  return layouts;
}

// Each layout trains both models, one with tied and one with untied embeddings, alternating from layout to
// layout (GPT tied and Llama untied, then GPT untied and Llama tied): every layout meets both architectures
// (norms, biases, positions, MLP), and both tie modes meet each architecture and the pipelined layouts (where
// the tied embedding's gradient is reduced between the first and the last stage), at half the cases of the
// full product.
bool tied_variant(int index, bool gpt) { return gpt == (index % 2 == 0); }

class LayoutMatrix : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(LayoutMatrix, ReproducesTheSingleRankRun) {
  const auto [index, gpt] = GetParam();
  const bool tied = tied_variant(index, gpt);
  const layouts::ModelSpec model = gpt ? gpt_tiny(tied) : llama_tiny(tied);
  expect_matches_single_rank(model, matrix().at(index));
}

INSTANTIATE_TEST_SUITE_P(Dense, LayoutMatrix,
                         ::testing::Combine(::testing::Range(0, static_cast<int>(matrix().size())),
                                            ::testing::Bool()),
                         [](const ::testing::TestParamInfo<LayoutMatrix::ParamType>& info) {
                           const int index = std::get<0>(info.param);
                           const bool gpt = std::get<1>(info.param);
                           std::string name = matrix().at(index).name;
                           for (char& c : name)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return name + (gpt ? "_gpt" : "_llama") +
                                  (tied_variant(index, gpt) ? "_tied" : "_untied");
                         });

// --qk-layernorm's head norms (weights replicated over TP while each rank normalizes its own heads: their
// gradients are summed over TP, with and without SP) on the Llama model (RMSNorm, RoPE after the norms) and
// the GPT model (LayerNorm with biases) with RoPE: tp2, tp2 sp, pp2 dp2 and cp2. (Without RoPE the k norm's
// bias adds the same q.b to every score of a query, which the softmax ignores: its gradient is rounding
// noise only, which AdamW turns into steps of up to lr that no two layouts share.)
TEST(LayoutMatrixQkLayernorm, ReproducesTheSingleRankRun) {
  layouts::ModelSpec llama = llama_tiny(false), gpt = gpt_tiny(true);
  llama.qk_layernorm = gpt.qk_layernorm = true;
  gpt.position_embedding = layouts::PositionEmbedding::kRope;
  expect_matches_single_rank(llama, {"qk-norm tp2", 2});
  expect_matches_single_rank(gpt, {"qk-norm tp2 sp", 2, 1, 1, 0, true});
  expect_matches_single_rank(llama, {"qk-norm pp2 dp2", 1, 2, 2});
  expect_matches_single_rank(gpt, {"qk-norm cp2", 1, 1, 1, 0, false, false, false, "", 2});
}

// Partial full recomputation under pipelining: pp2 with uniform units of 2 (each rank's two layers one
// unit: only its input saved, both re-run before the backward of the second) reproduces the single-rank run
// without recomputation; and block 1 under pp2 with dp2 and overlapped reduction (each rank's first layer
// recomputed, its second kept).
TEST(LayoutMatrixRecompute, Pp2UniformTwoReproducesTheSingleRankRun) {
  Layout l{"pp2 full uniform 2", 1, 2};
  l.recompute_method = layouts::RecomputeMethod::kUniform;
  l.recompute_num_layers = 2;
  expect_matches_single_rank(llama_tiny(false), l);
}

TEST(LayoutMatrixRecompute, Pp2Dp2BlockOneReproducesTheSingleRankRun) {
  Layout l{"pp2 dp2 overlap full block 1", 1, 2, 2, 0, false, false, true};
  l.recompute_method = layouts::RecomputeMethod::kBlock;
  l.recompute_num_layers = 1;
  expect_matches_single_rank(gpt_tiny(true), l);
}

// The distributed optimizer at data-parallel sizes that do not divide 64 (buckets padded to lcm(dp, 128)):
// dp3 on 2 micro-batches of 2 against the single rank's 3, dp6 with several buckets and overlapped gathers on
// micro-batches of 1.
struct OddDataParallelCase {
  Layout layout;
  bool gpt = false, tied = false;
};

const std::vector<OddDataParallelCase>& odd_dp_matrix() {
  static const std::vector<OddDataParallelCase> cases = {
      {{"dp3 dist-opt", 1, 1, 3, 0, false, true, false, "", 1, 1, false, 1, false, 2, 6}, true, true},
      {{"dp6 dist-opt overlaps", 1, 1, 6, 0, false, true, true, "", 1, 1, false, 1, false, 1, 6},
       false,
       false},
  };
  return cases;
}

class OddDataParallelMatrix : public ::testing::TestWithParam<int> {};

TEST_P(OddDataParallelMatrix, ReproducesTheSingleRankRun) {
  const OddDataParallelCase& c = odd_dp_matrix().at(GetParam());
  expect_matches_single_rank(c.gpt ? gpt_tiny(c.tied) : llama_tiny(c.tied), c.layout);
}

INSTANTIATE_TEST_SUITE_P(DistributedOptimizer, OddDataParallelMatrix,
                         ::testing::Range(0, static_cast<int>(odd_dp_matrix().size())),
                         [](const ::testing::TestParamInfo<int>& info) {
                           std::string name = odd_dp_matrix().at(info.param).layout.name;
                           for (char& ch : name)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return name;
                         });

// A bf16 run of `iterations` without clipping under `l`: its losses, rank 0's fp32 main parameters of chunk 0
// by name, and how many chunks over the ranks kept no bf16 copy (GPTModel::parameters_gathered_at_use).
struct Bf16Run {
  std::vector<double> losses;
  std::vector<double> grad_norms;
  std::map<std::string, std::vector<float>> main;
  int chunks_without_copy = 0;
};
Bf16Run train_bf16(const layouts::ModelSpec& model, const Layout& l, int iterations) {
  TrainOptions o = options();
  o.train_iters = iterations;
  o.bf16 = true;
  o.clip_grad = 0.0;
  std::ostringstream log;
  std::mutex mutex;
  Bf16Run out;
  const auto records =
      train_on_threads(model, parallel_config(model, l), o, log, [&](int rank, TrainingRun& training) {
        Trainer& trainer = training.trainer();
        const std::vector<float> gathered = trainer.data_parallel().main_parameters(0);  // collective
        std::lock_guard<std::mutex> lock(mutex);
        for (int k = 0; k < trainer.num_chunks(); ++k)
          out.chunks_without_copy += trainer.model(k).parameters_gathered_at_use();
        if (rank != 0) return;
        for (const ParameterEntry& e : trainer.model(0).layout().entries())
          out.main[e.name].assign(gathered.begin() + e.offset, gathered.begin() + e.offset + e.numel());
      });
  for (const IterationRecord& r : records) {
    out.losses.push_back(r.step.loss);
    out.grad_norms.push_back(r.step.grad_norm);
  }
  return out;
}

// A bf16 model at dp3 (the CPU backend rounding to bf16): the distributed optimizer keeps the fp32 main
// parameters in its shards only and gathers bf16 parameters, DDP keeps them whole; without clipping (the
// grad norm's summation order is the one difference) both runs are bit-identical, losses and fp32 main
// parameters alike.
TEST(DistributedOptimizerBf16, Dp3MatchesDdpBitForBit) {
  const layouts::ModelSpec model = llama_tiny(false);
  auto layout = [](bool dist_opt) {
    return Layout{"dp3", 1, 1, 3, 0, false, dist_opt, true, "", 1, 1, false, 1, false, 2, 6};
  };
  const Bf16Run ddp = train_bf16(model, layout(false), 6), dist = train_bf16(model, layout(true), 6);
  ASSERT_EQ(ddp.losses.size(), 6u);
  EXPECT_EQ(dist.losses, ddp.losses);
  EXPECT_LT(ddp.losses.back(), ddp.losses.front());
  EXPECT_FALSE(ddp.main.empty());
  EXPECT_TRUE(dist.main == ddp.main);
}

// Multi-latent attention: its TP plan (replicated down-projections, latents gathered / reduced over TP),
// with and without query compression, and pipelining.
struct MlaCase {
  Layout layout;
  bool q_lora = true;
};

const std::vector<MlaCase>& mla_matrix() {
  static const std::vector<MlaCase> cases = {
      {{"tp2", 2}, false},
      {{"tp2", 2}, true},
      {{"tp2 sp", 2, 1, 1, 0, true}, false},
      {{"tp2 sp", 2, 1, 1, 0, true}, true},
      {{"pp2 1f1b", 1, 2}, true},
      {{"tp2 sp pp2 dp2 overlap", 2, 2, 2, 0, true, false, true}, true},
  };
  return cases;
}

class MlaLayoutMatrix : public ::testing::TestWithParam<int> {};

TEST_P(MlaLayoutMatrix, ReproducesTheSingleRankRun) {
  const MlaCase& c = mla_matrix().at(GetParam());
  expect_matches_single_rank(deepseek_mla_tiny(c.q_lora), c.layout);
}

INSTANTIATE_TEST_SUITE_P(MultiLatentAttention, MlaLayoutMatrix,
                         ::testing::Range(0, static_cast<int>(mla_matrix().size())),
                         [](const ::testing::TestParamInfo<int>& info) {
                           const MlaCase& c = mla_matrix().at(info.param);
                           std::string name = c.layout.name;
                           for (char& ch : name)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return name + (c.q_lora ? "_q_lora" : "_q_proj");
                         });

// Multi-token prediction on the MLA model (one MTP layer): eh_proj's TP plan under SP, an m stage in a
// layout string (the final norm with the last decoder layer, the MTP stage's embedding copy reduced with the
// first stage's), and data parallelism.
class MtpLayoutMatrix : public ::testing::TestWithParam<int> {};

const std::vector<Layout>& mtp_matrix() {
  static const std::vector<Layout> cases = {
      {"tp2 sp", 2, 1, 1, 0, true},
      {"pp2 Ettt|tmL", 1, 2, 1, 0, false, false, false, "Ettt|tmL"},
      {"dp2", 1, 1, 2},
  };
  return cases;
}

TEST_P(MtpLayoutMatrix, ReproducesTheSingleRankRun) {
  layouts::ModelSpec model = deepseek_mla_tiny(true);
  model.mtp_num_layers = 1;
  expect_matches_single_rank(model, mtp_matrix().at(GetParam()));
}

INSTANTIATE_TEST_SUITE_P(MultiTokenPrediction, MtpLayoutMatrix,
                         ::testing::Range(0, static_cast<int>(mtp_matrix().size())),
                         [](const ::testing::TestParamInfo<int>& info) {
                           std::string name = mtp_matrix().at(info.param).name;
                           for (char& ch : name)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return name;
                         });

// MoE (4 experts, top-2, softmax, aux loss): expert parallelism (all-to-all dispatch, expert gradients
// over expert-dp) alone and with dp (the distributed optimizer over both gradient buffers) and pp, and with
// sigmoid routing + expert bias + a shared expert, and with a capacity factor and padding, reproduces the
// single rank's curve.
const std::vector<Layout>& moe_matrix() {
  static const std::vector<Layout> layouts = {
      {"ep2", 1, 1, 2, 0, false, false, false, "", 1, 2},
      {"ep2 dp4 dist-opt overlaps", 1, 1, 4, 0, false, true, true, "", 1, 2},
      {"ep2 pp2 custom", 1, 2, 2, 0, false, false, false, "Ett|ttL", 1, 2},
      {"ep2 sigmoid expert-bias shared expert", 1, 1, 2, 0, false, false, false, "", 1, 2, true},
      // tp2 x dp2 on 4 ranks; the expert grid etp1 x ep2 x edp2: the EP groups are the TP groups.
      {"ep2 etp1 tp2 sp dp2", 2, 1, 2, 0, true, false, false, "", 1, 2},
      {"ep2 etp1 tp2 sp sigmoid expert-bias shared expert", 2, 1, 1, 0, true, false, false, "", 1, 2, true},
      {"allgather ep2", 1, 1, 2, 0, false, false, false, "", 1, 2, false, 1, true},
      // tp2 x ep2 on 4 ranks: the tp-ep group (etp1 x ep2) gathers over pairs of TP ranks' shards.
      {"allgather ep2 tp2 sp", 2, 1, 2, 0, true, false, false, "", 1, 2, false, 1, true},
      // tp2 x dp2 on 4 ranks; the expert grid etp2 x ep2 x edp1: each expert split over the TP pair, the
      // all-to-all between the pairs, the received rows gathered over ETP.
      {"ep2 etp2 tp2 sp dp2", 2, 1, 2, 0, true, false, false, "", 1, 2, false, 2},
      // etp2 x ep1 x edp2: expert grads reduced (and the distributed optimizer's state sharded) over edp.
      {"etp2 tp2 sp dp2 dist-opt", 2, 1, 2, 0, true, true, false, "", 1, 1, false, 2},
      // etp2 without TP: the ETP group spans the data-parallel ranks (full sequences on each).
      {"etp2 dp2 allgather", 1, 1, 2, 0, false, false, false, "", 1, 1, false, 2, true},
      // Megatron's capacity factor 1 with padding: each rank drops over its own tokens' capacity, every
      // expert gets exactly its capacity from each rank, the padding weighs nothing.
      {"ep2 pp2 capacity padded", 1, 2, 2, 0, false, false, false, "", 1, 2, false, 1, false, 2, 8, true},
  };
  return layouts;
}

class MoeLayoutMatrix : public ::testing::TestWithParam<int> {};

TEST_P(MoeLayoutMatrix, ReproducesTheSingleRankRun) {
  layouts::ModelSpec model = llama_tiny(false);
  model.num_experts = 4;
  model.moe_router_topk = 2;
  model.moe_ffn_hidden_size = 64;
  const Layout& layout = moe_matrix().at(GetParam());
  if (layout.sigmoid_bias) model.moe_shared_expert_intermediate_size = 64;
  expect_matches_single_rank(model, layout);
  // Pipelined and dropless, the routing's imbalance grows the expert rows while other micro-batches' saved
  // rows are in flight: the curve above held through it.
  if (layout.name == "ep2 pp2 custom") EXPECT_GT(train(model, layout).moe_row_growths, 0);
}

INSTANTIATE_TEST_SUITE_P(Moe, MoeLayoutMatrix, ::testing::Range(0, static_cast<int>(moe_matrix().size())),
                         [](const ::testing::TestParamInfo<int>& info) {
                           std::string name = moe_matrix().at(info.param).name;
                           for (char& c : name)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return name;
                         });

// Megatron FSDP: each sharding strategy on dp2, and optim_grads_params (each parameter entry's bucket
// gathered before its forward segment and again before its backward, nothing gathered after the step, the
// gradients reduce-scattered per entry) under overlap, tp2 x dp2, pp2 x dp2 (the tied embedding's buckets),
// virtual stages, and on the MoE model with the experts sharded over expert-dp (ep2 x edp2).
struct FsdpCase {
  Layout layout;
  bool gpt = false, tied = false, moe = false;
};

Layout fsdp_layout(std::string name, int tp, int pp, int dp, layouts::DataParallelSharding sharding) {
  Layout l{std::move(name), tp, pp, dp};
  l.fsdp = sharding;
  return l;
}

const std::vector<FsdpCase>& fsdp_matrix() {
  using S = layouts::DataParallelSharding;
  static const std::vector<FsdpCase> cases = [] {
    std::vector<FsdpCase> c = {
        {fsdp_layout("dp2 optim", 1, 1, 2, S::kOptim)},
        {fsdp_layout("dp2 optim_grads", 1, 1, 2, S::kOptimGrads), true, true},
        {fsdp_layout("dp2 optim_grads_params", 1, 1, 2, S::kOptimGradsParams)},
        {fsdp_layout("dp2 optim_grads_params overlap", 1, 1, 2, S::kOptimGradsParams), true, true},
        {fsdp_layout("tp2 sp dp2 optim_grads_params", 2, 1, 2, S::kOptimGradsParams)},
        {fsdp_layout("pp2 dp2 optim_grads_params", 1, 2, 2, S::kOptimGradsParams), true, true},
        {fsdp_layout("pp2 vpp2 dp2 optim_grads_params", 1, 2, 2, S::kOptimGradsParams)},
        {fsdp_layout("ep2 dp4 optim_grads_params", 1, 1, 4, S::kOptimGradsParams), false, false, true},
    };
    c[3].layout.overlap = true;
    c[4].layout.sp = true;
    c[6].layout.vpp = 2;
    c[7].layout.ep = 2;
    return c;
  }();
  return cases;
}

class FsdpLayoutMatrix : public ::testing::TestWithParam<int> {};

TEST_P(FsdpLayoutMatrix, ReproducesTheSingleRankRun) {
  const FsdpCase& c = fsdp_matrix().at(GetParam());
  layouts::ModelSpec model = c.gpt ? gpt_tiny(c.tied) : llama_tiny(c.tied);
  if (c.moe) {
    model.num_experts = 4;
    model.moe_router_topk = 2;
    model.moe_ffn_hidden_size = 64;
  }
  expect_matches_single_rank(model, c.layout);
}

INSTANTIATE_TEST_SUITE_P(MegatronFsdp, FsdpLayoutMatrix,
                         ::testing::Range(0, static_cast<int>(fsdp_matrix().size())),
                         [](const ::testing::TestParamInfo<int>& info) {
                           std::string name = fsdp_matrix().at(info.param).layout.name;
                           for (char& c : name)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return name;
                         });

// How two runs' fp32 main parameters (the same names and sizes) differ: the largest difference, and the
// fraction of the elements differing by more than `close`.
struct MainDifference {
  float largest = 0.0f;
  double fraction_apart = 0.0;
};
MainDifference main_difference(const Bf16Run& a, const Bf16Run& b, float close) {
  MainDifference d;
  std::size_t apart = 0, count = 0;
  for (const auto& [name, values] : a.main) {
    const std::vector<float>& other = b.main.at(name);
    for (std::size_t i = 0; i < values.size(); ++i) {
      const float diff = std::abs(values[i] - other.at(i));
      d.largest = std::max(d.largest, diff);
      apart += diff > close ? 1 : 0;
      ++count;
    }
  }
  d.fraction_apart = count > 0 ? static_cast<double>(apart) / static_cast<double>(count) : 0.0;
  return d;
}

// A bf16 model under FSDP optim_grads and optim_grads_params (the CPU backend rounding to bf16): the chunks
// keep only their fp32 shard of each bucket's gradients (each micro-batch's bucket reduce-scattered from a
// slot right after its backward and added into the shard) and, under optim_grads_params, only their shard of
// the bf16 parameters (each entry read from a gathered-entry slot while it is placed). Against the
// distributed optimizer, which keeps every gradient and reduces the micro-batches' sum once (without
// clipping: the grad norm's summation order is another difference):
// - with one micro-batch per step the reduction is the same sum in the same order: losses and fp32 main
//   parameters bit for bit;
// - with two micro-batches the gradients are the same sums in another order (the sum over ranks of each
//   micro-batch, then over micro-batches, against the reverse), an fp32 rounding apart: the first step's
//   gradient norm agrees within 1e-6 relative and the losses within 1e-4 relative (the MoE case's routing
//   is the most sensitive: 2e-5 measured). AdamW turns a gradient that is only rounding noise (a sum that
//   cancels: GPT's LayerNorm-fed directions, the tied embedding's rows of absent tokens) into an update of
//   up to +-lr either way, so a few elements of the fp32 main parameters differ by up to 2 lr per step
//   (3.7e-3 measured over 4 steps at lr <= 3e-3, in 7.5% of the elements at most, tied GPT); the untied Llama
//   runs agree within 2.5e-7.
// Untied and tied heads (the embedding's gradient slot kept from the head's forward to the embedding's
// backward), pp2 with the last stage's copy of the tied embedding (its gathered bucket summed over the
// embedding group), tp2 x sp (the norms' shard pieces summed over TP), the experts over expert-dp, and
// recompute units of 2 layers, pp2 with the MTP layers' stage (whose chunk keeps whole gradients and
// parameters: layouts::chunk_shards_gradients) beside a sharded one; one micro-batch on the tied and MoE
// cases, optim_grads on them and the MTP case with two.
TEST(FsdpBf16, ShardedStateTrainsAsTheDistributedOptimizer) {
  struct Case {
    Layout layout;
    bool gpt = false, tied = false, moe = false;
    int mtp = 0;  // --mtp-num-layers
  };
  std::vector<Case> cases = {
      {{"dp2", 1, 1, 2}},
      {{"dp2 tied", 1, 1, 2}, true, true},
      {{"pp2 dp2 tied", 1, 2, 2}, true, true},
      {{"tp2 sp dp2", 2, 1, 2, 0, true}},
      {{"ep2 dp4", 1, 1, 4}, false, false, true},
      {{"dp2 recompute uniform 2", 1, 1, 2}},
      {{"pp2 dp2 mtp", 1, 2, 2, 0, false, false, false, "Ettt|tmL"}, false, false, false, 1},
  };
  cases[4].layout.ep = 2;
  cases[5].layout.recompute_method = layouts::RecomputeMethod::kUniform;
  cases[5].layout.recompute_num_layers = 2;
  using S = layouts::DataParallelSharding;
  for (const Case& c : cases)
    for (const int microbatches : {1, 2}) {
      if (microbatches == 1 && !c.tied && !c.moe) continue;  // bit for bit: the tied and MoE cases
      layouts::ModelSpec model = c.gpt ? gpt_tiny(c.tied) : llama_tiny(c.tied);
      model.mtp_num_layers = c.mtp;
      if (c.moe) {
        model.num_experts = 4;
        model.moe_router_topk = 2;
        model.moe_ffn_hidden_size = 64;
      }
      Layout l = c.layout;
      l.global_batch = l.micro_batch * l.dp * microbatches;
      l.dist_opt = true;
      const Bf16Run dist = train_bf16(model, l, 4);
      ASSERT_EQ(dist.losses.size(), 4u);
      EXPECT_LT(dist.losses.back(), dist.losses.front());
      EXPECT_FALSE(dist.main.empty());
      EXPECT_EQ(dist.chunks_without_copy, 0);
      l.dist_opt = false;
      // optim_grads on every other case (the sharded gradients without the sharded parameters).
      const bool both = c.tied || c.moe || c.mtp > 0;
      for (const S sharding : {S::kOptimGradsParams, S::kOptimGrads}) {
        if (sharding == S::kOptimGrads && (!both || microbatches == 1)) continue;
        SCOPED_TRACE(c.layout.name + ", " + std::to_string(microbatches) + " micro-batches, " +
                     std::string(layouts::to_string(sharding)));
        l.fsdp = sharding;
        const Bf16Run fsdp = train_bf16(model, l, 4);
        ASSERT_EQ(fsdp.losses.size(), dist.losses.size());
        if (microbatches == 1) {
          EXPECT_EQ(fsdp.losses, dist.losses);
          EXPECT_TRUE(fsdp.main == dist.main);
        } else {
          // The first step's gradients (the same parameters in both runs): their norm a rounding apart.
          EXPECT_NEAR(fsdp.grad_norms[0], dist.grad_norms[0], 1e-6 * dist.grad_norms[0]);
          for (std::size_t i = 0; i < dist.losses.size(); ++i)
            EXPECT_NEAR(fsdp.losses[i], dist.losses[i], 1e-4 * dist.losses[i]) << "iteration " << i;
          const MainDifference d = main_difference(fsdp, dist, 1e-5f);
          EXPECT_LT(d.largest, 2.0f * 4 * 3e-3f);  // AdamW's +-lr per step, 4 steps at lr <= 3e-3
          EXPECT_LT(d.fraction_apart, 0.1);
        }
        // optim_grads_params: every rank's every chunk released its copy, but the MTP stage's.
        const int chunks = c.layout.tp * c.layout.dp * (c.mtp > 0 ? c.layout.pp - 1 : c.layout.pp);
        EXPECT_EQ(fsdp.chunks_without_copy, sharding == S::kOptimGradsParams ? chunks : 0);
      }
    }
}

}  // namespace
}  // namespace megatune::executor
