// Megatron FSDP in layouts: the sharding strategy's validation, and the step program's FSDP ops (per-segment
// parameter all-gathers before each forward segment and each entry's backward, a reduce-scatter bucket per
// parameter entry, no gather after the step).
#include <gtest/gtest.h>

#include <string>

#include "base/user_error.h"
#include "layouts/schedule_walker.h"
#include "layouts/step_program.h"

namespace megatune::layouts {
namespace {

ModelSpec tiny(int layers) {
  ModelSpec m = model_preset("tiny");
  m.num_layers = layers;
  return m;
}

ParallelConfig fsdp_config(int world, DataParallelSharding sharding) {
  ParallelConfig c;
  c.world_size = world;
  c.global_batch_size = 2 * world;
  c.use_megatron_fsdp = true;
  c.data_parallel_sharding_strategy = sharding;
  return c;
}

std::string error_of(const ModelSpec& model, const ParallelConfig& config) {
  try {
    config.validate(model);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(FsdpConfig, ShardingFollowsTheFlags) {
  ParallelConfig c;
  EXPECT_EQ(c.sharding(), DataParallelSharding::kNoShard);
  c.use_distributed_optimizer = true;
  EXPECT_EQ(c.sharding(), DataParallelSharding::kOptim);
  c.use_megatron_fsdp = true;  // the FSDP's own strategy (default no_shard) wins over the flag
  EXPECT_EQ(c.sharding(), DataParallelSharding::kNoShard);
  c.data_parallel_sharding_strategy = DataParallelSharding::kOptimGrads;
  EXPECT_TRUE(c.shards_gradients());
  EXPECT_FALSE(c.shards_parameters());
  c.use_megatron_fsdp = false;
  c.use_torch_fsdp2 = true;
  c.data_parallel_sharding_strategy = DataParallelSharding::kNoShard;
  EXPECT_EQ(c.sharding(), DataParallelSharding::kOptimGradsParams);
  for (const auto s : {DataParallelSharding::kNoShard, DataParallelSharding::kOptim,
                       DataParallelSharding::kOptimGrads, DataParallelSharding::kOptimGradsParams})
    EXPECT_EQ(parse_data_parallel_sharding(to_string(s)), s);
  EXPECT_THROW(parse_data_parallel_sharding("zero3"), UserError);
}

TEST(FsdpConfig, RefusedCombinationsSayWhy) {
  const ModelSpec model = tiny(4);
  ParallelConfig both = fsdp_config(2, DataParallelSharding::kOptim);
  both.use_torch_fsdp2 = true;
  EXPECT_NE(error_of(model, both).find("two FSDP implementations"), std::string::npos);
  ParallelConfig no_fsdp = fsdp_config(2, DataParallelSharding::kOptimGrads);
  no_fsdp.use_megatron_fsdp = false;
  EXPECT_NE(error_of(model, no_fsdp).find("add --use-megatron-fsdp"), std::string::npos);
  ParallelConfig mapping = fsdp_config(2, DataParallelSharding::kOptim);
  mapping.rank_order = RankOrder::kTpCpEpPpDp;
  EXPECT_NE(error_of(model, mapping).find("--use-tp-pp-dp-mapping is not supported"), std::string::npos);
  ParallelConfig one = fsdp_config(1, DataParallelSharding::kOptimGradsParams);
  EXPECT_NE(error_of(model, one).find("dp x cp = 1"), std::string::npos);
  // Accepted: no_shard on one rank, --use-distributed-optimizer beside FSDP, a sharded pp2 x dp2.
  EXPECT_EQ(error_of(model, fsdp_config(1, DataParallelSharding::kNoShard)), "");
  ParallelConfig with_dist_opt = fsdp_config(2, DataParallelSharding::kOptimGradsParams);
  with_dist_opt.use_distributed_optimizer = with_dist_opt.overlap_grad_reduce = true;
  with_dist_opt.overlap_param_gather = true;
  EXPECT_EQ(error_of(model, with_dist_opt), "");
  ParallelConfig pp2 = fsdp_config(4, DataParallelSharding::kOptimGradsParams);
  pp2.pipeline_model_parallel_size = 2;
  EXPECT_EQ(error_of(model, pp2), "");
}

int count_role(const StepProgram& p, OpRole role, OpPhase phase) {
  int n = 0;
  for (const Op& op : p.ops) n += op.role == role && op.phase == phase ? 1 : 0;
  return n;
}

// optim_grads_params on dp2: a bucket per entry (E, 4 layers, L), reduce-scattered; per micro-batch one
// gather per entry in the forward and one in the backward, each right before the ops that read it; none
// after the step.
TEST(FsdpStepProgram, ZeroThreeGathersEachSegmentBeforeItsUse) {
  const ModelSpec model = tiny(4);
  ParallelConfig c = fsdp_config(2, DataParallelSharding::kOptimGradsParams);
  c.validate(model);
  const RankStep step = walk_rank_step(model, c, 0);
  ASSERT_EQ(step.buckets.size(), 1u);
  ASSERT_EQ(step.buckets[0].size(), 6u);
  for (const GradBucket& b : step.buckets[0]) {
    EXPECT_EQ(b.op.kind, OpKind::kReduceScatter);
    EXPECT_EQ(b.elements % 128, 0);  // padded to lcm(dp, 128) for equal shards
  }
  EXPECT_EQ(format_rank_step(step).find('P'), std::string::npos) << "no param gather after the step";
  const StepProgram program = build_step_program(model, c, 0);
  const int m = c.num_microbatches();
  EXPECT_EQ(count_role(program, OpRole::kFsdpParamGather, OpPhase::kForward), 6 * m);
  EXPECT_EQ(count_role(program, OpRole::kFsdpParamGather, OpPhase::kBackward), 6 * m);
  EXPECT_EQ(count_role(program, OpRole::kParamGather, OpPhase::kOptimizer), 0);
  // Every gather is followed by the ops of its segment: a forward gather of layer L by a forward op of L
  // (or, for the embedding and the head, one of layer -1); its bytes are the bucket's bf16 elements.
  for (std::size_t i = 0; i + 1 < program.ops.size(); ++i) {
    const Op& op = program.ops[i];
    if (op.role != OpRole::kFsdpParamGather) continue;
    EXPECT_EQ(op.kind, OpKind::kAllGather);
    EXPECT_EQ(op.group, CommGroup::kDataContext);
    EXPECT_EQ(op.group_size, 2);
    const Op& next = program.ops[i + 1];
    EXPECT_EQ(next.phase, op.phase) << to_string(op) << " then " << to_string(next);
    EXPECT_EQ(next.microbatch, op.microbatch);
    EXPECT_TRUE(next.role == OpRole::kCompute || next.role == OpRole::kFsdpParamGather) << to_string(next);
  }
  // The gathered bytes of one forward: 2 bytes per (padded) parameter of the stage.
  std::int64_t gathered = 0, elements = 0;
  for (const Op& op : program.ops)
    if (op.role == OpRole::kFsdpParamGather && op.phase == OpPhase::kForward && op.microbatch == 0)
      gathered += op.bytes;
  for (const GradBucket& b : step.buckets[0]) elements += b.elements;
  EXPECT_EQ(gathered, 2 * elements);
}

// optim runs the distributed optimizer's program: reduce-scatter, a gather after the step; so does
// optim_grads after the step (its gradient reduction: ShardedGradientsReduceEveryMicroBatch).
TEST(FsdpStepProgram, OptimAndOptimGradsGatherAfterTheStep) {
  const ModelSpec model = tiny(4);
  for (const auto s : {DataParallelSharding::kOptim, DataParallelSharding::kOptimGrads}) {
    ParallelConfig c = fsdp_config(2, s);
    c.validate(model);
    ParallelConfig dist_opt = c;
    dist_opt.use_megatron_fsdp = false;
    dist_opt.data_parallel_sharding_strategy = DataParallelSharding::kNoShard;
    dist_opt.use_distributed_optimizer = true;
    const StepProgram a = build_step_program(model, c, 1), b = build_step_program(model, dist_opt, 1);
    if (s == DataParallelSharding::kOptim) {
      ASSERT_EQ(a.ops.size(), b.ops.size()) << to_string(s);
      for (std::size_t i = 0; i < a.ops.size(); ++i)
        EXPECT_TRUE(a.ops[i].same_work(b.ops[i])) << to_string(a.ops[i]);
    }
    EXPECT_EQ(count_role(a, OpRole::kParamGather, OpPhase::kOptimizer), 1);
  }
}

// optim_grads and optim_grads_params shard the gradients as Megatron FSDP does: every micro-batch's backward
// reduce-scatters each bucket right after the entry that completes it (the bucket's op, with the
// micro-batch), later micro-batches add the reduced shard into the rank's shard (fsdp_grad_accumulate, 12
// bytes per shard element), and every weight gradient of a micro-batch starts afresh (its slot is zero): no
// weight-gradient GEMM accumulates but the LM head's later token chunks. No reduction after the schedule.
TEST(FsdpStepProgram, ShardedGradientsReduceEveryMicroBatch) {
  const ModelSpec model = tiny(4);
  for (const auto s : {DataParallelSharding::kOptimGrads, DataParallelSharding::kOptimGradsParams}) {
    SCOPED_TRACE(std::string(to_string(s)));
    ParallelConfig c = fsdp_config(2, s);
    c.global_batch_size = 6;  // 3 micro-batches of 1 per rank
    c.validate(model);
    const RankStep step = walk_rank_step(model, c, 0);
    const StepProgram program = build_step_program(model, c, 0);
    const int microbatches = c.num_microbatches(), buckets = static_cast<int>(step.buckets.at(0).size());
    ASSERT_EQ(microbatches, 3);
    ASSERT_GT(buckets, 0);
    std::vector<int> reduced(microbatches, 0), added(microbatches, 0);
    for (std::size_t i = 0; i < program.ops.size(); ++i) {
      const Op& op = program.ops[i];
      if (op.role == OpRole::kGradReduce) {
        ASSERT_GE(op.microbatch, 0);
        ++reduced.at(op.microbatch);
        EXPECT_EQ(op.kind, OpKind::kReduceScatter);
        EXPECT_NE(program.schedule_item[i], -1);  // inside the backward, not after the schedule
      }
      if (op.label == "fsdp_grad_accumulate") ++added.at(op.microbatch);
      if (op.kind == OpKind::kGemm && op.label.ends_with("_wgrad") && op.label != "logits_wgrad")
        EXPECT_FALSE(op.accumulate) << to_string(op);
    }
    for (int m = 0; m < microbatches; ++m) {
      EXPECT_EQ(reduced[m], buckets) << "micro-batch " << m;
      EXPECT_EQ(added[m], m == 0 ? 0 : buckets) << "micro-batch " << m;
    }
    std::int64_t shard_bytes = 0, added_bytes = 0;
    for (const GradBucket& b : step.buckets[0]) shard_bytes += 12 * (b.elements / 2);
    for (const Op& op : program.ops)
      if (op.label == "fsdp_grad_accumulate" && op.microbatch == 1) added_bytes += op.bytes;
    EXPECT_EQ(added_bytes, shard_bytes);
  }
}

// A chunk with MTP layers keeps whole gradients: its buckets are reduced once per step, after the schedule's
// backward, with no accumulate into a shard; the other pipeline stage's chunk reduces every micro-batch.
TEST(FsdpStepProgram, MtpChunkReducesOncePerStep) {
  ModelSpec model = tiny(4);
  model.mtp_num_layers = 1;
  ParallelConfig c = fsdp_config(4, DataParallelSharding::kOptimGrads);
  c.pipeline_model_parallel_size = 2;
  c.pipeline_model_parallel_layout = "Ettt|tmL";
  c.global_batch_size = 8;  // 4 micro-batches of 1 per dp rank
  c.validate(model);
  for (int rank = 0; rank < c.world_size; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const RankStep step = walk_rank_step(model, c, rank);
    const bool mtp = step.stages.at(0).num_mtp_layers > 0;
    EXPECT_EQ(chunk_shards_gradients(c, step.stages.at(0)), !mtp);
    const StepProgram program = build_step_program(model, c, rank);
    int reduced = 0, added = 0;
    for (const Op& op : program.ops) {
      if (op.role == OpRole::kGradReduce) {
        ++reduced;
        EXPECT_EQ(op.microbatch >= 0, !mtp) << to_string(op);
      }
      added += op.label == "fsdp_grad_accumulate";
      if (mtp && op.kind == OpKind::kGemm && op.label == "fc1_wgrad" && op.microbatch > 0)
        EXPECT_TRUE(op.accumulate) << to_string(op);  // into the whole buffer, every micro-batch
    }
    const int buckets = static_cast<int>(step.buckets.at(0).size());
    ASSERT_GT(buckets, 0);
    EXPECT_EQ(reduced, mtp ? buckets : buckets * c.num_microbatches());
    EXPECT_EQ(added, mtp ? 0 : buckets * (c.num_microbatches() - 1));
  }
}

// Sequence parallelism under sharded gradients: each rank all-reduces over TP only the parts of the norm
// gradients inside its shards of the dense buckets, which the dp ranks' parts partition (under
// optim_grads_params a layer's norms lie at its bucket's end: all in the second rank's half).
TEST(FsdpStepProgram, SequenceParallelNormsReduceTheirShardParts) {
  const ModelSpec model = tiny(2);
  for (const auto s : {DataParallelSharding::kOptimGrads, DataParallelSharding::kOptimGradsParams}) {
    SCOPED_TRACE(std::string(to_string(s)));
    ParallelConfig c = fsdp_config(4, s);
    c.tensor_model_parallel_size = 2;
    c.sequence_parallel = true;
    c.validate(model);
    ParallelConfig whole = c;
    whole.data_parallel_sharding_strategy = DataParallelSharding::kOptim;
    std::int64_t parts = 0, whole_elements = 0;
    for (int rank = 0; rank < c.world_size; ++rank) {
      const RankStep step = walk_rank_step(model, c, rank);
      if (step.coordinates.tp != 0) continue;
      const std::int64_t mine =
          sequence_parallel_grad_elements(step.shape, c, step.stages.at(0), step.coordinates.dp);
      whole_elements = sequence_parallel_grad_elements(step.shape, whole, step.stages.at(0), 0);
      EXPECT_LE(mine, whole_elements);
      parts += mine;
      int found = 0;
      for (const Op& op : build_step_program(model, c, rank).ops)
        if (op.role == OpRole::kSequenceParallelNormGrad) {
          EXPECT_EQ(op.bytes, 4 * mine);
          ++found;
        }
      EXPECT_EQ(found, 1);
    }
    EXPECT_GT(whole_elements, 0);
    EXPECT_EQ(parts, whole_elements);  // each element in one dp rank's shard
  }
}

// Experts shard over expert-dp: an MoE layer's segment gathers its expert bucket over kExpertData.
TEST(FsdpStepProgram, ExpertsGatherOverExpertData) {
  ModelSpec model = model_preset("mixtral-8x7b");
  model.num_layers = 2;
  model.seq_length = 256;
  ParallelConfig c = fsdp_config(4, DataParallelSharding::kOptimGradsParams);
  c.expert_model_parallel_size = 2;
  c.validate(model);
  const StepProgram program = build_step_program(model, c, 0);
  int expert_gathers = 0;
  for (const Op& op : program.ops)
    if (op.role == OpRole::kFsdpExpertParamGather) {
      ++expert_gathers;
      EXPECT_EQ(op.group, CommGroup::kExpertData);
      EXPECT_EQ(op.group_size, c.edp());
    }
  EXPECT_EQ(expert_gathers, 2 * 2 * c.num_microbatches());  // 2 MoE layers, forward and backward
}

}  // namespace
}  // namespace megatune::layouts
