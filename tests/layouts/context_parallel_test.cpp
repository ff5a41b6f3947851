// Context parallelism's split and ring (layouts/context_parallel.h) against a brute-force causal mask, and
// the step program's ring ops (blocks, payloads, peers) per CP rank.
#include "layouts/context_parallel.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "layouts/model_spec.h"
#include "layouts/parallel_config.h"
#include "layouts/rank_grid.h"
#include "layouts/step_program.h"

namespace megatune::layouts {
namespace {

// Every (query, key) pair of the causal mask over the whole sequence is computed by exactly one block of the
// query's rank, forward and backward, and no block computes a pair the mask excludes.
TEST(ContextParallelRing, BlocksTileTheCausalMaskExactlyOnce) {
  for (int cp = 1; cp <= 4; ++cp) {
    const std::int64_t seq = 8 * cp, local = seq / cp;
    for (int r = 0; r < cp; ++r) {
      for (const bool backward : {false, true}) {
        std::vector<int> hits(static_cast<std::size_t>(local * seq), 0);
        for (int step = 0; step < cp; ++step) {
          const int j = backward ? ring_backward_key_rank(cp, r, step) : ring_forward_key_rank(cp, r, step);
          const RingBlockSpan b = ring_block_span(ring_block(r, j), local);
          for (std::int64_t qi = b.query_begin; qi < b.query_begin + b.queries; ++qi)
            for (std::int64_t ki = b.key_begin; ki < b.key_begin + b.keys; ++ki) {
              if (b.causal && ki > qi) continue;
              const std::int64_t q = context_parallel_position(seq, cp, r, qi);
              const std::int64_t k = context_parallel_position(seq, cp, j, ki);
              if (k <= q)
                ++hits[static_cast<std::size_t>(qi * seq + k)];
              else
                ADD_FAILURE() << "a block computes a masked pair: query " << q << " key " << k;
            }
        }
        for (std::int64_t qi = 0; qi < local; ++qi)
          for (std::int64_t k = 0; k < seq; ++k) {
            const std::int64_t q = context_parallel_position(seq, cp, r, qi);
            EXPECT_EQ(hits[qi * seq + k], k <= q ? 1 : 0)
                << "cp " << cp << " rank " << r << (backward ? " backward" : " forward") << " query " << q
                << " key " << k;
          }
      }
    }
  }
}

TEST(ContextParallelRing, SplitHoldsChunksRAndTheirMirror) {
  // seq 16, cp 2: chunks of 4; rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2.
  std::vector<std::int64_t> rank0, rank1;
  for (int i = 0; i < 8; ++i) {
    rank0.push_back(context_parallel_position(16, 2, 0, i));
    rank1.push_back(context_parallel_position(16, 2, 1, i));
  }
  EXPECT_EQ(rank0, (std::vector<std::int64_t>{0, 1, 2, 3, 12, 13, 14, 15}));
  EXPECT_EQ(rank1, (std::vector<std::int64_t>{4, 5, 6, 7, 8, 9, 10, 11}));
  EXPECT_EQ(context_parallel_position(16, 1, 0, 9), 9);
}

TEST(ContextParallelRing, BackwardStartsWhereTheForwardEnded) {
  for (int cp = 2; cp <= 5; ++cp)
    for (int r = 0; r < cp; ++r) {
      EXPECT_EQ(ring_backward_key_rank(cp, r, 0), ring_forward_key_rank(cp, r, cp - 1));
      EXPECT_EQ(ring_backward_key_rank(cp, r, cp - 1), r);  // the diagonal last: the own dK,dV complete
    }
  EXPECT_EQ(ring_backward_payload(2, 0), RingPayload::kKv);
  EXPECT_EQ(ring_backward_payload(2, 1), RingPayload::kDkv);
  EXPECT_EQ(ring_backward_payload(4, 2), RingPayload::kKvAndDkv);
  EXPECT_EQ(ring_forward_payload(4, 3), RingPayload::kNone);
  EXPECT_THROW(ring_forward_key_rank(2, 2, 0), std::out_of_range);
}

ParallelConfig cp_config(const ModelSpec& model, int cp, int tp, int mbs) {
  ParallelConfig c;
  c.world_size = cp * tp;
  c.context_parallel_size = cp;
  c.tensor_model_parallel_size = tp;
  c.micro_batch_size = mbs;
  c.global_batch_size = 2 * mbs;
  c.validate(model);
  return c;
}

// Per CP rank: the forward's ring sends go to the next CP rank and its receives come from the previous one
// (backward the other way), the forward moves (cp - 1) K,V blocks and the backward 2 (cp - 1), and every
// rank does 1 / cp of the causal attention work (the load balance the split is for).
TEST(StepProgram, ContextParallelRingPerRank) {
  ModelSpec model = model_preset("tiny");
  model.seq_length = 64;
  model.max_position_embeddings = 64;
  for (const int cp : {2, 4}) {
    const ParallelConfig config = cp_config(model, cp, 2, 2);
    const RankGrid grid = RankGrid::from_config(config);
    const double full = [&] {
      ParallelConfig one = cp_config(model, 1, 2, 2);
      double f = 0;
      for (const Op& o : build_step_program(model, one, 0).ops)
        if (o.layer == 0 && o.microbatch == 0 && o.kind == OpKind::kAttentionForward)
          f += o.attention_flops();
      return f;
    }();
    for (int rank = 0; rank < config.world_size; ++rank) {
      SCOPED_TRACE("cp " + std::to_string(cp) + " rank " + std::to_string(rank));
      const std::vector<int> ring = grid.comm_group_members(rank, CommGroup::kContext);
      const int r = grid.dense_coordinates(rank).cp;
      const int next = ring[(r + 1) % cp], prev = ring[(r + cp - 1) % cp];
      double flops = 0;
      std::int64_t forward_bytes = 0, backward_bytes = 0, kv = 0;
      for (const Op& o : build_step_program(model, config, rank).ops) {
        if (o.layer != 0 || o.microbatch != 0) continue;
        if (o.kind == OpKind::kAttentionForward && o.phase == OpPhase::kForward) flops += o.attention_flops();
        if (o.role != OpRole::kContextParallelRing) continue;
        const bool backward = o.phase == OpPhase::kBackward;
        EXPECT_EQ(o.peer_rank, (o.kind == OpKind::kSend) != backward ? next : prev) << to_string(o);
        if (o.kind != OpKind::kSend) continue;
        (backward ? backward_bytes : forward_bytes) += o.bytes;
        if (!backward) kv = o.bytes;
      }
      EXPECT_NEAR(flops / full, 1.0 / cp, 1e-12);
      EXPECT_EQ(forward_bytes, (cp - 1) * kv);
      EXPECT_EQ(backward_bytes, 2 * (cp - 1) * kv);
      const RankShape shape = resolve_rank_shape(model, config);
      EXPECT_EQ(kv, context_parallel_kv_bytes(shape.tokens, std::max<std::int64_t>(1, shape.groups / 2),
                                              shape.head_dim, 2));
    }
  }
}

}  // namespace
}  // namespace megatune::layouts
