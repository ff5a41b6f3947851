// Checkpoints of parallel layouts on the CPU backend (ranks as threads): every rank writes its shard of the
// iteration; resuming under the same layout continues bit-exactly (the distributed optimizer's bf16 run at
// dp3 included, its fp32 shards gathered to be saved); resuming under another layout reshards
// (parameters and optimizer moments assembled from the TP slices) and continues the same run within fp32
// rounding (the tolerance of the layout matrix). Every load checks each shard it reads: a shard of another
// iteration, rank directories swapped, a missing or damaged rank_00000 are refused naming that shard.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <utility>

#include "executor/training/thread_run.h"
#include "layouts/model_spec.h"
#include "tests/executor/parallel_test_models.h"

namespace megatune::executor {
namespace {

namespace fs = std::filesystem;

layouts::ModelSpec gpt_tiny() { return test::gpt_tiny(/*tied=*/true); }

layouts::ParallelConfig layout(const layouts::ModelSpec& m, int tp, int pp, int dp, bool sp = false,
                               bool dist_opt = false, int cp = 1, int ep = 1, int etp = 0, int gbs = 8) {
  layouts::ParallelConfig c;
  c.tensor_model_parallel_size = tp;
  c.expert_model_parallel_size = ep;
  c.expert_tensor_parallel_size = etp;
  c.pipeline_model_parallel_size = pp;
  c.context_parallel_size = cp;
  c.world_size = tp * pp * dp * cp;
  c.sequence_parallel = sp;
  c.use_distributed_optimizer = dist_opt;
  c.micro_batch_size = 2;
  c.global_batch_size = gbs;
  c.validate(m);
  return c;
}

TrainOptions options(std::int64_t iters) {
  TrainOptions o;
  o.lr = 3e-3;
  o.lr_decay_style = "cosine";
  o.lr_decay_iters = 6;
  o.train_iters = iters;
  o.mock_data = true;
  o.log_interval = 1;
  return o;
}

struct RunResult {
  std::vector<double> losses;
  std::string log;
};

RunResult train(const layouts::ParallelConfig& c, TrainOptions o, const layouts::ModelSpec& m = gpt_tiny()) {
  std::ostringstream log;
  RunResult r;
  for (const IterationRecord& rec : train_on_threads(m, c, o, log)) r.losses.push_back(rec.step.loss);
  r.log = log.str();
  return r;
}

class ParallelCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("megatune_parallel_ckpt_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
            "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  // Trains 6 iterations whole, and 3 saved into dir_ then 3 more resumed from it, under `c`: the resumed
  // losses equal the whole run's. Returns the whole run; `second` becomes the resuming run's options.
  RunResult expect_bit_exact_resume(const layouts::ParallelConfig& c, TrainOptions& second) {
    const RunResult whole = train(c, options(6));
    TrainOptions first = options(3);
    first.save = dir_.string();
    train(c, first);
    second = options(6);
    second.load = dir_.string();
    const RunResult resumed = train(c, second);
    EXPECT_EQ(resumed.losses.size(), 3u);
    for (std::size_t i = 0; i < 3 && i < resumed.losses.size(); ++i)
      EXPECT_EQ(resumed.losses[i], whole.losses[3 + i]) << "iteration " << 4 + i;
    return whole;
  }
  // Trains 4 iterations whole and 2 saved under `saved`; 2 more resumed from that one checkpoint under each
  // of `targets` (default: one rank) continue the curve.
  void expect_reshards(const layouts::ModelSpec& m, const layouts::ParallelConfig& saved,
                       std::vector<layouts::ParallelConfig> targets = {}) {
    if (targets.empty()) targets.push_back(layout(m, 1, 1, 1));
    const RunResult whole = train(saved, options(4), m);
    TrainOptions first = options(2);
    first.save = dir_.string();
    train(saved, first, m);
    for (const layouts::ParallelConfig& target : targets) {
      SCOPED_TRACE("tp" + std::to_string(target.tp()) + " dp" + std::to_string(target.dp()) + " etp" +
                   std::to_string(target.etp()));
      TrainOptions second = options(4);
      second.load = dir_.string();
      const RunResult resumed = train(target, second, m);
      EXPECT_NE(resumed.log.find("resharded the checkpoint"), std::string::npos);
      ASSERT_EQ(resumed.losses.size(), 2u);
      for (int i = 0; i < 2; ++i)
        EXPECT_NEAR(resumed.losses[i], whole.losses[2 + i], 2e-5 * whole.losses[2 + i])
            << "iteration " << 3 + i;
    }
  }
  // A bf16 run of 4 iterations under `c`: saving every 2 changes none of its losses, and 2 iterations saved
  // then 2 resumed equal its last 2.
  void expect_bf16_save_and_resume(const layouts::ParallelConfig& c) {
    auto bf16 = [](std::int64_t iters) {
      TrainOptions o = options(iters);
      o.bf16 = true;
      return o;
    };
    const RunResult plain = train(c, bf16(4));
    TrainOptions saving = bf16(4);
    saving.save = (dir_ / "mid_run").string();
    saving.save_interval = 2;
    EXPECT_EQ(train(c, saving).losses, plain.losses);
    TrainOptions first = bf16(2);
    first.save = dir_.string();
    train(c, first);
    TrainOptions second = bf16(4);
    second.load = dir_.string();
    const RunResult resumed = train(c, second);
    ASSERT_EQ(resumed.losses.size(), 2u);
    for (int i = 0; i < 2; ++i) EXPECT_EQ(resumed.losses[i], plain.losses[2 + i]) << "iteration " << 3 + i;
  }
  fs::path dir_;
};

TEST_F(ParallelCheckpoint, ResumesBitExactlyUnderTheSameLayout) {
  const layouts::ParallelConfig c = layout(gpt_tiny(), 2, 2, 2, /*sp=*/true);
  const RunResult whole = train(c, options(6));
  TrainOptions first = options(3);
  first.save = dir_.string();
  train(c, first);
  // One iteration directory, one shard per rank, the tracker written after all of them.
  for (int r = 0; r < 8; ++r)
    EXPECT_TRUE(fs::exists(dir_ / "iter_0000003" / ("rank_0000" + std::to_string(r))));
  TrainOptions second = options(6);
  second.load = dir_.string();
  const RunResult resumed = train(c, second);
  ASSERT_EQ(resumed.losses.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(resumed.losses[i], whole.losses[3 + i]) << "iteration " << 4 + i;
  EXPECT_NE(resumed.log.find("loaded checkpoint"), std::string::npos);
}

TEST_F(ParallelCheckpoint, DistributedOptimizerShardsResumeBitExactlyAndRefuseAnotherLayout) {
  const layouts::ModelSpec m = gpt_tiny();
  const layouts::ParallelConfig c = layout(m, 1, 2, 2, false, /*dist_opt=*/true);
  TrainOptions second;
  expect_bit_exact_resume(c, second);
  try {
    train(layout(m, 1, 1, 1), second);
    FAIL() << "a distributed-optimizer checkpoint loaded under another layout";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("resume under that layout only"), std::string::npos) << e.what();
  }
}

// A bf16 model at dp3 under the distributed optimizer (fp32 main parameters in the shards only, gathered
// through the gradient buffer to be saved): saving mid-run changes nothing, and the run resumes bit-exactly.
TEST_F(ParallelCheckpoint, Bf16DistributedOptimizerShardsAtDp3SaveWithoutDisturbingTheRunAndResume) {
  expect_bf16_save_and_resume(layout(gpt_tiny(), 1, 1, 3, false, /*dist_opt=*/true, 1, 1, 0, /*gbs=*/6));
}

// Megatron FSDP optim_grads_params with a bf16 model, which then keeps only its shard of the bf16
// parameters (and the gathered entries in use) and of the fp32 gradients (and their bucket slots, through
// which the main parameters are gathered for the save): the same, at dp2 (the tied head keeping the
// embedding gathered) and pp2 x dp2 (the last stage's copy of the tied embedding); and optim_grads (the
// gradients alone sharded) at dp2.
TEST_F(ParallelCheckpoint, Bf16FsdpShardedParametersSaveWithoutDisturbingTheRunAndResume) {
  using S = layouts::DataParallelSharding;
  for (const auto& [pp, sharding] : {std::pair{1, S::kOptimGradsParams}, std::pair{2, S::kOptimGradsParams},
                                     std::pair{1, S::kOptimGrads}}) {
    SCOPED_TRACE("pp" + std::to_string(pp) + " " + std::string(layouts::to_string(sharding)));
    layouts::ParallelConfig c = layout(gpt_tiny(), 1, pp, 2);
    c.use_megatron_fsdp = true;
    c.data_parallel_sharding_strategy = sharding;
    c.validate(gpt_tiny());
    expect_bf16_save_and_resume(c);
    fs::remove_all(dir_);
  }
}

TEST_F(ParallelCheckpoint, ReshardsIntoOtherLayouts) {
  const layouts::ModelSpec m = gpt_tiny();
  const layouts::ParallelConfig saved = layout(m, 2, 2, 2);
  const RunResult whole = train(saved, options(6));
  TrainOptions first = options(3);
  first.save = dir_.string();
  train(saved, first);
  for (const layouts::ParallelConfig& target :
       {layout(m, 1, 1, 1), layout(m, 1, 4, 2), layout(m, 2, 1, 1, true)}) {
    SCOPED_TRACE("tp" + std::to_string(target.tp()) + " pp" + std::to_string(target.pp()));
    TrainOptions second = options(6);
    second.load = dir_.string();
    const RunResult resumed = train(target, second);
    EXPECT_NE(resumed.log.find("resharded the checkpoint"), std::string::npos);
    ASSERT_EQ(resumed.losses.size(), 3u);
    for (int i = 0; i < 3; ++i)
      EXPECT_NEAR(resumed.losses[i], whole.losses[3 + i], 2e-5 * whole.losses[3 + i])
          << "iteration " << 4 + i;
  }
}

// Multi-latent attention's parameters (replicated down-projections, column-parallel up-projections with two
// parts each) reshard like the rest.
TEST_F(ParallelCheckpoint, MultiLatentAttentionReshardsFromTp2IntoOneRank) {
  const layouts::ModelSpec m = test::deepseek_mla_tiny(/*q_lora=*/true);
  expect_reshards(m, layout(m, 2, 1, 1, /*sp=*/true));
}

// Context-parallel ranks hold replicated weights: a cp2 run resumes bit-exactly under its own layout and
// reshards into one without CP (and back).
TEST_F(ParallelCheckpoint, ContextParallelRunsSaveAndReshardLikeAnyOther) {
  const layouts::ModelSpec m = gpt_tiny();
  TrainOptions second;
  const RunResult whole = expect_bit_exact_resume(layout(m, 1, 1, 1, false, false, /*cp=*/2), second);
  for (const layouts::ParallelConfig& target : {layout(m, 1, 1, 1), layout(m, 2, 1, 1, true, false, 2)}) {
    SCOPED_TRACE("tp" + std::to_string(target.tp()) + " cp" + std::to_string(target.cp()));
    const RunResult moved = train(target, second);
    ASSERT_EQ(moved.losses.size(), 3u);
    for (int i = 0; i < 3; ++i)
      EXPECT_NEAR(moved.losses[i], whole.losses[3 + i], 2e-5 * whole.losses[3 + i]) << "iteration " << 4 + i;
  }
}

// MoE under TP x EP (the experts whole on their EP rank, the shared expert split over TP, the router
// replicated) reshards into one rank.
TEST_F(ParallelCheckpoint, MoeWithTensorAndExpertParallelismReshardsIntoOneRank) {
  layouts::ModelSpec m = test::llama_tiny(/*tied=*/false);
  m.num_experts = 4;
  m.moe_router_topk = 2;
  m.moe_ffn_hidden_size = 32;
  m.moe_shared_expert_intermediate_size = 32;
  expect_reshards(m, layout(m, 2, 1, 1, /*sp=*/true, false, 1, /*ep=*/2, /*etp=*/1));
}

// Expert tensor parallelism: each expert's fc1 rows and fc2 columns split over the ETP pair (tp2 x dp2 on 4
// ranks, the expert grid etp2 x ep2); the reshard assembles them from the shards' etp_rank / etp_size, into
// one rank, into etp1 x ep2 under tp2, and into etp1 x ep2 x edp2 on the same tp2 x dp2.
TEST_F(ParallelCheckpoint, MoeWithExpertTensorParallelismReshards) {
  layouts::ModelSpec m = test::llama_tiny(/*tied=*/false);
  m.num_experts = 4;
  m.moe_router_topk = 2;
  m.moe_ffn_hidden_size = 32;
  const layouts::ParallelConfig saved = layout(m, 2, 1, 2, /*sp=*/true, false, 1, /*ep=*/2, /*etp=*/2);
  // Into one rank, into etp1 x ep2 under tp2, and into the same tp x dp with the experts whole (etp1):
  // another layout of the expert weights, resharded.
  expect_reshards(m, saved,
                  {layout(m, 1, 1, 1), layout(m, 2, 1, 1, /*sp=*/true, false, 1, /*ep=*/2, /*etp=*/1),
                   layout(m, 2, 1, 2, /*sp=*/true, false, 1, /*ep=*/2, /*etp=*/1)});
}

// Trains `iterations` of the tiny model under tp2 into dir_, saving after each; the resuming run's options.
TrainOptions save_tp2(const fs::path& dir, int iterations) {
  TrainOptions first = options(iterations);
  first.save = dir.string();
  first.save_interval = 1;
  train(layout(gpt_tiny(), 2, 1, 1), first);
  TrainOptions second = options(iterations + 1);
  second.load = dir.string();
  return second;
}

std::string load_error(const layouts::ParallelConfig& c, const TrainOptions& o) {
  try {
    train(c, o);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST_F(ParallelCheckpoint, AShardOfAnotherIterationIsRefusedWhenResharding) {
  const TrainOptions second = save_tp2(dir_, 2);
  const fs::path stale = dir_ / "iter_0000002" / "rank_00001";
  fs::remove_all(stale);
  fs::copy(dir_ / "iter_0000001" / "rank_00001", stale, fs::copy_options::recursive);
  const std::string message = load_error(layout(gpt_tiny(), 1, 1, 1), second);
  EXPECT_NE(message.find(stale.string() + " records iteration 1"), std::string::npos) << message;
}

TEST_F(ParallelCheckpoint, SwappedRankDirectoriesAreRefusedUnderTheSameLayout) {
  const TrainOptions second = save_tp2(dir_, 1);
  const fs::path iteration = dir_ / "iter_0000001";
  fs::rename(iteration / "rank_00000", iteration / "aside");
  fs::rename(iteration / "rank_00001", iteration / "rank_00000");
  fs::rename(iteration / "aside", iteration / "rank_00001");
  const std::string indexed = load_error(layout(gpt_tiny(), 2, 1, 1), second);
  EXPECT_NE(indexed.find("holds the shard this save wrote as rank_00001"), std::string::npos) << indexed;
  // A save from before shards.txt: the world rank its manifest records names the swap.
  fs::remove(iteration / "shards.txt");
  const std::string legacy = load_error(layout(gpt_tiny(), 2, 1, 1), second);
  EXPECT_NE(legacy.find("was written by world rank 1, not rank 0"), std::string::npos) << legacy;
}

TEST_F(ParallelCheckpoint, AMissingOrDamagedRankZeroIsNamedWithItsCause) {
  const TrainOptions second = save_tp2(dir_, 1);
  const fs::path manifest = dir_ / "iter_0000001" / "rank_00000" / "manifest.txt";
  std::ofstream(manifest, std::ios::app) << "x\n";
  const std::string damaged = load_error(layout(gpt_tiny(), 1, 1, 1), second);
  EXPECT_NE(damaged.find(manifest.string() + " is truncated"), std::string::npos) << damaged;
  EXPECT_EQ(damaged.find("mp_rank_00"), std::string::npos) << damaged;
  fs::remove_all(dir_ / "iter_0000001" / "rank_00000");
  const std::string missing = load_error(layout(gpt_tiny(), 1, 1, 1), second);
  EXPECT_NE(missing.find("rank_00000 is missing"), std::string::npos) << missing;
  EXPECT_EQ(missing.find("mp_rank_00"), std::string::npos) << missing;
}

TEST_F(ParallelCheckpoint, ASaveFromBeforeTheShardIndexStillLoads) {
  const TrainOptions second = save_tp2(dir_, 1);
  fs::remove(dir_ / "iter_0000001" / "shards.txt");
  EXPECT_NE(train(layout(gpt_tiny(), 2, 1, 1), second).log.find("loaded checkpoint"), std::string::npos);
  EXPECT_NE(train(layout(gpt_tiny(), 1, 1, 1), second).log.find("resharded the checkpoint"),
            std::string::npos);
}

}  // namespace
}  // namespace megatune::executor
