// Schedules: Megatron's orders for small cases, and hundreds of random layouts replayed without deadlock.
#include "layouts/schedule.h"

#include <gtest/gtest.h>

#include <random>
#include <tuple>

#include "base/user_error.h"
#include "layouts/parallel_config.h"
#include "layouts/schedule_replay.h"

namespace megatune::layouts {
namespace {

std::vector<RankSchedule> all_ranks(const PipelineLayout& layout, int m, int g) {
  std::vector<RankSchedule> out;
  for (int r = 0; r < layout.pp(); ++r) out.push_back(build_rank_schedule(layout, m, g, r));
  return out;
}

TEST(ScheduleTable, MatchesMegatronExample) {
  // schedules.py: PP2 N3 M5 VP2 -> mb 0 1 2 0 1 2 3 4 3 4, chunk 0 0 0 1 1 1 0 0 1 1.
  const auto table = interleaved_schedule_table(5, 2, 3);
  const std::vector<int> mbs = {0, 1, 2, 0, 1, 2, 3, 4, 3, 4};
  const std::vector<int> chunks = {0, 0, 0, 1, 1, 1, 0, 0, 1, 1};
  ASSERT_EQ(table.size(), 10u);
  for (size_t k = 0; k < table.size(); ++k) {
    EXPECT_EQ(table[k].microbatch, mbs[k]) << k;
    EXPECT_EQ(table[k].chunk, chunks[k]) << k;
  }
  for (const auto& [m, v, g] : {std::tuple{5, 2, 3}, {8, 4, 4}, {7, 3, 2}, {1, 2, 1}, {9, 1, 4}}) {
    const auto full = interleaved_schedule_table(m, v, g);
    for (int k = 0; k < m * v; ++k) {
      const VirtualMicrobatch entry = interleaved_schedule_entry(k, m, v, g);
      EXPECT_EQ(entry.microbatch, full[k].microbatch) << m << " " << v << " " << g << " k " << k;
      EXPECT_EQ(entry.chunk, full[k].chunk) << m << " " << v << " " << g << " k " << k;
    }
  }
}

TEST(Schedule, NoPipeliningAlternates) {
  const auto layout = PipelineLayout::uniform(4, 1);
  const auto s = build_rank_schedule(layout, 3, 0, 0);
  EXPECT_EQ(s.kind, ScheduleKind::kNoPipelining);
  EXPECT_EQ(format_schedule(s), "F0.0 B0.0 F1.0 B1.0 F2.0 B2.0");
  EXPECT_EQ(max_in_flight_microbatches(s), 1);
}

TEST(Schedule, OneFOneBOrderAndP2p) {
  const auto layout = PipelineLayout::uniform(4, 2);
  const auto r0 = build_rank_schedule(layout, 3, 0, 0);
  const auto r1 = build_rank_schedule(layout, 3, 0, 1);
  EXPECT_EQ(r0.kind, ScheduleKind::kOneForwardOneBackward);
  EXPECT_EQ(format_schedule(r0, false), "F0.0 F1.0 B0.0 F2.0 B1.0 B2.0");
  EXPECT_EQ(format_schedule(r1, false), "F0.0 B0.0 F1.0 B1.0 F2.0 B2.0");
  // Rank 0: warm-up forward, send; steady: send activation + receive gradient in one group.
  EXPECT_EQ(format_schedule(r0),
            "F0.0 [+a0.0@1] F1.0 [+a1.0@1 -g0.0@1] B0.0 F2.0 [+a2.0@1 -g1.0@1] B1.0 [-g2.0@1] B2.0");
  EXPECT_EQ(format_schedule(r1),
            "[-a0.0@0] F0.0 B0.0 [+g0.0@0 -a1.0@0] F1.0 B1.0 [+g1.0@0 -a2.0@0] F2.0 B2.0 [+g2.0@0]");
  EXPECT_EQ(max_in_flight_microbatches(r0), 2);
  EXPECT_EQ(max_in_flight_microbatches(r1), 1);
  EXPECT_TRUE(replay_schedules({r0, r1}, layout).ok);
}

TEST(Schedule, InterleavedWarmupAndOrder) {
  // p = 4, v = 2, m = 8, g = 4: rank 0 warms up 2*3 + 4 = 10 forwards.
  const auto layout = PipelineLayout::uniform(16, 4, 2);
  const auto schedules = all_ranks(layout, 8, 4);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(schedules[r].kind, ScheduleKind::kInterleaved);
    EXPECT_EQ(schedules[r].num_warmup_forwards, 2 * (4 - r - 1) + 4) << r;
    EXPECT_EQ(max_in_flight_microbatches(schedules[r]), 2 * (4 - r - 1) + 4 + 1) << r;
  }
  EXPECT_EQ(format_schedule(schedules[0], false).substr(0, 47),
            "F0.0 F1.0 F2.0 F3.0 F0.1 F1.1 F2.1 F3.1 F4.0 F5");
  const auto replay = replay_schedules(schedules, layout);
  EXPECT_TRUE(replay.ok) << replay.error;
}

TEST(Schedule, AllWarmupWhenFewMicrobatches) {
  // m = p = 4, v = 2, g = 4: rank 0 warm-up 2*3 + 4 = 10 >= 8 -> everything in warm-up.
  const auto layout = PipelineLayout::uniform(8, 4, 2);
  const auto schedules = all_ranks(layout, 4, 4);
  EXPECT_TRUE(schedules[0].all_forwards_in_warmup);
  EXPECT_EQ(max_in_flight_microbatches(schedules[0]), 8);
  const auto replay = replay_schedules(schedules, layout);
  EXPECT_TRUE(replay.ok) << replay.error;
}

TEST(Schedule, RejectsBadGroupSizes) {
  const auto layout = PipelineLayout::uniform(8, 4, 2);
  try {
    build_rank_schedule(layout, 3, 0, 0);  // m < p
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("must lie in [pp = 4, microbatches = 3]"), std::string::npos)
        << e.what();
  }
  try {
    build_rank_schedule(layout, 10, 4, 0);  // remainder 2 < p
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("last group of 2 < pp = 4"), std::string::npos) << e.what();
  }
  EXPECT_THROW(build_rank_schedule(PipelineLayout::uniform(4, 1, 2), 4, 0, 0), UserError);
  EXPECT_NO_THROW(build_rank_schedule(layout, 9, 5, 0));  // remainder 4 >= p
}

