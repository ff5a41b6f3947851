// GradBufferLayout: offsets equal the executor's ParameterLayout, buckets agree with the planner's
// layouts::grad_sync_buckets for the tiny model and GPT / Llama presets (tp 1 and 2; the distributed
// optimizer's padded ones too), the distributed optimizer's padding splits every bucket into equal shards
// for any dp and ParameterLayout lays its buffers out by it, and grad_buffer_entries' groups and TP flags.
#include <gtest/gtest.h>

#include <numeric>

#include "executor/model/parameter_layout.h"
#include "executor/parallel/grad_buckets.h"
#include "layouts/model_spec.h"
#include "layouts/pipeline_layout.h"
#include "layouts/step_program.h"

namespace megatune::executor {
namespace {

ParameterLayout parameter_layout(const char* preset, int tp) {
  return ParameterLayout(transformer_config_from(layouts::model_preset(preset), tp, 1e4f, 1e-5f, 0.02f));
}

// The planner's bucket bytes for one chunk of a pp1 model.
std::vector<std::int64_t> planner_bucket_bytes(const char* preset, int tp, int dp, bool overlap,
                                               bool dist_opt, std::int64_t bucket_size) {
  const layouts::ModelSpec spec = layouts::model_preset(preset);
  layouts::ParallelConfig config;
  config.world_size = tp * dp;
  config.tensor_model_parallel_size = tp;
  config.overlap_grad_reduce = overlap;
  config.use_distributed_optimizer = dist_opt;
  const layouts::RankShape shape = layouts::resolve_rank_shape(spec, config);
  const layouts::PipelineLayout pipeline = layouts::PipelineLayout::uniform(spec.num_layers, 1);
  layouts::StepProgramOptions options;
  options.bucket_size_elements = bucket_size;
  std::vector<std::int64_t> bytes;
  for (const layouts::GradBucket& b : layouts::grad_sync_buckets(
           shape, config, layouts::stage_parameters(spec, shape, pipeline.stage(0, 0)), 0, options))
    bytes.push_back(b.op.bytes);
  return bytes;
}

struct Case {
  const char* preset;
  int tp, dp;
  bool overlap, dist_opt;
  std::int64_t bucket_size;  // 0: Megatron's default
};

TEST(GradBufferLayout, BucketsAgreeWithThePlanner) {
  const Case cases[] = {{"tiny", 1, 2, true, false, 20'000}, {"tiny", 2, 2, true, true, 20'000},
                        {"tiny", 1, 4, false, false, 0},     {"gpt-125m", 1, 2, true, true, 0},
                        {"gpt-1.3b", 2, 4, true, false, 0},  {"llama3-1b", 1, 8, true, true, 0},
                        {"llama3-8b", 2, 2, true, false, 0}, {"llama3-1b", 2, 2, false, true, 0}};
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.preset) + " tp" + std::to_string(c.tp) + " dp" + std::to_string(c.dp));
    GradBucketOptions options;
    options.data_parallel_size = c.dp;
    options.overlap_grad_reduce = c.overlap;
    options.distributed_optimizer = c.dist_opt;
    options.bucket_size_elements = c.bucket_size;
    const GradBufferLayout layout(grad_buffer_entries(parameter_layout(c.preset, c.tp)), options);
    const std::vector<std::int64_t> planner =
        planner_bucket_bytes(c.preset, c.tp, c.dp, c.overlap, c.dist_opt, c.bucket_size);
    ASSERT_EQ(layout.buckets().size(), planner.size());
    if (c.overlap) {
      EXPECT_GT(planner.size(), 1u);
    }
    // The distributed optimizer's buckets are padded to lcm(dp, 128) on both sides.
    for (std::size_t b = 0; b < planner.size(); ++b)
      EXPECT_EQ((c.dist_opt ? layout.buckets()[b].numel() : layout.buckets()[b].parameter_elements) * 4,
                planner[b])
          << "bucket " << b;
  }
}

TEST(GradBufferLayout, OffsetsAreTheParameterLayoutsWithoutBucketPadding) {
  for (const char* preset : {"tiny", "gpt-125m", "llama3-1b"}) {
    const ParameterLayout params = parameter_layout(preset, 1);
    GradBucketOptions options;
    options.data_parallel_size = 4;
    options.overlap_grad_reduce = true;
    options.bucket_size_elements = 1'000'000;
    const GradBufferLayout layout(grad_buffer_entries(params), options);
    ASSERT_EQ(layout.entries().size(), params.entries().size());
    for (const ParameterEntry& e : params.entries())
      EXPECT_EQ(layout.offset(layout.find(e.name)), e.offset) << preset << " " << e.name;
    EXPECT_EQ(layout.total_elements(), params.total_elements());
    // With the distributed optimizer and one bucket, only the buffer's end is padded.
    options.overlap_grad_reduce = false;
    options.distributed_optimizer = true;
    const GradBufferLayout one(grad_buffer_entries(params), options);
    ASSERT_EQ(one.buckets().size(), 1u);
    for (const ParameterEntry& e : params.entries()) EXPECT_EQ(one.offset(one.find(e.name)), e.offset);
    EXPECT_EQ(one.total_elements() % 128, 0);
    EXPECT_GE(one.total_elements(), params.total_elements());
  }
}

