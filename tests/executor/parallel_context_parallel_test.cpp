// Context parallelism's pieces on the CPU backend: the load-balanced split of a micro-batch, RoPE and learned
// positions at the chunks' global positions, the log-sum-exp merge of partial attention outputs and the
// per-sequence row adds the ring accumulates with.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "executor/cpu/cpu_backend.h"
#include "executor/parallel/context_parallel_split.h"
#include "layouts/context_parallel.h"

namespace megatune::executor {
namespace {

std::vector<float> random_values(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

TEST(ContextParallelSplit, EachRankKeepsItsTwoChunksOfEverySequence) {
  data::MicroBatch full;
  full.micro_batch_size = 2;
  full.sequence_length = 8;
  for (int i = 0; i < 16; ++i) {
    full.tokens.push_back(i);
    full.labels.push_back(100 + i);
    full.loss_mask.push_back(i % 3 == 0 ? 0.0f : 1.0f);
  }
  full.sample_indices = {7, 8};
  data::MicroBatch rank0, rank1;
  context_parallel_slice(full, 2, 0, rank0);
  context_parallel_slice(full, 2, 1, rank1);
  // Chunks of 2: rank 0 holds chunks 0 and 3 of each sequence, rank 1 chunks 1 and 2.
  EXPECT_EQ(rank0.tokens, (std::vector<std::int32_t>{0, 1, 6, 7, 8, 9, 14, 15}));
  EXPECT_EQ(rank1.tokens, (std::vector<std::int32_t>{2, 3, 4, 5, 10, 11, 12, 13}));
  EXPECT_EQ(rank1.labels, (std::vector<std::int32_t>{102, 103, 104, 105, 110, 111, 112, 113}));
  EXPECT_EQ(rank0.loss_mask, (std::vector<float>{0, 1, 0, 1, 1, 0, 1, 0}));
  EXPECT_EQ(rank0.sequence_length, 4);
  EXPECT_EQ(rank0.sample_indices, full.sample_indices);
  EXPECT_THROW(context_parallel_slice(full, 3, 0, rank0), std::invalid_argument);  // 8 tokens, 6 chunks
  const SequencePositions positions = context_parallel_positions(8, 2, 1);
  ASSERT_EQ(positions.size(), 2u);
  EXPECT_EQ(positions[0].global_begin, 2);
  EXPECT_EQ(positions[1].local_begin, 2);
  EXPECT_EQ(positions[1].global_begin, 4);
  EXPECT_TRUE(context_parallel_positions(8, 1, 0).empty());
}

struct Arena {
  CpuBackend backend;
  Arena() { backend.reserve_arena(std::int64_t(1) << 22); }
  Tensor tensor(std::int64_t rows, std::int64_t cols, const std::vector<float>& values) {
    Tensor t = backend.allocate(DType::kFP32, rows, cols, "test");
    backend.upload(t, values.data());
    return t;
  }
  std::vector<float> host(Tensor t) {
    std::vector<float> out(static_cast<std::size_t>(t.numel()));
    backend.download(t, out.data());
    return out;
  }
};

// RoPE of a CP rank's local rows equals RoPE of the whole sequence at those rows, forward and backward.
TEST(ContextParallelPositions, RopeFollowsTheGlobalPositions) {
  const std::int64_t seq = 16, cp = 2, heads = 2, kv_heads = 1, d = 8, width = (heads + 2 * kv_heads) * d;
  for (int rank = 0; rank < cp; ++rank) {
    for (const bool inverse : {false, true}) {
      Arena a;
      const std::vector<float> whole = random_values(static_cast<std::size_t>(2 * seq * width), 11);
      Tensor full = a.tensor(2 * seq, width, whole);
      a.backend.rope(full, seq, heads, kv_heads, d, 10000.0f, inverse, {"rope"});
      std::vector<float> local_values;
      for (std::int64_t b = 0; b < 2; ++b)
        for (std::int64_t i = 0; i < seq / cp; ++i) {
          const std::int64_t row = b * seq + layouts::context_parallel_position(seq, cp, rank, i);
          local_values.insert(local_values.end(), whole.begin() + row * width,
                              whole.begin() + (row + 1) * width);
        }
      Tensor local = a.tensor(2 * seq / cp, width, local_values);
      a.backend.rope(local, seq / cp, heads, kv_heads, d, 10000.0f, inverse, {"rope"},
                     context_parallel_positions(seq, cp, rank));
      const std::vector<float> expected = a.host(full), got = a.host(local);
      for (std::int64_t b = 0; b < 2; ++b)
        for (std::int64_t i = 0; i < seq / cp; ++i) {
          const std::int64_t row = b * seq + layouts::context_parallel_position(seq, cp, rank, i);
          for (std::int64_t c = 0; c < width; ++c)
            ASSERT_FLOAT_EQ(got[(b * seq / cp + i) * width + c], expected[row * width + c])
                << "rank " << rank << " sequence " << b << " local token " << i;
        }
    }
  }
}

TEST(ContextParallelPositions, LearnedPositionsFollowTheGlobalPositions) {
  const std::int64_t seq = 8, h = 4, vocab = 5;
  Arena a;
  Tensor table = a.tensor(vocab, h, random_values(vocab * h, 3));
  Tensor positions = a.tensor(seq, h, random_values(seq * h, 4));
  Tensor tokens = a.backend.allocate_int32(seq / 2, 1, "test");
  const std::vector<std::int32_t> ids = {1, 4, 0, 2};
  a.backend.upload_int32(tokens, ids.data());
  Tensor out = a.backend.allocate(DType::kFP32, seq / 2, h, "test");
  a.backend.embedding_forward(tokens, table, positions, seq / 2, out, {"embedding"},
                              context_parallel_positions(seq, 2, 0));  // positions 0, 1, 6, 7
  const std::vector<float> got = a.host(out), words = a.host(table), pos = a.host(positions);
  const std::int64_t global[] = {0, 1, 6, 7};
  for (int t = 0; t < 4; ++t)
    for (int c = 0; c < h; ++c)
      EXPECT_FLOAT_EQ(got[t * h + c], words[ids[t] * h + c] + pos[global[t] * h + c]);
  // The backward scatters into the same position rows.
  Tensor d_table = a.tensor(vocab, h, std::vector<float>(vocab * h, 0.0f));
  Tensor d_positions = a.tensor(seq, h, std::vector<float>(seq * h, 0.0f));
  a.backend.embedding_backward(tokens, out, seq / 2, d_table, d_positions, {"embedding"},
                               context_parallel_positions(seq, 2, 0));
  const std::vector<float> dp = a.host(d_positions);
  for (int c = 0; c < h; ++c) {
    EXPECT_FLOAT_EQ(dp[6 * h + c], got[2 * h + c]);
    EXPECT_FLOAT_EQ(dp[2 * h + c], 0.0f);
  }
}

// Naive attention of one query over keys [k0, k1): output (d) and log-sum-exp.
float naive(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v, int d,
            int k0, int k1, float* out) {
  std::vector<double> w;
  double high = -1e30;
  for (int j = k0; j < k1; ++j) {
    double s = 0;
    for (int x = 0; x < d; ++x) s += q[x] * k[j * d + x];
    w.push_back(s);
    high = std::max(high, s);
  }
  double sum = 0;
  for (double& s : w) sum += (s = std::exp(s - high));
  for (int x = 0; x < d; ++x) {
    double acc = 0;
    for (int j = k0; j < k1; ++j) acc += w[j - k0] * v[j * d + x];
    out[x] = static_cast<float>(acc / sum);
  }
  return static_cast<float>(high + std::log(sum));
}

// Merging the partial outputs of two key blocks by their log-sum-exp gives the attention over both, for the
// merged block's query rows of every sequence only.
TEST(ContextParallelMerge, LogSumExpMergeEqualsAttentionOverBothBlocks) {
  const int batch = 2, seq = 4, heads = 2, d = 3, keys = 6, split = 2, first = 2, queries = 2;
  const std::vector<float> q = random_values(batch * seq * heads * d, 5), k = random_values(keys * d, 6),
                           v = random_values(keys * d, 7);
  std::vector<float> out(batch * seq * heads * d), lse(batch * heads * seq),
      block_out(batch * queries * heads * d), block_lse(batch * heads * queries), expected(out.size());
  for (int b = 0; b < batch; ++b)
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < seq; ++i) {
        const std::vector<float> qi(q.begin() + ((b * seq + i) * heads + h) * d,
                                    q.begin() + ((b * seq + i) * heads + h + 1) * d);
        const int o = ((b * seq + i) * heads + h) * d;
        lse[(b * heads + h) * seq + i] = naive(qi, k, v, d, 0, split, &out[o]);
        const bool merged = i >= first && i < first + queries;
        naive(qi, k, v, d, 0, merged ? keys : split, &expected[o]);
        if (merged)
          block_lse[(b * heads + h) * queries + i - first] =
              naive(qi, k, v, d, split, keys, &block_out[((b * queries + i - first) * heads + h) * d]);
      }
  Arena a;
  AttentionMergeArgs m;
  m.shape = {batch, seq, heads, d, first, queries, 0};
  m.out = a.tensor(batch * seq, heads * d, out);
  m.lse = a.tensor(batch * heads, seq, lse);
  m.block_out = a.tensor(batch * queries, heads * d, block_out);
  m.block_lse = a.tensor(batch * heads, queries, block_lse);
  a.backend.attention_merge(m, {"cp_attn_merge"});
  const std::vector<float> got = a.host(m.out);
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], expected[i], 1e-5) << i;
}

TEST(ContextParallelMerge, AddRowsAddsIntoEverySequencesRows) {
  Arena a;
  Tensor dst = a.tensor(8, 2, std::vector<float>(16, 1.0f));  // 2 sequences of 4 rows
  std::vector<float> src_values = {1, 2, 3, 4, 5, 6, 7, 8};   // 2 rows per sequence
  Tensor src = a.tensor(4, 2, src_values);
  a.backend.add_rows(dst, src, 4, 1, {"cp_dq_add"});
  EXPECT_EQ(a.host(dst), (std::vector<float>{1, 1, 2, 3, 4, 5, 1, 1, 1, 1, 6, 7, 8, 9, 1, 1}));
  EXPECT_THROW(a.backend.add_rows(dst, src, 4, 3, {"cp_dq_add"}), std::logic_error);
}

}  // namespace
}  // namespace megatune::executor