TEST(Schedule, EmptyAndEmbeddingOnlyStagesStillRelay) {
  // E alone on stage 0, an empty stage, loss alone on the last stage.
  const auto layout = PipelineLayout::parse("E|tt||t|t|tt|t|L", 4);
  const auto schedules = all_ranks(layout, 8, 4);
  const auto replay = replay_schedules(schedules, layout);
  ASSERT_TRUE(replay.ok) << replay.error;
  // The empty stage 2 (pp 2, chunk 0) still forwards every microbatch after stage 1 and before stage 3.
  int empty_stage_forwards = 0;
  for (const auto& item : schedules[2].items) {
    empty_stage_forwards += item.kind == ScheduleItemKind::kForward && item.stage_index == 2;
  }
  EXPECT_EQ(empty_stage_forwards, 8);
  for (int mb = 0; mb < 8; ++mb) {
    EXPECT_GE(replay.forward_round[2][mb], replay.forward_round[1][mb]);
    EXPECT_GE(replay.forward_round[3][mb], replay.forward_round[2][mb]);
  }
}

TEST(Schedule, ForwardOnlyRelaysActivationsOnly) {
  const auto layout = PipelineLayout::uniform(4, 2);
  const auto r0 = build_rank_schedule(layout, 3, 0, 0, /*forward_only=*/true);
  const auto r1 = build_rank_schedule(layout, 3, 0, 1, /*forward_only=*/true);
  EXPECT_EQ(format_schedule(r0), "F0.0 [+a0.0@1] F1.0 [+a1.0@1] F2.0 [+a2.0@1]");
  EXPECT_EQ(format_schedule(r1), "[-a0.0@0] F0.0 [-a1.0@0] F1.0 [-a2.0@0] F2.0");
  EXPECT_EQ(format_schedule(build_rank_schedule(PipelineLayout::uniform(4, 1), 2, 0, 0, true)), "F0.0 F1.0");
  EXPECT_TRUE(replay_schedules({r0, r1}, layout).ok);
}

