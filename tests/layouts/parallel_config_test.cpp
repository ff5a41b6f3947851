// ParallelConfig: derived sizes, the resolved layout for every way of giving it, and one error per rule.
#include "layouts/parallel_config.h"

#include <gtest/gtest.h>

#include "base/user_error.h"

namespace megatune::layouts {
namespace {

std::string error_of(const ParallelConfig& config, const ModelSpec& model) {
  try {
    config.validate(model);
  } catch (const UserError& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    return message;
  }
  return "";
}

ParallelConfig config(int world, int tp, int pp) {
  ParallelConfig c;
  c.world_size = world;
  c.tensor_model_parallel_size = tp;
  c.pipeline_model_parallel_size = pp;
  return c;
}

TEST(ParallelConfig, DerivedSizes) {
  ParallelConfig c = config(64, 4, 2);
  c.context_parallel_size = 2;
  c.micro_batch_size = 2;
  c.global_batch_size = 128;
  const ModelSpec llama = model_preset("llama3-8b");
  EXPECT_EQ(error_of(c, llama), "");
  EXPECT_EQ(c.dp(), 4);
  EXPECT_EQ(c.num_microbatches(), 16);
  EXPECT_EQ(c.etp(), 4);
  c.global_batch_size = 0;  // Megatron's default: mbs * dp
  EXPECT_EQ(c.resolved_global_batch_size(), 8);
  EXPECT_EQ(c.num_microbatches(), 1);
  c.sequence_parallel = true;
  EXPECT_TRUE(c.sequence_parallel_enabled());
  c.tensor_model_parallel_size = 1;
  EXPECT_FALSE(c.sequence_parallel_enabled());  // ignored at tp 1, like Megatron
}

TEST(ParallelConfig, ResolvedLayoutRoutes) {
  const ModelSpec llama = model_preset("llama3-8b");  // 32 layers
  ParallelConfig c = config(8, 1, 4);
  c.global_batch_size = 16;
  EXPECT_EQ(c.resolved_pipeline_layout(llama).to_string(), "Et*8|t*8|t*8|t*8L");
  c.num_layers_per_virtual_pipeline_stage = 2;  // 8 layers per rank / 2 -> vpp 4
  EXPECT_EQ(c.vpp(llama), 4);
  EXPECT_EQ(c.resolved_pipeline_layout(llama).num_stages(), 16);
  EXPECT_EQ(error_of(c, llama), "");
  c.num_layers_per_virtual_pipeline_stage = 0;
  c.num_virtual_stages_per_pipeline_rank = 2;
  EXPECT_EQ(c.vpp(llama), 2);
  c.num_virtual_stages_per_pipeline_rank = 0;
  c.decoder_first_pipeline_num_layers = 5;
  c.decoder_last_pipeline_num_layers = 7;
  EXPECT_EQ(c.resolved_pipeline_layout(llama).expanded_string(), "Ettttt|tttttttttt|tttttttttt|tttttttL");
  EXPECT_EQ(error_of(c, llama), "");
  c.decoder_first_pipeline_num_layers = c.decoder_last_pipeline_num_layers = -1;
  c.account_for_embedding_in_pipeline_split = c.account_for_loss_in_pipeline_split = true;
  EXPECT_NE(error_of(c, llama).find("(34) is not divisible by --pipeline-model-parallel-size 4"),
            std::string::npos);
  c.pipeline_model_parallel_size = 2;  // (32 + 2) / 2 = 17 per rank
  c.world_size = 4;
  EXPECT_EQ(c.resolved_pipeline_layout(llama).expanded_string(), "Etttttttttttttttt|ttttttttttttttttL");
  c.account_for_embedding_in_pipeline_split = c.account_for_loss_in_pipeline_split = false;
  c.pipeline_model_parallel_layout = "Et*15|t*17L";
  EXPECT_EQ(error_of(c, llama), "");
  EXPECT_EQ(c.resolved_pipeline_layout(llama).stage(1, 0).first_decoder_layer, 15);
}

TEST(ParallelConfig, DeepSeekDoneWhenLayout) {
  const ModelSpec deepseek = model_preset("deepseek-v3");
  ParallelConfig c = config(16, 1, 16);
  c.pipeline_model_parallel_layout = "Et*3|(tt|)*29,m|L";
  c.global_batch_size = 32;
  EXPECT_EQ(error_of(c, deepseek), "");
  EXPECT_EQ(c.vpp(deepseek), 2);
}

TEST(ParallelConfig, EveryRuleHasItsError) {
  const ModelSpec llama = model_preset("llama3-8b");       // 32 heads, 8 groups, ffn 14336, seq 8192
  const ModelSpec mixtral = model_preset("mixtral-8x7b");  // 8 experts
  struct Case {
    const char* expected;
    std::function<void(ParallelConfig&)> change;
    const ModelSpec* model;
  };
  const std::vector<Case> cases = {
      {"--tensor-model-parallel-size 3 does not divide --num-attention-heads 32: use 1, 2, 4 or 8",
       [](ParallelConfig& c) { c.tensor_model_parallel_size = 3, c.world_size = 3; }, &llama},
      {"--tensor-model-parallel-size 16 does not divide --num-query-groups 8: use 1, 2, 4 or 8",
       [](ParallelConfig& c) { c.tensor_model_parallel_size = 16, c.world_size = 16; }, &llama},
      {"--world-size 12 is not a multiple of tp x cp x pp = 8 x 1 x 1 = 8",
       [](ParallelConfig& c) { c.tensor_model_parallel_size = 8, c.world_size = 12; }, &llama},
      {"--data-parallel-size 3 disagrees with --world-size 8",
       [](ParallelConfig& c) { c.data_parallel_size_requested = 3; }, &llama},
      {"--expert-model-parallel-size 3 does not divide --num-experts 8: use 1, 2, 4 or 8",
       [](ParallelConfig& c) { c.expert_model_parallel_size = 3, c.world_size = 6; }, &mixtral},
      {"--world-size 8 is not a multiple of etp x ep x pp = 1 x 16 x 1 = 16",
       [](ParallelConfig& c) { c.expert_model_parallel_size = 16; }, &mixtral},
      {"needs an MoE model", [](ParallelConfig& c) { c.expert_model_parallel_size = 2; }, &llama},
      {"expert parallelism with tensor parallelism needs --sequence-parallel",
       [](ParallelConfig& c) { c.expert_model_parallel_size = 2, c.tensor_model_parallel_size = 2; },
       &mixtral},
      {"--seq-length 8192 is not divisible by 2 x --context-parallel-size 3",
       [](ParallelConfig& c) { c.context_parallel_size = 3, c.world_size = 6; }, &llama},
      {"--global-batch-size 10 is not divisible by --micro-batch-size 2 x data-parallel size 8 = 16: use a "
       "multiple "
       "of 16",
       [](ParallelConfig& c) { c.global_batch_size = 10, c.micro_batch_size = 2; }, &llama},
      {"give at most one of --num-layers-per-virtual-pipeline-stage",
       [](ParallelConfig& c) {
         c.pipeline_model_parallel_size = 4, c.num_virtual_stages_per_pipeline_rank = 2,
         c.num_layers_per_virtual_pipeline_stage = 4;
       },
       &llama},
      {"--pipeline-model-parallel-layout already places every layer",
       [](ParallelConfig& c) {
         c.pipeline_model_parallel_size = 2, c.pipeline_model_parallel_layout = "Et*16|t*16L",
         c.decoder_first_pipeline_num_layers = 16;
       },
       &llama},
      {"cannot be combined with --account-for-embedding/loss-in-pipeline-split",
       [](ParallelConfig& c) {
         c.pipeline_model_parallel_size = 2, c.decoder_first_pipeline_num_layers = 15,
         c.account_for_loss_in_pipeline_split = true;
       },
       &llama},
      {"holds 31 decoder layers t but --num-layers is 32",
       [](ParallelConfig& c) {
         c.pipeline_model_parallel_size = 2, c.pipeline_model_parallel_layout = "Et*16|t*15L";
       },
       &llama},
      {"2 virtual pipeline stages per rank need --pipeline-model-parallel-size > 2 (or 2 with "
       "--overlap-p2p-comm)",
       [](ParallelConfig& c) {
         c.pipeline_model_parallel_size = 2, c.num_virtual_stages_per_pipeline_rank = 2,
         c.global_batch_size = 32;
       },
       &llama},
      {"the interleaved schedule needs at least pp = 4 microbatches",
       [](ParallelConfig& c) {
         c.pipeline_model_parallel_size = 4, c.num_virtual_stages_per_pipeline_rank = 2,
         c.global_batch_size = 6;
       },
       &llama},
      {"--microbatch-group-size-per-virtual-pipeline-stage 3 must lie in [pp = 4, microbatches = 8]",
       [](ParallelConfig& c) {
         c.pipeline_model_parallel_size = 4, c.num_virtual_stages_per_pipeline_rank = 2,
         c.global_batch_size = 16, c.microbatch_group_size_per_vp_stage = 3;
       },
       &llama},
      {"10 microbatches leave a last group of 2 < pp = 4",
       [](ParallelConfig& c) {
         c.pipeline_model_parallel_size = 4, c.num_virtual_stages_per_pipeline_rank = 2,
         c.global_batch_size = 20;
       },
       &llama},
      {"does not split evenly over 3 pipeline ranks",
       [](ParallelConfig& c) { c.pipeline_model_parallel_size = 3, c.world_size = 6; }, &llama},
      {"--recompute-granularity full needs --recompute-method uniform or block",
       [](ParallelConfig& c) { c.recompute_granularity = RecomputeGranularity::kFull; }, &llama},
      {"--recompute-num-layers 40 must be between 1 and the 32 layers per pipeline rank",
       [](ParallelConfig& c) {
         c.recompute_granularity = RecomputeGranularity::kFull, c.recompute_method = RecomputeMethod::kBlock,
         c.recompute_num_layers = 40;
       },
       &llama},
      {"--recompute-method uniform applies only to --recompute-granularity full",
       [](ParallelConfig& c) {
         c.recompute_granularity = RecomputeGranularity::kSelective,
         c.recompute_method = RecomputeMethod::kUniform;
       },
       &llama},
      {"--recompute-method uniform needs --recompute-num-layers",
       [](ParallelConfig& c) {
         c.recompute_granularity = RecomputeGranularity::kFull,
         c.recompute_method = RecomputeMethod::kUniform;
       },
       &llama},
      {"--recompute-num-layers 2 applies only to --recompute-granularity full with --recompute-method",
       [](ParallelConfig& c) { c.recompute_num_layers = 2; }, &llama},
      {"--recompute-method block applies only to --recompute-granularity full",
       [](ParallelConfig& c) { c.recompute_method = RecomputeMethod::kBlock, c.recompute_num_layers = 2; },
       &llama},
      {"--overlap-param-gather needs --use-distributed-optimizer",
       [](ParallelConfig& c) { c.overlap_param_gather = c.overlap_grad_reduce = true; }, &llama},
      {"--overlap-param-gather needs --overlap-grad-reduce",
       [](ParallelConfig& c) { c.overlap_param_gather = c.use_distributed_optimizer = true; }, &llama},
      {"--sequence-parallel splits the 8190 tokens",
       [](ParallelConfig& c) { c.sequence_parallel = true, c.tensor_model_parallel_size = 4; }, nullptr},
      {"--use-tp-pp-dp-mapping needs the expert data-parallel size (1) to equal the data-parallel size (4)",
       [](ParallelConfig& c) {
         c.rank_order = RankOrder::kTpCpEpPpDp, c.expert_model_parallel_size = 4,
         c.tensor_model_parallel_size = 2, c.sequence_parallel = true;
       },
       &mixtral},
      {"--micro-batch-size 0 is out of range", [](ParallelConfig& c) { c.micro_batch_size = 0; }, &llama},
  };
  ModelSpec odd_sequence = llama;
  odd_sequence.seq_length = 8190;
  for (const Case& test : cases) {
    ParallelConfig c = config(8, 1, 1);
    test.change(c);
    const std::string message = error_of(c, test.model ? *test.model : odd_sequence);
    EXPECT_NE(message.find(test.expected), std::string::npos)
        << "expected: " << test.expected << "\n got: " << message;
  }
}

TEST(ParallelConfig, OverlapP2pAllowsVppWithTwoStages) {
  ParallelConfig c = config(2, 1, 2);
  c.num_virtual_stages_per_pipeline_rank = 2;
  c.global_batch_size = 4;
  c.overlap_p2p_comm = true;
  EXPECT_EQ(error_of(c, model_preset("llama3-8b")), "");
}

TEST(ParallelConfig, ParseEnums) {
  EXPECT_EQ(parse_recompute_granularity("full"), RecomputeGranularity::kFull);
  EXPECT_EQ(parse_recompute_method("block"), RecomputeMethod::kBlock);
  EXPECT_EQ(parse_rank_order("tp-cp-ep-pp-dp"), RankOrder::kTpCpEpPpDp);
  EXPECT_THROW(parse_recompute_granularity("partial"), UserError);
  EXPECT_THROW(parse_recompute_method("random"), UserError);
  EXPECT_THROW(parse_rank_order("pp-dp"), UserError);
}

}  // namespace
}  // namespace megatune::layouts
