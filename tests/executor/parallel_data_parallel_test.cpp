// Data parallelism on threads as ranks: GradientReducer (the mean over dp, overlap on and off bit-identical,
// early launch of ready buckets, recorded ops) and the DataParallelStrategy implementations (the distributed
// optimizer at dp 2, 3, 4 and 6 with its own fp32 shards or an fp32 model's, and DDP, against one rank's
// AdamW over the whole buffer; bf16 gathers; the global grad norm under TP and DP; a non-finite gradient).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <random>
#include <stdexcept>

#include "executor/kernels/reference_elementwise.h"
#include "executor/parallel/data_parallel.h"
#include "executor/parallel/gradient_reducer.h"
#include "layouts/rank_grid.h"
#include "tests/executor/thread_rank_test_util.h"

namespace megatune::executor {
namespace {

using layouts::OpKind;
using layouts::OpPhase;

// Odd sizes, so that shards cut parameters; distinct groups, so that a small bucket size makes several.
std::vector<GradBufferEntry> test_entries() {
  const std::int64_t sizes[] = {100, 37, 1, 300, 64, 129, 50, 3};
  std::vector<GradBufferEntry> entries;
  for (int i = 0; i < 8; ++i) {
    GradBufferEntry e;
    e.name = "p" + std::to_string(i);
    e.numel = sizes[i];
    e.group = i;
    e.weight_decay = i % 3 != 0;
    e.tensor_parallel_duplicate = i % 4 == 1;
    entries.push_back(e);
  }
  return entries;
}

GradBufferLayout test_layout(int dp, bool dist_opt) {
  GradBucketOptions options;
  options.data_parallel_size = dp;
  options.overlap_grad_reduce = true;
  options.bucket_size_elements = 150;
  options.distributed_optimizer = dist_opt;
  return GradBufferLayout(test_entries(), options);
}

// The gradients of (tp rank, dp rank) at `step` over the buffer (padding zero). TP-duplicate parameters get
// the same gradients on every TP rank.
std::vector<float> local_grads(const GradBufferLayout& layout, int tp_rank, int dp_rank, int step) {
  std::vector<float> g(layout.total_elements(), 0.0f);
  for (int e = 0; e < static_cast<int>(layout.entries().size()); ++e) {
    const bool duplicate = layout.entries()[e].tensor_parallel_duplicate;
    std::mt19937 rng(1000 * step + 100 * dp_rank + 10 * (duplicate ? 0 : tp_rank) + e);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (std::int64_t i = 0; i < layout.entries()[e].numel; ++i) g[layout.offset(e) + i] = normal(rng);
  }
  return g;
}

// A rank's gradients scaled by 1 / dp, as the reducer scales them (or the loss gradient carries it).
std::vector<float> scaled_local_grads(const GradBufferLayout& layout, int tp_rank, int dp_rank, int dp,
                                      int step) {
  std::vector<float> g = local_grads(layout, tp_rank, dp_rank, step);
  for (float& x : g) x *= 1.0f / static_cast<float>(dp);
  return g;
}

// The mean over dp ranks: the scaled gradients summed in dp order, as the collectives sum them.
std::vector<float> mean_grads(const GradBufferLayout& layout, int tp_rank, int dp, int step) {
  std::vector<float> sum(layout.total_elements(), 0.0f);
  for (int r = 0; r < dp; ++r) {
    const std::vector<float> g = scaled_local_grads(layout, tp_rank, r, dp, step);
    for (std::size_t i = 0; i < sum.size(); ++i) sum[i] = r == 0 ? g[i] : sum[i] + g[i];
  }
  return sum;
}

std::vector<float> initial_params(const GradBufferLayout& layout, int tp_rank) {
  std::vector<float> p(layout.total_elements(), 0.0f);
  std::mt19937 rng(7 + tp_rank);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  for (float& x : p) x = normal(rng);
  return p;
}

using Rank = TestRank;

// Runs body(rank) on every rank of a tp x dp grid.
void run_grid(int tp, int dp, const std::function<void(Rank&)>& body, bool bf16 = false) {
  const layouts::RankGrid grid(tp * dp, tp, 1, 1, tp, 1);
  run_thread_ranks(
      tp * dp,
      [&](int r, ThreadWorld& world) {
        Rank rank(grid, r, world, bf16);
        body(rank);
      },
      std::chrono::milliseconds(30'000));
}

// Reduces this rank's step-0 gradients, marking entries ready in buffer order; returns the buffer.
std::vector<float> reduce_once(Rank& rank, const GradBufferLayout& layout,
                               const GradientReducerOptions& options) {
  const int dp_rank = rank.comm.rank(CommGroup::kDataContext);
  Tensor grads = rank.make(local_grads(layout, 0, dp_rank, 0));
  GradientReducer reducer(rank.comm, layout, grads, options);
  for (int e = 0; e < static_cast<int>(layout.entries().size()); ++e) reducer.mark_ready(e);
  reducer.finish();
  return rank.read(grads);
}

TEST(GradientReducer, ReducesToTheMeanOverDataParallelRanks) {
  for (int dp : {2, 4})
    for (bool dist_opt : {false, true}) {
      SCOPED_TRACE("dp" + std::to_string(dp) + (dist_opt ? " dist-opt" : ""));
      const GradBufferLayout layout = test_layout(dp, dist_opt);
      ASSERT_GT(layout.buckets().size(), 2u);
      const std::vector<float> mean = mean_grads(layout, 0, dp, 0);
      run_grid(1, dp, [&](Rank& rank) {
        const int me = rank.comm.rank(CommGroup::kDataContext);
        const std::vector<float> reduced = reduce_once(rank, layout, {true, dist_opt});
        for (int b = 0; b < static_cast<int>(layout.buckets().size()); ++b) {
          const std::int64_t begin = dist_opt ? layout.shard_begin(b, me) : layout.buckets()[b].begin;
          const std::int64_t end = dist_opt ? begin + layout.shard_elements(b) : layout.buckets()[b].end;
          for (std::int64_t i = begin; i < end; ++i) ASSERT_EQ(reduced[i], mean[i]) << "element " << i;
        }
      });
    }
}

TEST(GradientReducer, OverlapOnAndOffGiveTheSameBits) {
  for (bool dist_opt : {false, true}) {
    const GradBufferLayout layout = test_layout(4, dist_opt);
    std::mutex mutex;
    std::vector<std::vector<float>> with(4), without(4);
    run_grid(1, 4, [&](Rank& rank) {
      std::vector<float> a = reduce_once(rank, layout, {true, dist_opt});
      std::vector<float> b = reduce_once(rank, layout, {false, dist_opt});
      std::lock_guard<std::mutex> lock(mutex);
      with[rank.comm.world_rank()] = std::move(a);
      without[rank.comm.world_rank()] = std::move(b);
    });
    for (int r = 0; r < 4; ++r)
      EXPECT_EQ(std::memcmp(with[r].data(), without[r].data(), sizeof(float) * with[r].size()), 0);
  }
}

TEST(GradientReducer, LaunchesABucketWhenItsLastGradientIsReady) {
  const GradBufferLayout layout = test_layout(2, true);
  run_grid(1, 2, [&](Rank& rank) {
    rank.backend.recorder().set_enabled(true);
    Tensor grads = rank.make(local_grads(layout, 0, rank.comm.rank(CommGroup::kDataContext), 0));
    GradientReducer reducer(rank.comm, layout, grads, {true, true});
    const GradBucketRange& first = layout.buckets()[0];
    for (int e = first.first_entry; e < first.end_entry; ++e) {
      EXPECT_FALSE(reducer.launched(0));
      reducer.mark_ready(e);
    }
    EXPECT_TRUE(reducer.launched(0));
    EXPECT_FALSE(reducer.launched(1));
    EXPECT_EQ(rank.backend.recorder().ops().size(), 2u);  // grad_scale, reduce-scatter of bucket 0
    EXPECT_THROW(reducer.mark_ready(first.first_entry), std::logic_error);
    reducer.finish();
    const std::vector<layouts::Op>& ops = rank.backend.recorder().ops();
    ASSERT_EQ(ops.size(), 2 * layout.buckets().size());
    for (std::size_t b = 0; b < layout.buckets().size(); ++b) {
      EXPECT_EQ(ops[2 * b].kind, OpKind::kElementwise);
      EXPECT_EQ(ops[2 * b].label, "grad_scale");
      const layouts::Op& op = ops[2 * b + 1];
      EXPECT_EQ(op.kind, OpKind::kReduceScatter);
      EXPECT_EQ(op.label, "grad_bucket");
      EXPECT_EQ(op.phase, OpPhase::kGradSync);
      EXPECT_EQ(op.group, CommGroup::kDataContext);
      EXPECT_EQ(op.group_size, 2);
      EXPECT_EQ(op.bytes, layout.buckets()[b].numel() * 4);
    }
  });
  const GradBufferLayout wrong = test_layout(4, false);
  run_grid(1, 2, [&](Rank& rank) {
    EXPECT_THROW(GradientReducer(rank.comm, wrong, rank.make(std::vector<float>(wrong.total_elements())), {}),
                 std::invalid_argument);
  });
}

AdamWHyper hyper_at(int step) {
  AdamWHyper h;
  h.lr = 1e-2f;
  h.weight_decay = 0.1f;
  h.step = step;
  h.max_grad_norm = 1.0f;  // the norms here are ~30: clipping is active
  return h;
}

// One rank's AdamW over the whole buffer from the mean gradients; returns the params after `steps` steps
// and the norm of each step.
std::vector<float> single_rank_adamw(const GradBufferLayout& layout, int tp_rank, int dp, int steps,
                                     std::vector<float>& norms) {
  CpuBackend backend;
  backend.reserve_arena(1 << 22);
  const std::int64_t n = layout.total_elements();
  Tensor params = backend.allocate(DType::kFP32, 1, n, "p"),
         grads = backend.allocate(DType::kFP32, 1, n, "g");
  Tensor m = backend.allocate(DType::kFP32, 1, n, "m"), v = backend.allocate(DType::kFP32, 1, n, "v");
  backend.upload(params, initial_params(layout, tp_rank).data());
  std::vector<OptimizerTensor> tensors;
  for (int e = 0; e < static_cast<int>(layout.entries().size()); ++e) {
    const std::int64_t at = layout.offset(e), len = layout.entries()[e].numel;
    tensors.push_back({flat_range(backend, params, at, len), flat_range(backend, grads, at, len),
                       flat_range(backend, m, at, len), flat_range(backend, v, at, len),
                       flat_range(backend, params, at, len), layout.entries()[e].weight_decay});
  }
  backend.prepare_optimizer(tensors);
  for (int s = 0; s < steps; ++s) {
    backend.upload(grads, mean_grads(layout, tp_rank, dp, s).data());
    norms.push_back(backend.grad_norm({}));
    backend.adamw_step(hyper_at(s + 1), {});
  }
  std::vector<float> out(n);
  backend.download(params, out.data());
  return out;
}

void expect_near_everywhere(const GradBufferLayout& layout, const std::vector<float>& got,
                            const std::vector<float>& want, float tolerance) {
  for (int e = 0; e < static_cast<int>(layout.entries().size()); ++e)
    for (std::int64_t i = layout.offset(e); i < layout.offset(e) + layout.entries()[e].numel; ++i)
      ASSERT_NEAR(got[i], want[i], tolerance) << layout.entries()[e].name << " element " << i;
}

// The strategy over one dense buffer laid out by `layout`.
std::unique_ptr<DataParallelStrategy> strategy_over(Rank& rank, const GradBufferLayout& layout, bool sharded,
                                                    Tensor grads, Tensor model_params, Tensor main_params) {
  DataParallelChunk chunk;
  chunk.dense_buffer = &layout;
  chunk.grads = grads;
  chunk.model_params = model_params;
  chunk.main_params = main_params;
  DataParallelOptions options;
  options.overlap_grad_reduce = true;
  return make_data_parallel_strategy(sharded, rank.comm, {chunk}, {}, options, /*sizing=*/false);
}

// One iteration's update after the gradients are in place: reduce, norm, AdamW, gather; returns the norm.
float reduce_and_step(DataParallelStrategy& strategy, int step) {
  strategy.finish_grad_reduction();
  const float norm = strategy.grad_norm();
  strategy.step(hyper_at(step));
  strategy.gather_all_params();
  return norm;
}

// Three training steps of a dp group: reduce, step; returns each rank's params and each step's norm.
// give_main_params: the model is fp32, its parameters are the main parameters.
void train_data_parallel(Rank& rank, const GradBufferLayout& layout, bool sharded, bool give_main_params,
                         std::vector<float>& params_out, std::vector<float>& norms) {
  const int dp_rank = rank.comm.rank(CommGroup::kDataContext), dp = rank.comm.size(CommGroup::kDataContext);
  const std::vector<float> init = initial_params(layout, 0);
  Tensor model_params = rank.make(init);
  Tensor grads = rank.make(std::vector<float>(layout.total_elements(), 0.0f));
  const auto strategy =
      strategy_over(rank, layout, sharded, grads, model_params, give_main_params ? model_params : Tensor{});
  strategy->set_main_parameters(0, init);
  if (sharded) {
    EXPECT_EQ(strategy->owned_elements(0) * dp, layout.total_elements());
  }
  for (int s = 0; s < 3; ++s) {
    rank.backend.upload(grads, scaled_local_grads(layout, 0, dp_rank, dp, s).data());
    norms.push_back(reduce_and_step(*strategy, s + 1));
  }
  params_out = rank.read(model_params);
  EXPECT_EQ(strategy->main_parameters(0), params_out);  // fp32: the gathered shards are the model's
}

TEST(DataParallelStrategy, StepsLikeOneRankOverTheWholeBuffer) {
  struct Case {
    int dp;
    bool sharded, give_main_params;
  };
  for (const Case c : {Case{2, true, false}, Case{3, true, false}, Case{4, true, false}, Case{6, true, false},
                       Case{4, true, true}, Case{2, false, true}, Case{3, false, true}}) {
    SCOPED_TRACE("dp" + std::to_string(c.dp) + (c.sharded ? " sharded" : " replicated") +
                 (c.give_main_params ? " with main params" : ""));
    const GradBufferLayout layout = test_layout(c.dp, c.sharded);
    std::vector<float> reference_norms;
    const std::vector<float> reference = single_rank_adamw(layout, 0, c.dp, 3, reference_norms);
    run_grid(1, c.dp, [&](Rank& rank) {
      std::vector<float> params, norms;
      train_data_parallel(rank, layout, c.sharded, c.give_main_params, params, norms);
      expect_near_everywhere(layout, params, reference, 1e-6f);
      for (int s = 0; s < 3; ++s) EXPECT_NEAR(norms[s], reference_norms[s], 1e-6f * reference_norms[s]);
    });
  }
}

TEST(DataParallelStrategy, ReplicatedNeedsTheWholeMainParameters) {
  const GradBufferLayout layout = test_layout(2, false);
  run_grid(1, 2, [&](Rank& rank) {
    Tensor params = rank.make(initial_params(layout, 0)), grads = rank.make(local_grads(layout, 0, 0, 0));
    EXPECT_THROW(strategy_over(rank, layout, false, grads, params, {}), std::invalid_argument);
  });
}

// bf16 model params (the CPU backend emulating bf16) over dp 3: the fp32 main parameters live in the
// shards only; the gathered params are the bf16 rounding of the fp32 master params, the same on every rank,
// and the gathered shards are the single rank's fp32 parameters.
TEST(DataParallelStrategy, DistributedOptimizerKeepsFp32ShardsAndGathersBf16Params) {
  constexpr int kDp = 3;
  const GradBufferLayout layout = test_layout(kDp, true);
  std::vector<float> reference_norms;
  const std::vector<float> reference = single_rank_adamw(layout, 0, kDp, 1, reference_norms);
  std::mutex mutex;
  std::vector<std::vector<float>> gathered(kDp), main(kDp);
  run_grid(
      1, kDp,
      [&](Rank& rank) {
        const int dp_rank = rank.comm.rank(CommGroup::kDataContext);
        Tensor grads = rank.make(scaled_local_grads(layout, 0, dp_rank, kDp, 0));
        Tensor params = rank.make(1, layout.total_elements(), {}, DType::kBF16);
        const auto strategy = strategy_over(rank, layout, true, grads, params, {});
        strategy->set_main_parameters(0, initial_params(layout, 0));
        reduce_and_step(*strategy, 1);
        std::vector<float> own = rank.read(params), whole = strategy->main_parameters(0);
        std::lock_guard<std::mutex> lock(mutex);
        gathered[dp_rank] = std::move(own);
        main[dp_rank] = std::move(whole);
      },
      /*bf16=*/true);
  for (int r = 1; r < kDp; ++r) EXPECT_EQ(gathered[r], gathered[0]);
  std::vector<float> rounded = reference;
  reference::round_to_bf16_inplace(rounded.data(), static_cast<std::int64_t>(rounded.size()));
  expect_near_everywhere(layout, gathered[0], rounded, 1e-6f);
  for (int r = 0; r < kDp; ++r) expect_near_everywhere(layout, main[r], reference, 1e-6f);
}

TEST(DataParallelStrategy, RecordsNormReduceAdamWAndParamGathers) {
  const GradBufferLayout layout = test_layout(2, true);
  run_grid(1, 2, [&](Rank& rank) {
    Tensor params = rank.make(initial_params(layout, 0));
    Tensor grads = rank.make(local_grads(layout, 0, 0, 0));
    const auto strategy = strategy_over(rank, layout, true, grads, params, params);
    strategy->set_main_parameters(0, initial_params(layout, 0));
    rank.backend.recorder().set_enabled(true);
    strategy->grad_norm();
    strategy->step(hyper_at(1));
    strategy->gather_all_params();
    const std::vector<layouts::Op>& ops = rank.backend.recorder().ops();
    ASSERT_EQ(ops.size(), 3 + layout.buckets().size());
    EXPECT_EQ(ops[0].kind, OpKind::kGradNorm);
    EXPECT_EQ(ops[1].kind, OpKind::kAllReduce);
    EXPECT_EQ(ops[1].label, "grad_norm_ar");
    EXPECT_EQ(ops[1].group, CommGroup::kWorld);
    EXPECT_EQ(ops[1].bytes, 4);
    EXPECT_EQ(ops[2].kind, OpKind::kOptimizer);
    for (std::size_t b = 0; b < layout.buckets().size(); ++b) {
      const layouts::Op& op = ops[3 + b];
      EXPECT_EQ(op.kind, OpKind::kAllGather);
      EXPECT_EQ(op.label, "param_ag");
      EXPECT_EQ(op.phase, OpPhase::kOptimizer);
      EXPECT_EQ(op.group, CommGroup::kDataContext);
      EXPECT_EQ(op.bytes, layout.buckets()[b].numel() * 4);  // fp32 model params here
    }
  });
}

// Under tp2 x dp2 the global norm counts TP-sharded gradients on both TP ranks and TP-replicated ones once.
TEST(DataParallelStrategy, GlobalGradNormCountsEveryElementOnce) {
  for (bool sharded : {true, false}) {
    const GradBufferLayout layout = test_layout(2, sharded);
    double sum_of_squares = 0.0;
    for (int tp_rank = 0; tp_rank < 2; ++tp_rank) {
      const std::vector<float> mean = mean_grads(layout, tp_rank, 2, 0);
      for (int e = 0; e < static_cast<int>(layout.entries().size()); ++e) {
        if (tp_rank == 1 && layout.entries()[e].tensor_parallel_duplicate) continue;
        for (std::int64_t i = 0; i < layout.entries()[e].numel; ++i)
          sum_of_squares += double(mean[layout.offset(e) + i]) * mean[layout.offset(e) + i];
      }
    }
    const double expected = std::sqrt(sum_of_squares);
    run_grid(2, 2, [&](Rank& rank) {
      const int tp_rank = rank.comm.rank(CommGroup::kTensor),
                dp_rank = rank.comm.rank(CommGroup::kDataContext);
      Tensor params = rank.make(initial_params(layout, tp_rank));
      Tensor grads = rank.make(scaled_local_grads(layout, tp_rank, dp_rank, 2, 0));
      const auto strategy = strategy_over(rank, layout, sharded, grads, params, params);
      strategy->finish_grad_reduction();
      const float norm = strategy->grad_norm();
      EXPECT_NEAR(norm, expected, 1e-6 * expected);
    });
  }
}

TEST(DataParallelStrategy, ANonFiniteGradientOnOneRankGivesEveryRankANonFiniteNorm) {
  const GradBufferLayout layout = test_layout(4, true);
  run_grid(1, 4, [&](Rank& rank) {
    const int dp_rank = rank.comm.rank(CommGroup::kDataContext);
    std::vector<float> g = local_grads(layout, 0, dp_rank, 0);
    if (dp_rank == 2) g[layout.offset(3) + 5] = std::numeric_limits<float>::infinity();
    Tensor params = rank.make(initial_params(layout, 0)), grads = rank.make(g);
    const auto strategy = strategy_over(rank, layout, true, grads, params, {});
    strategy->finish_grad_reduction();
    EXPECT_FALSE(std::isfinite(strategy->grad_norm()));
  });
}

// A data-parallel group of 2 seen from its rank 0 whose all-gathers complete only when waited, as on a GPU:
// each wait logs the element its output starts at. Nothing else moves.
class DeferringCommunicator final : public Communicator {
 public:
  DeferringCommunicator(Backend& backend, const void* base, std::vector<std::int64_t>& waited)
      : Communicator(backend), base_(static_cast<const char*>(base)), waited_(waited) {}
  int world_rank() const override { return 0; }
  int world_size() const override { return 2; }
  int rank(CommGroup) const override { return 0; }
  int size(CommGroup group) const override {
    return group == CommGroup::kDataContext || group == CommGroup::kWorld ? 2 : 1;
  }
  int global_rank(CommGroup, int rank_in_group) const override { return rank_in_group; }
  void abort(const std::string& message) override { throw std::runtime_error(message); }

 protected:
  class Gather final : public CommWork {
   public:
    Gather(std::vector<std::int64_t>& log, std::int64_t at) : log_(log), at_(at) {}
    void wait() override {
      if (!done_) log_.push_back(at_);
      done_ = true;
    }

   private:
    std::vector<std::int64_t>& log_;
    std::int64_t at_;
    bool done_ = false;
  };
  CommHandle do_all_reduce(CommGroup, Tensor, ReduceOp) override { return nullptr; }
  CommHandle do_all_gather(CommGroup, Tensor, Tensor output) override {
    return std::make_unique<Gather>(waited_, (static_cast<const char*>(output.data) - base_) / 4);
  }
  CommHandle do_reduce_scatter(CommGroup, Tensor, Tensor) override { return nullptr; }
  CommHandle do_broadcast(CommGroup, Tensor, int) override { return nullptr; }
  CommHandle do_all_to_all(CommGroup, Tensor, const std::vector<std::int64_t>&, Tensor,
                           const std::vector<std::int64_t>&) override {
    return nullptr;
  }
  CommHandle do_batch_p2p(CommGroup, const std::vector<P2pTransferArgs>&) override {
    throw std::logic_error("no p2p here");
  }

 private:
  const char* base_;
  std::vector<std::int64_t>& waited_;
};

// --overlap-param-gather: the gathers launched after the step are waited bucket by bucket where the forward
// first reads them (the forward reads the buffer back to front); without it, at once.
TEST(DataParallelStrategy, OverlappedParamGathersAreWaitedInTheForwardPreHookOfTheirBucket) {
  const GradBufferLayout layout = test_layout(2, true);
  const int buckets = static_cast<int>(layout.buckets().size());
  ASSERT_GT(buckets, 2);
  for (const bool overlap : {true, false}) {
    SCOPED_TRACE(overlap ? "overlap" : "no overlap");
    CpuBackend backend;
    backend.reserve_arena(1 << 20);
    const Tensor params = backend.allocate(DType::kFP32, 1, layout.total_elements(), "params");
    const Tensor grads = backend.allocate(DType::kFP32, 1, layout.total_elements(), "grads");
    backend.fill_zero(grads);
    std::vector<std::int64_t> waited;
    DeferringCommunicator comm(backend, params.data, waited);
    DataParallelChunk chunk;
    chunk.dense_buffer = &layout;
    chunk.grads = grads;
    chunk.model_params = chunk.main_params = params;
    DataParallelOptions options;
    options.overlap_param_gather = overlap;
    const auto strategy = make_data_parallel_strategy(true, comm, {chunk}, {}, options, false);
    strategy->set_main_parameters(0, initial_params(layout, 0));
    reduce_and_step(*strategy, 1);
    if (!overlap) {
      EXPECT_EQ(static_cast<int>(waited.size()), buckets);
      continue;
    }
    EXPECT_TRUE(waited.empty());
    const int last_group = layout.entries().back().group;  // the forward's first parameters
    strategy->before_forward(0, last_group);
    ASSERT_EQ(waited.size(), 1u);
    EXPECT_EQ(waited[0], layout.buckets().back().begin);
    strategy->before_forward(0, last_group);  // nothing left for it
    EXPECT_EQ(waited.size(), 1u);
    strategy->before_forward(0, layout.entries().front().group);  // the first bucket: every other one
    EXPECT_EQ(static_cast<int>(waited.size()), buckets);
    strategy->wait_params();
    EXPECT_EQ(static_cast<int>(waited.size()), buckets);
  }
}

}  // namespace
}  // namespace megatune::executor