// Forward-only schedules of random layouts (interleaved included) run every forward once, in the training
// schedule's forward order, and replay without deadlock.
TEST(Schedule, ForwardOnlyRandomLayoutsReplayCleanly) {
  std::mt19937 rng(20261201);
  for (int trial = 0; trial < 200; ++trial) {
    const int p = 1 + static_cast<int>(rng() % 6);
    const int v = p == 1 ? 1 : 1 + static_cast<int>(rng() % 3);
    std::vector<std::vector<LayerSymbol>> contents(p * v);
    for (auto& stage : contents) stage.assign(rng() % 3, LayerSymbol::kDecoder);
    contents.front().insert(contents.front().begin(), LayerSymbol::kEmbedding);
    contents.back().push_back(LayerSymbol::kLoss);
    const auto layout = PipelineLayout::from_stages(contents, p);
    const int m = v > 1 ? 2 * p : 1 + static_cast<int>(rng() % 8);
    const int g = v > 1 ? p : 0;
    SCOPED_TRACE("p=" + std::to_string(p) + " v=" + std::to_string(v) + " m=" + std::to_string(m));
    std::vector<RankSchedule> schedules;
    for (int r = 0; r < p; ++r) {
      schedules.push_back(build_rank_schedule(layout, m, g, r, true));
      const RankSchedule training = build_rank_schedule(layout, m, g, r);
      std::string training_forwards, forwards;
      for (const auto& item : training.items)
        if (item.kind == ScheduleItemKind::kForward)
          training_forwards += std::to_string(item.microbatch) + "." + std::to_string(item.chunk) + " ";
      for (const auto& item : schedules.back().items) {
        ASSERT_NE(item.kind, ScheduleItemKind::kBackward);
        for (const auto& t : item.transfers) ASSERT_EQ(t.tensor, P2pTensor::kActivation);
        if (item.kind == ScheduleItemKind::kForward)
          forwards += std::to_string(item.microbatch) + "." + std::to_string(item.chunk) + " ";
      }
      EXPECT_EQ(forwards, training_forwards);
    }
    const auto replay = replay_schedules(schedules, layout);
    ASSERT_TRUE(replay.ok) << replay.error;
  }
}

TEST(Replay, DetectsDeadlockAndMismatch) {
  const auto layout = PipelineLayout::uniform(4, 2);
  auto schedules = all_ranks(layout, 2, 0);
  // Swap the two forwards on rank 1: it now waits for microbatch 1 first -> mismatch with rank 0's send.
  auto broken = schedules;
  std::swap(broken[1].items[0], broken[1].items[3]);
  EXPECT_FALSE(replay_schedules(broken, layout).ok);
  // Drop rank 1's first receive: its forward runs before the activation arrived.
  auto missing = schedules;
  missing[1].items.erase(missing[1].items.begin());
  const auto result = replay_schedules(missing, layout);
  EXPECT_FALSE(result.ok);
  EXPECT_FALSE(result.error.empty());
}

