// Tests of the schedule walker: its items follow the schedule (1F1B, interleaved, custom layouts with empty
// stages), p2p peers are the right global ranks in both rank orders, gradient buckets appear once per chunk
// where build_step_program issues them, forward items list their segments, and every op of the step
// program carries its role.
#include "layouts/schedule_walker.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <tuple>

namespace megatune::layouts {
namespace {

ParallelConfig config_for(int world, int tp, int pp, int gbs) {
  ParallelConfig c;
  c.world_size = world;
  c.tensor_model_parallel_size = tp;
  c.pipeline_model_parallel_size = pp;
  c.global_batch_size = gbs;
  return c;
}

ModelSpec tiny_with_layers(int layers) {
  ModelSpec m = model_preset("tiny");
  m.num_layers = layers;
  return m;
}

// The schedule-level items of a walk as a schedule (segments of one backward merged, buckets left out), for
// format_schedule: what the walk must reproduce.
RankSchedule schedule_of_walk(const RankStep& step) {
  RankSchedule schedule;
  for (const StepItem& item : step.items) {
    if (item.schedule_item < 0 || item.kind == StepItemKind::kGradBucket) continue;
    if (item.kind == StepItemKind::kBackward && item.entry_begin > 0) continue;
    ScheduleItem out;
    out.kind = item.kind == StepItemKind::kP2p       ? ScheduleItemKind::kP2p
               : item.kind == StepItemKind::kForward ? ScheduleItemKind::kForward
                                                     : ScheduleItemKind::kBackward;
    out.microbatch = item.microbatch;
    out.chunk = item.chunk;
    for (const StepTransfer& t : item.transfers)
      out.transfers.push_back({t.direction, t.tensor, t.peer_pp_rank, t.microbatch, t.chunk, t.peer_chunk});
    schedule.items.push_back(std::move(out));
  }
  return schedule;
}

// Every rank's walk reproduces its schedule, item for item, with schedule_item counting up through it.
void expect_walk_follows_schedule(const ModelSpec& model, const ParallelConfig& config,
                                  const StepProgramOptions& options = {}) {
  for (int rank = 0; rank < config.world_size; ++rank) {
    const RankStep step = walk_rank_step(model, config, rank, options);
    const RankSchedule schedule = build_schedule(model, config, step.coordinates.pp);
    EXPECT_EQ(step.schedule_kind, schedule.kind);
    const RankSchedule walked = schedule_of_walk(step);
    EXPECT_EQ(format_schedule(walked), format_schedule(schedule)) << "rank " << rank;
    ASSERT_EQ(walked.items.size(), schedule.items.size());
    for (std::size_t i = 0; i < walked.items.size(); ++i)
      EXPECT_EQ(walked.items[i].transfers, schedule.items[i].transfers) << "rank " << rank << " item " << i;
    int last = -1;
    for (const StepItem& item : step.items) {
      if (item.schedule_item < 0) continue;
      EXPECT_GE(item.schedule_item, last);
      last = item.schedule_item;
      const ScheduleItem& source = schedule.items.at(item.schedule_item);
      if (item.kind == StepItemKind::kForward || item.kind == StepItemKind::kBackward) {
        EXPECT_EQ(item.microbatch, source.microbatch);
        EXPECT_EQ(item.chunk, source.chunk);
        EXPECT_EQ(item.stage_index, source.stage_index);
        EXPECT_EQ(step.stages.at(item.chunk).stage_index, item.stage_index);
      }
    }
    EXPECT_EQ(last, static_cast<int>(schedule.items.size()) - 1);
  }
}

TEST(ScheduleWalker, OneForwardOneBackwardFollowsTheSchedule) {
  const ModelSpec model = tiny_with_layers(4);
  ParallelConfig config = config_for(2, 1, 2, 4);
  config.validate(model);
  expect_walk_follows_schedule(model, config);
  const RankStep first = walk_rank_step(model, config, 0);
  // pp rank 0 of 1F1B with 4 microbatches: one warm-up forward, then steady 1F1B, then the cool-down.
  EXPECT_EQ(
      format_rank_step(first),
      "F0.0 [+a0.0@r1] F1.0 [+a1.0@r1 -g0.0@r1] B0.0 F2.0 [+a2.0@r1 -g1.0@r1] B1.0 F3.0 [+a3.0@r1 -g2.0@r1] "
      "B2.0 [-g3.0@r1] B3.0 O:grad_norm O:adamw");
}

TEST(ScheduleWalker, InterleavedFollowsTheSchedule) {
  const ModelSpec model = tiny_with_layers(8);
  ParallelConfig config = config_for(4, 1, 2, 8);
  config.num_layers_per_virtual_pipeline_stage = 2;
  config.overlap_p2p_comm = true;
  config.overlap_grad_reduce = true;
  config.validate(model);
  expect_walk_follows_schedule(model, config);
  const RankStep step = walk_rank_step(model, config, 2);  // dp 0, pp rank 1
  EXPECT_EQ(step.coordinates.pp, 1);
  ASSERT_EQ(step.stages.size(), 2u);
  EXPECT_EQ(step.stages[0].stage_index, 1);
  EXPECT_EQ(step.stages[1].stage_index, 3);
}

TEST(ScheduleWalker, CustomLayoutWithEmptyStagesFollowsTheSchedule) {
  const ModelSpec model = tiny_with_layers(4);
  for (const auto& [text, pp] : {std::pair{"E|t*2||t*2|L", 5}, std::pair{"Et|tt||tL", 4}}) {
    ParallelConfig config = config_for(pp, 1, pp, 2 * pp);
    config.pipeline_model_parallel_layout = text;
    config.validate(model);
    expect_walk_follows_schedule(model, config);
    // The empty stage (pp rank 2) still runs its passes in the p2p chain; they issue no op.
    const RankStep empty = walk_rank_step(model, config, 2);
    ASSERT_TRUE(empty.stages.at(0).empty());
    EXPECT_TRUE(empty.buckets.at(0).empty());
    int passes = 0;
    for (const StepItem& item : empty.items) {
      if (item.kind != StepItemKind::kForward && item.kind != StepItemKind::kBackward) continue;
      ++passes;
      EXPECT_EQ(item.entry_count, 0);
      EXPECT_TRUE(step_item_ops(model, config, empty, item).empty());
    }
    EXPECT_EQ(passes, 2 * config.num_microbatches());
  }
}

// tp2 pp2 dp2: each transfer names the rank of the same (tp, cp, dp) on the peer pp rank, and the peer's walk
// holds the matching transfer back.
TEST(ScheduleWalker, PeersAreGlobalRanksInBothRankOrders) {
  const ModelSpec model = tiny_with_layers(4);
  for (RankOrder order : {RankOrder::kTpCpEpDpPp, RankOrder::kTpCpEpPpDp}) {
    ParallelConfig config = config_for(8, 2, 2, 8);
    config.rank_order = order;
    config.validate(model);
    const RankGrid grid = RankGrid::from_config(config);
    using Key = std::tuple<int, int, int, int, int>;  // (src, dst, tensor, microbatch, producer stage)
    std::map<Key, int> balance;
    for (int rank = 0; rank < 8; ++rank) {
      const RankStep step = walk_rank_step(model, config, rank);
      for (const StepItem& item : step.items) {
        for (const StepTransfer& t : item.transfers) {
          DenseCoordinates expected = grid.dense_coordinates(rank);
          expected.pp = t.peer_pp_rank;
          EXPECT_EQ(t.peer_rank, grid.rank_of(expected));
          EXPECT_NE(t.peer_pp_rank, step.coordinates.pp);
          const bool send = t.direction == P2pDirection::kSend;
          const Key key{send ? rank : t.peer_rank, send ? t.peer_rank : rank, static_cast<int>(t.tensor),
                        t.microbatch, t.producer_stage};
          balance[key] += send ? 1 : -1;
        }
      }
    }
    EXPECT_EQ(balance.size(), 4u * 4 * 2);  // 4 pipelines x 4 microbatches x (activation + gradient)
    for (const auto& [key, value] : balance) EXPECT_EQ(value, 0);
    // Rank 0's pipeline peer: rank 4 in tp-cp-ep-dp-pp (pp slowest), rank 2 in tp-cp-ep-pp-dp.
    const RankStep first = walk_rank_step(model, config, 0);
    ASSERT_FALSE(first.items.at(1).transfers.empty());
    EXPECT_EQ(first.items.at(1).transfers.front().peer_rank, order == RankOrder::kTpCpEpDpPp ? 4 : 2);
  }
}

// Where build_step_program puts each gradient bucket: with overlap right after the op of the backward entry
// that completes it in the chunk's last backward, without it after the schedule; once per bucket.
void expect_buckets_where_the_program_issues_them(const ModelSpec& model, const ParallelConfig& config,
                                                  const StepProgramOptions& options) {
  for (int rank = 0; rank < config.world_size; ++rank) {
    const RankStep step = walk_rank_step(model, config, rank, options);
    const StepProgram program = build_step_program(model, config, rank, options);
    const RankSchedule schedule = build_schedule(model, config, step.coordinates.pp);
    std::set<std::pair<int, int>> seen, gathered;
    std::size_t op_index = 0;
    bool schedule_done = false;
    const StepItem* previous = nullptr;
    for (const StepItem& item : step.items) {
      const std::vector<Op> ops = step_item_ops(model, config, step, item, options);
      if (item.schedule_item < 0) schedule_done = true;
      if (item.kind == StepItemKind::kGradBucket) {
        EXPECT_TRUE(seen.insert({item.chunk, item.bucket}).second) << "bucket twice";
        const GradBucket& bucket = step.buckets.at(item.chunk).at(item.bucket);
        EXPECT_EQ(item.ready_after_entry, bucket.ready_after_entry);
        ASSERT_EQ(ops.size(), 1u);
        ASSERT_LT(op_index, program.ops.size());
        EXPECT_TRUE(program.ops[op_index].same_work(bucket.op));
        EXPECT_EQ(program.schedule_item[op_index], item.schedule_item);
        if (config.overlap_grad_reduce) {
          // Follows the backward segment ending at the entry that completes it, in the chunk's last backward.
          ASSERT_NE(previous, nullptr);
          EXPECT_FALSE(schedule_done);
          EXPECT_EQ(item.schedule_item, previous->schedule_item);
          int last_backward = -1;
          for (int i = 0; i < static_cast<int>(schedule.items.size()); ++i)
            if (schedule.items[i].kind == ScheduleItemKind::kBackward &&
                schedule.items[i].chunk == item.chunk)
              last_backward = i;
          EXPECT_EQ(item.schedule_item, last_backward);
          if (previous->kind == StepItemKind::kBackward) {
            EXPECT_EQ(previous->entry_end - 1, item.ready_after_entry);
            // The op before it in the program is that entry's last backward op.
            const int layer = stage_parameters(model, step.shape, step.stages[item.chunk])
                                  .layer_reverse.at(item.ready_after_entry);
            ASSERT_GT(op_index, 0u);
            EXPECT_EQ(program.ops[op_index - 1].layer, layer >= 0 ? layer : -1);
            EXPECT_EQ(program.ops[op_index - 1].phase, OpPhase::kBackward);
          }
        } else {
          EXPECT_TRUE(schedule_done);
          EXPECT_EQ(item.schedule_item, -1);
        }
      }
      if (item.kind == StepItemKind::kParamGather) {
        EXPECT_TRUE(gathered.insert({item.chunk, item.bucket}).second);
        EXPECT_EQ(ops.at(0).bytes, step.buckets.at(item.chunk).at(item.bucket).elements * 2);
      }
      for (const Op& op : ops) {
        ASSERT_LT(op_index, program.ops.size());
        EXPECT_TRUE(program.ops[op_index].same_work(op)) << to_string(program.ops[op_index]);
        ++op_index;
      }
      if (item.kind != StepItemKind::kGradBucket) previous = &item;
    }
    EXPECT_EQ(op_index, program.ops.size());
    std::size_t buckets = 0;
    for (const auto& chunk : step.buckets) buckets += chunk.size();
    EXPECT_EQ(seen.size(), buckets);
    EXPECT_GT(buckets, 0u);
    EXPECT_EQ(gathered.size(), config.use_distributed_optimizer ? buckets : 0u);
  }
}

TEST(ScheduleWalker, BucketsAppearOnceWhereTheProgramIssuesThem) {
  ModelSpec model = model_preset("gpt-125m");
  model.num_layers = 4;
  model.seq_length = 256;
  StepProgramOptions small;
  small.bucket_size_elements = 3'000'000;  // several buckets per chunk
  for (bool overlap : {false, true}) {
    ParallelConfig dp2 = config_for(2, 1, 1, 4);
    dp2.use_distributed_optimizer = true;
    dp2.overlap_grad_reduce = overlap;
    dp2.overlap_param_gather = overlap;
    dp2.validate(model);
    expect_walk_follows_schedule(model, dp2, small);
    expect_buckets_where_the_program_issues_them(model, dp2, small);
    // pp2 vpp2 dp2: chunks' last backwards in interleaved order.
    ParallelConfig vpp = config_for(4, 1, 2, 8);
    vpp.num_layers_per_virtual_pipeline_stage = 1;
    vpp.overlap_p2p_comm = true;
    vpp.overlap_grad_reduce = overlap;
    vpp.validate(model);
    expect_walk_follows_schedule(model, vpp, small);
    expect_buckets_where_the_program_issues_them(model, vpp, small);
    expect_buckets_where_the_program_issues_them(model, vpp, {});
  }
}

TEST(ScheduleWalker, OverlapSplitsTheLastBackwardAtBucketBoundaries) {
  ModelSpec model = model_preset("gpt-125m");
  model.num_layers = 4;
  model.seq_length = 256;
  ParallelConfig config = config_for(2, 1, 1, 4);
  config.overlap_grad_reduce = true;
  config.validate(model);
  StepProgramOptions small;
  small.bucket_size_elements = 3'000'000;
  const RankStep step = walk_rank_step(model, config, 0, small);
  // Entries of the chunk (reverse order): L (the final norm: tied head), t3, t2, t1, t0 (7.1M params each),
  // E (40M): L and t3 fill the first 3M bucket, every later entry one bucket of its own.
  ASSERT_EQ(step.buckets.at(0).size(), 5u);
  EXPECT_EQ(
      format_rank_step(step),
      "F0.0 B0.0 F1.0 B1.0{0-2} G0.0@1 B1.0{2-3} G0.1@2 B1.0{3-4} G0.2@3 B1.0{4-5} G0.3@4 B1.0{5-6} G0.4@5 "
      "O:grad_norm O:adamw");
}

TEST(ScheduleWalker, OptimizerStepsAndParamGathersAfterTheSchedule) {
  ModelSpec model = model_preset("llama3-1b");  // tied embedding
  model.num_layers = 4;
  model.seq_length = 256;
  ParallelConfig config = config_for(8, 2, 2, 8);
  config.sequence_parallel = true;
  config.use_distributed_optimizer = true;
  config.validate(model);
  const RankStep step = walk_rank_step(model, config, 0);
  const std::string text = format_rank_step(step);
  EXPECT_NE(text.find("G0.0@2 O:embedding O:sp_norm O:grad_norm O:adamw P0.0"), std::string::npos) << text;
  const std::string tail = text.substr(text.find("G0.0@2"));
  EXPECT_EQ(tail, "G0.0@2 O:embedding O:sp_norm O:grad_norm O:adamw P0.0");
}

TEST(ScheduleWalker, RankOutsideTheWorldThrows) {
  const ModelSpec model = tiny_with_layers(4);
  ParallelConfig config = config_for(2, 1, 2, 4);
  config.validate(model);
  EXPECT_THROW(walk_rank_step(model, config, 2), std::out_of_range);
  EXPECT_THROW(walk_rank_step(model, config, -1), std::out_of_range);
}

// Every op of build_step_program has a role: kCompute exactly for the non-communication ops, and the role
// each known label stands for.
TEST(ScheduleWalker, EveryStepProgramOpHasItsRole) {
  const std::map<std::string, OpRole> expected = {
      {"p2p_activation", OpRole::kP2pActivation},
      {"p2p_gradient", OpRole::kP2pGradient},
      {"grad_bucket", OpRole::kGradReduce},
      {"expert_grad_bucket", OpRole::kExpertGradReduce},
      {"param_ag", OpRole::kParamGather},
      {"expert_param_ag", OpRole::kExpertParamGather},
      {"embedding_grad_ar", OpRole::kEmbeddingGradReduce},
      {"sp_norm_grad_ar", OpRole::kSequenceParallelNormGrad},
      {"grad_norm_ar", OpRole::kGradNormReduce},
      {"cp_kv_send", OpRole::kContextParallelRing},
      {"cp_kv_recv", OpRole::kContextParallelRing},
      {"cp_dkv_send", OpRole::kContextParallelRing},
      {"cp_dkv_recv", OpRole::kContextParallelRing},
      {"cp_kv_ag", OpRole::kContextParallelGather},
      {"cp_dkv_rs", OpRole::kContextParallelGather},
      {"dispatch_a2a", OpRole::kExpertDispatch},
      {"combine_a2a", OpRole::kExpertDispatch},
      {"qkv_input_ag", OpRole::kTensorParallel},
      {"proj_rs", OpRole::kTensorParallel},
      {"fc2_ar", OpRole::kTensorParallel},
      {"embedding_ar", OpRole::kTensorParallel},
      {"ce_max_ar", OpRole::kTensorParallel},
      {"logits_dgrad_rs", OpRole::kTensorParallel},
  };
  struct Case {
    ModelSpec model;
    ParallelConfig config;
    StepProgramOptions options;
  };
  std::vector<Case> cases;
  ModelSpec llama = model_preset("llama3-1b");
  llama.num_layers = 4;
  llama.seq_length = 512;
  ParallelConfig tp_pp_dp = config_for(8, 2, 2, 8);
  tp_pp_dp.sequence_parallel = true;
  tp_pp_dp.use_distributed_optimizer = true;
  tp_pp_dp.overlap_grad_reduce = true;
  cases.push_back({llama, tp_pp_dp, {}});
  ParallelConfig no_sp = config_for(2, 2, 1, 1);
  cases.push_back({llama, no_sp, {}});
  ParallelConfig cp = config_for(2, 1, 1, 1);
  cp.context_parallel_size = 2;
  cases.push_back({llama, cp, {}});
  StepProgramOptions all_gather;
  all_gather.cp_comm = ContextParallelComm::kAllGather;
  cases.push_back({llama, cp, all_gather});
  ModelSpec mixtral = model_preset("mixtral-8x7b");
  mixtral.num_layers = 2;
  mixtral.seq_length = 256;
  ParallelConfig ep = config_for(4, 1, 1, 4);
  ep.expert_model_parallel_size = 2;
  ep.use_distributed_optimizer = true;
  cases.push_back({mixtral, ep, {}});
  std::set<std::string> labels_seen;
  for (Case& c : cases) {
    c.config.validate(c.model);
    for (int rank = 0; rank < c.config.world_size; ++rank) {
      for (const Op& op : build_step_program(c.model, c.config, rank, c.options).ops) {
        EXPECT_EQ(op.role == OpRole::kCompute, !op.is_communication()) << to_string(op);
        auto it = expected.find(op.label);
        if (it == expected.end()) continue;
        labels_seen.insert(op.label);
        EXPECT_EQ(op.role, it->second) << to_string(op) << " has role " << op_role_name(op.role);
      }
    }
  }
  for (const auto& [label, role] : expected)
    EXPECT_TRUE(labels_seen.count(label)) << label << " never issued";
}

TEST(ScheduleWalker, SameWorkComparesTheRole) {
  Op a;
  a.kind = OpKind::kAllReduce;
  a.group = CommGroup::kTensor;
  a.role = OpRole::kTensorParallel;
  Op b = a;
  EXPECT_TRUE(a.same_work(b));
  b.role = OpRole::kSequenceParallelNormGrad;
  EXPECT_FALSE(a.same_work(b));
  EXPECT_STREQ(op_role_name(b.role), "sequence_parallel_norm_grad");
}

TEST(ScheduleWalker, ForwardWalkHasForwardsAndActivationTransfersOnly) {
  const ModelSpec model = tiny_with_layers(4);
  ParallelConfig config = config_for(8, 2, 2, 8);
  config.validate(model);
  for (int rank = 0; rank < config.world_size; ++rank) {
    const RankStep step = walk_rank_forward(model, config, rank);
    const RankSchedule schedule = build_schedule(model, config, step.coordinates.pp, /*forward_only=*/true);
    EXPECT_EQ(format_schedule(schedule_of_walk(step)), format_schedule(schedule)) << "rank " << rank;
    int forwards = 0;
    for (const StepItem& item : step.items) {
      EXPECT_TRUE(item.kind == StepItemKind::kForward || item.kind == StepItemKind::kP2p);
      forwards += item.kind == StepItemKind::kForward ? 1 : 0;
    }
    EXPECT_EQ(forwards, config.num_microbatches());
  }
  // The peers are global ranks: pp rank 0 of tp rank 1 (rank 1) sends to pp rank 1 of tp rank 1.
  const RankStep first = walk_rank_forward(model, config, 1);
  ASSERT_GE(first.items.size(), 2u);
  EXPECT_EQ(first.items[1].transfers.at(0).peer_rank,
            RankGrid::from_config(config).rank_of({.tp = 1, .pp = 1}));
}

// A forward item lists its stage's segments in forward order: the embedding (-1), each decoder layer by its
// global index, the head (-2) once; an empty stage none. In the training and the forward-only walk alike.
TEST(ScheduleWalker, ForwardItemsListTheirStagesSegments) {
  const ModelSpec model = tiny_with_layers(4);
  ParallelConfig config = config_for(4, 1, 4, 8);
  config.pipeline_model_parallel_layout = "Et|tt||tL";
  config.validate(model);
  const std::vector<std::vector<int>> expected = {{-1, 0}, {1, 2}, {}, {3, -2}};
  for (int rank = 0; rank < config.world_size; ++rank) {
    for (const RankStep& step :
         {walk_rank_step(model, config, rank), walk_rank_forward(model, config, rank)}) {
      int forwards = 0;
      for (const StepItem& item : step.items) {
        if (item.kind != StepItemKind::kForward) {
          EXPECT_TRUE(item.forward_groups.empty());
          continue;
        }
        ++forwards;
        EXPECT_EQ(item.forward_groups, expected[rank]) << "rank " << rank;
      }
      EXPECT_EQ(forwards, config.num_microbatches());
    }
  }
  // Interleaved: each model chunk its own stage's layers.
  ParallelConfig interleaved = config_for(2, 1, 2, 8);
  interleaved.pipeline_model_parallel_layout = "Et|t|t|tL";
  interleaved.overlap_p2p_comm = true;  // vpp 2 at pp 2
  interleaved.validate(model);
  int interleaved_forwards = 0;
  for (const StepItem& item : walk_rank_step(model, interleaved, 1).items) {
    if (item.kind != StepItemKind::kForward) continue;
    ++interleaved_forwards;
    EXPECT_EQ(item.forward_groups, (item.chunk == 0 ? std::vector<int>{1} : std::vector<int>{3, -2}));
  }
  EXPECT_EQ(interleaved_forwards, 2 * interleaved.num_microbatches());
  // MTP layers share the head's segment (they read the LM head); the whole model without a layout.
  StageContents mtp;
  mtp.first_layer = 2;
  mtp.num_layers = 2;
  mtp.has_embedding = false;
  mtp.num_mtp_layers = 1;
  EXPECT_EQ(forward_segment_groups(mtp), (std::vector<int>{2, 3, -2}));
  mtp.has_loss = false;
  EXPECT_EQ(forward_segment_groups(mtp), (std::vector<int>{2, 3, -2}));
  StageContents whole;
  whole.num_layers = 2;
  EXPECT_EQ(forward_segment_groups(whole), (std::vector<int>{-1, 0, 1, -2}));
}

}  // namespace
}  // namespace megatune::layouts