TEST(GradBufferLayout, DistributedOptimizerBucketsSplitIntoEqualShards) {
  for (int dp : {2, 3, 4, 6, 8}) {
    GradBucketOptions options;
    options.data_parallel_size = dp;
    options.overlap_grad_reduce = true;
    options.distributed_optimizer = true;
    options.bucket_size_elements = 300'000;
    const GradBufferLayout layout(grad_buffer_entries(parameter_layout("gpt-125m", 1)), options);
    ASSERT_GT(layout.buckets().size(), 2u);
    std::int64_t previous_end = 0;
    for (int b = 0; b < static_cast<int>(layout.buckets().size()); ++b) {
      const GradBucketRange& r = layout.buckets()[b];
      EXPECT_EQ(r.begin, previous_end);
      EXPECT_EQ(r.numel() % std::lcm(dp, 128), 0) << "dp " << dp;
      EXPECT_EQ(layout.shard_elements(b) * dp, r.numel());
      EXPECT_EQ(layout.shard_begin(b, dp - 1) + layout.shard_elements(b), r.end);
      for (int e = r.first_entry; e < r.end_entry; ++e) {
        EXPECT_EQ(layout.bucket_of(e), b);
        EXPECT_EQ(layout.offset(e) % GradBufferLayout::kAlignElements, 0);
        EXPECT_GE(layout.offset(e), r.begin);
        EXPECT_LE(layout.offset(e) + layout.entries()[e].numel, r.end);
      }
      previous_end = r.end;
    }
    EXPECT_EQ(previous_end, layout.total_elements());
    EXPECT_THROW(layout.shard_begin(0, dp), std::out_of_range);
  }
}

// Any dp under the distributed optimizer: the model's buffers are laid out by the padded buckets.
TEST(GradBufferLayout, ParameterLayoutFollowsTheDistributedOptimizersPadding) {
  const TransformerConfig config =
      transformer_config_from(layouts::model_preset("gpt-125m"), 1, 1e4f, 1e-5f, 0.02f);
  for (int dp : {3, 6}) {
    BufferBucketing bucketing;
    bucketing.dense = {dp, true, 300'000, true, 0};
    const ParameterLayout params(config, {}, bucketing);
    const GradBufferLayout layout(grad_buffer_entries(ParameterLayout(config)), bucketing.dense);
    ASSERT_GT(layout.buckets().size(), 2u);
    EXPECT_EQ(params.dense_buffer().buckets().size(), layout.buckets().size());
    EXPECT_EQ(params.total_elements(), layout.total_elements());
    EXPECT_EQ(params.total_elements() % std::lcm(dp, 128), 0);
    for (const ParameterEntry& e : params.entries())
      EXPECT_EQ(e.offset, layout.offset(layout.find(e.name))) << "dp " << dp << " " << e.name;
  }
}

TEST(GradBufferLayout, EntriesCarryGroupsAndTensorParallelFlags) {
  const std::vector<GradBufferEntry> entries = grad_buffer_entries(parameter_layout("gpt-125m", 2), true);
  const GradBufferLayout layout(entries, {});
  auto entry = [&](const char* name) { return layout.entries()[layout.find(name)]; };
  EXPECT_EQ(layout.entries().front().name, "decoder.final_layernorm.bias");  // the loss entry opens it
  EXPECT_EQ(layout.entries().front().group, -2);
  EXPECT_TRUE(entry("embedding.position_embeddings.weight").tensor_parallel_duplicate);
  EXPECT_EQ(entry("embedding.position_embeddings.weight").group, -1);
  EXPECT_FALSE(entry("embedding.position_embeddings.weight").shared);
  EXPECT_EQ(layout.entries().back().name, "embedding.word_embeddings.weight");
  EXPECT_EQ(layout.entries().back().group, -1);
  EXPECT_TRUE(layout.entries().back().shared);
  EXPECT_EQ(entry("decoder.layers.1.mlp.linear_fc1.weight").group, 1);
  EXPECT_EQ(entry("decoder.layers.11.mlp.linear_fc2.bias").group, 11);
  EXPECT_FALSE(entry("decoder.layers.1.mlp.linear_fc1.weight").tensor_parallel_duplicate);
  EXPECT_FALSE(entry("decoder.layers.0.self_attention.linear_qkv.bias").tensor_parallel_duplicate);
  EXPECT_TRUE(entry("decoder.layers.0.self_attention.linear_proj.bias").tensor_parallel_duplicate);
  EXPECT_TRUE(entry("decoder.layers.0.mlp.linear_fc2.bias").tensor_parallel_duplicate);
  EXPECT_TRUE(entry("decoder.layers.0.input_layernorm.weight").tensor_parallel_duplicate);
  EXPECT_TRUE(entry("decoder.final_layernorm.weight").tensor_parallel_duplicate);
  EXPECT_FALSE(entry("decoder.final_layernorm.weight").shared);
  EXPECT_EQ(layout.buckets().size(), 1u);
  EXPECT_THROW(layout.find("nope"), std::out_of_range);
  const std::vector<GradBufferEntry> untied = grad_buffer_entries(parameter_layout("tiny", 1));
  EXPECT_EQ(untied.front().name, "output_layer.weight");
  EXPECT_EQ(untied.front().group, -2);
  EXPECT_FALSE(untied.front().tensor_parallel_duplicate);
  GradBucketOptions bad;
  bad.data_parallel_size = 3;
  bad.distributed_optimizer = true;
  bad.bucket_end_multiple = 64;
  EXPECT_THROW(GradBufferLayout(entries, bad), std::invalid_argument);
}

}  // namespace
}  // namespace megatune::executor