// Random layouts: random pp, vpp, stage contents (empty stages included), microbatches and group sizes.
TEST(Schedule, RandomLayoutsReplayCleanly) {
  std::mt19937 rng(20261129);
  int checked = 0;
  for (int trial = 0; trial < 600; ++trial) {
    const int p = 1 + static_cast<int>(rng() % 8);
    const int v = p == 1 ? 1 : 1 + static_cast<int>(rng() % 4);
    const int stages = p * v;
    std::vector<std::vector<LayerSymbol>> contents(stages);
    for (auto& stage : contents) stage.assign(rng() % 4, LayerSymbol::kDecoder);
    contents.front().insert(contents.front().begin(), LayerSymbol::kEmbedding);
    contents.back().push_back(LayerSymbol::kLoss);
    const auto layout = PipelineLayout::from_stages(contents, p);
    int m = 1 + static_cast<int>(rng() % 12);
    int g = 0;
    if (v > 1) {
      m = p + static_cast<int>(rng() % (2 * p + 4));
      // pick a valid group size in [p, m]
      std::vector<int> valid;
      for (int candidate = p; candidate <= m; ++candidate) {
        if (m % candidate == 0 || m % candidate >= p) valid.push_back(candidate);
      }
      ASSERT_FALSE(valid.empty());
      g = valid[rng() % valid.size()];
    }
    SCOPED_TRACE("p=" + std::to_string(p) + " v=" + std::to_string(v) + " m=" + std::to_string(m) +
                 " g=" + std::to_string(g) + " layout=" + layout.to_string());
    const auto schedules = all_ranks(layout, m, g);
    for (int r = 0; r < p; ++r) {
      const auto& s = schedules[r];
      // Every (mb, chunk) forward and backward exactly once.
      std::vector<int> forwards(m * v, 0), backwards(m * v, 0);
      for (const auto& item : s.items) {
        if (item.kind == ScheduleItemKind::kForward) ++forwards[item.microbatch * v + item.chunk];
        if (item.kind == ScheduleItemKind::kBackward) ++backwards[item.microbatch * v + item.chunk];
      }
      for (int i = 0; i < m * v; ++i) {
        ASSERT_EQ(forwards[i], 1);
        ASSERT_EQ(backwards[i], 1);
      }
      // In-flight microbatches = Megatron's warm-up + 1, clipped to m*v.
      const int warmup = warmup_forward_count(p, r, v, m, g > 0 ? g : p);
      ASSERT_EQ(s.num_warmup_forwards, warmup);
      ASSERT_EQ(max_in_flight_microbatches(s), std::min(warmup + 1, m * v));
    }
    const auto replay = replay_schedules(schedules, layout);
    ASSERT_TRUE(replay.ok) << replay.error;
    // Stage dependencies in replay time: forward of stage s after stage s-1, backward in reverse.
    for (int s = 1; s < stages; ++s) {
      for (int mb = 0; mb < m; ++mb) {
        ASSERT_GE(replay.forward_round[s][mb], replay.forward_round[s - 1][mb]);
        ASSERT_GE(replay.backward_round[s - 1][mb], replay.backward_round[s][mb]);
      }
    }
    ++checked;
  }
  EXPECT_EQ(checked, 600);
}

// Random full configurations (model layers, pp, vpp or uneven splits, dp, mbs, gbs) that pass validation:
// their schedules replay cleanly and carry num_microbatches() microbatches.
TEST(Schedule, RandomValidConfigurations) {
  std::mt19937 rng(42);
  int valid = 0;
  for (int trial = 0; trial < 3000 && valid < 300; ++trial) {
    ModelSpec model = model_preset("tiny");
    model.num_layers = 1 + static_cast<int>(rng() % 24);
    model.mtp_num_layers = static_cast<int>(rng() % 2);
    ParallelConfig c;
    c.pipeline_model_parallel_size = 1 + static_cast<int>(rng() % 6);
    c.tensor_model_parallel_size = 1 << (rng() % 2);
    const int dp = 1 + static_cast<int>(rng() % 3);
    c.world_size = c.pp() * c.tp() * dp;
    c.micro_batch_size = 1 + static_cast<int>(rng() % 3);
    c.global_batch_size = c.micro_batch_size * dp * (1 + static_cast<int>(rng() % 12));
    c.overlap_p2p_comm = rng() % 2;
    switch (rng() % 4) {
      case 0:
        c.num_virtual_stages_per_pipeline_rank = 1 + static_cast<int>(rng() % 3);
        break;
      case 1:
        c.decoder_first_pipeline_num_layers = static_cast<int>(rng() % 4);
        c.decoder_last_pipeline_num_layers = static_cast<int>(rng() % 4);
        break;
      case 2:
        c.account_for_embedding_in_pipeline_split = true;
        c.account_for_loss_in_pipeline_split = rng() % 2;
        break;
      default:
        break;
    }
    if (rng() % 2) c.microbatch_group_size_per_vp_stage = c.pp() + static_cast<int>(rng() % 4);
    try {
      c.validate(model);
    } catch (const UserError&) {
      continue;
    }
    ++valid;
    const PipelineLayout layout = c.resolved_pipeline_layout(model);
    SCOPED_TRACE(layout.to_string() + " m=" + std::to_string(c.num_microbatches()));
    EXPECT_EQ(layout.num_decoder_layers(), model.num_layers);
    EXPECT_EQ(layout.num_mtp_layers(), model.mtp_num_layers);
    const auto schedules = build_all_schedules(model, c);
    ASSERT_EQ(static_cast<int>(schedules.size()), c.pp());
    EXPECT_EQ(schedules.front().num_microbatches, c.num_microbatches());
    const auto replay = replay_schedules(schedules, layout);
    ASSERT_TRUE(replay.ok) << replay.error;
  }
  EXPECT_GE(valid, 300);
}

}  // namespace
}  // namespace megatune::layouts
