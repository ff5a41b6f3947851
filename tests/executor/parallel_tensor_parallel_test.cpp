// Tensor-parallel linears (executor/parallel/tensor_parallel.h): the parallelism read from the parameter
// table's split; a column-parallel fc1 feeding a row-parallel fc2 (biases included) on two thread ranks,
// with and without sequence parallelism, reproduces the unsplit pair on one rank (outputs, input gradient,
// weight and bias gradients) and issues its GEMMs and collectives in Megatron's order under its labels;
// the experts' grouped linears zero an expert without rows on the iteration's first write.
#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <vector>

#include "executor/cpu/cpu_backend.h"
#include "executor/parallel/tensor_parallel.h"
#include "layouts/parameter_table.h"
#include "layouts/rank_grid.h"
#include "layouts/rank_shape.h"
#include "tests/executor/thread_rank_test_util.h"

namespace megatune::executor {
namespace {

using layouts::OpPhase;
using layouts::TensorParallelSplit;

constexpr std::int64_t kTokens = 4, kHidden = 3, kFfn = 4;

// A (rows, cols) row-major matrix of distinct small values.
std::vector<float> matrix(std::int64_t rows, std::int64_t cols, float seed) {
  std::vector<float> m(rows * cols);
  for (std::int64_t i = 0; i < rows * cols; ++i)
    m[i] = seed + 0.01f * static_cast<float>((i * 7) % 23) - 0.1f;
  return m;
}

// c (m, n) = a (m, k) . b^T where b is (n, k), plus bias (n) when given.
std::vector<float> times_transposed(const std::vector<float>& a, const std::vector<float>& b, std::int64_t m,
                                    std::int64_t n, std::int64_t k, const std::vector<float>& bias = {}) {
  std::vector<float> c(m * n, 0.0f);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      float sum = bias.empty() ? 0.0f : bias[j];
      for (std::int64_t p = 0; p < k; ++p) sum += a[i * k + p] * b[j * k + p];
      c[i * n + j] = sum;
    }
  return c;
}

std::vector<float> transposed(const std::vector<float>& a, std::int64_t rows, std::int64_t cols) {
  std::vector<float> t(a.size());
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j) t[j * rows + i] = a[i * cols + j];
  return t;
}

std::vector<float> column_sums(const std::vector<float>& a, std::int64_t rows, std::int64_t cols) {
  std::vector<float> s(cols, 0.0f);
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j) s[j] += a[i * cols + j];
  return s;
}

std::vector<float> block(const std::vector<float>& a, std::int64_t cols, std::int64_t first_row,
                         std::int64_t rows, std::int64_t first_col, std::int64_t width) {
  std::vector<float> b;
  for (std::int64_t i = first_row; i < first_row + rows; ++i)
    for (std::int64_t j = first_col; j < first_col + width; ++j) b.push_back(a[i * cols + j]);
  return b;
}

void expect_near(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], 1e-5f) << what << " [" << i << "]";
}

layouts::ParameterSpec spec(const char* name, TensorParallelSplit split) {
  layouts::ParameterSpec s;
  s.name = name;
  s.split = split;
  return s;
}

// The unsplit pair y = fc2(fc1(x)) and its backward from dy.
struct Reference {
  std::vector<float> x = matrix(kTokens, kHidden, 0.3f), w1 = matrix(kFfn, kHidden, -0.2f),
                     b1 = matrix(1, kFfn, 0.05f), w2 = matrix(kHidden, kFfn, 0.1f),
                     b2 = matrix(1, kHidden, -0.4f), dy = matrix(kTokens, kHidden, 0.7f);
  std::vector<float> z = times_transposed(x, w1, kTokens, kFfn, kHidden, b1);
  std::vector<float> y = times_transposed(z, w2, kTokens, kHidden, kFfn, b2);
  std::vector<float> dz = times_transposed(dy, transposed(w2, kHidden, kFfn), kTokens, kFfn, kHidden);
  std::vector<float> dx = times_transposed(dz, transposed(w1, kFfn, kHidden), kTokens, kHidden, kFfn);
  std::vector<float> dw2 = times_transposed(transposed(dy, kTokens, kHidden), transposed(z, kTokens, kFfn),
                                            kHidden, kFfn, kTokens);
  std::vector<float> dw1 = times_transposed(transposed(dz, kTokens, kFfn), transposed(x, kTokens, kHidden),
                                            kFfn, kHidden, kTokens);
  std::vector<float> db1 = column_sums(dz, kTokens, kFfn), db2 = column_sums(dy, kTokens, kHidden);
};

TEST(TensorParallelLinear, ParallelismIsTheParameterTablesSplit) {
  layouts::RankShape shape;
  shape.num_layers = 1;
  shape.hidden = 8;
  shape.heads = shape.groups = 2;
  shape.head_dim = 4;
  shape.ffn = 16;
  shape.vocab_padded = 32;
  shape.max_positions = 16;
  shape.tp = 2;
  int linears = 0;
  for (const layouts::ParameterSpec& p : layouts::stage_parameter_table(shape, {})) {
    const bool weight = p.name.size() > 7 && p.name.compare(p.name.size() - 7, 7, ".weight") == 0;
    if (!p.gemm_weight || !weight) continue;
    SCOPED_TRACE(p.name);
    const bool column = p.name.find("linear_qkv") != std::string::npos ||
                        p.name.find("linear_fc1") != std::string::npos ||
                        p.name.find("word_embeddings") != std::string::npos;
    EXPECT_EQ(linear_parallelism(p), column ? LinearParallelism::kColumn : LinearParallelism::kRow);
    ++linears;
  }
  EXPECT_EQ(linears, 5);  // qkv, proj, fc1, fc2, the tied LM head
  EXPECT_EQ(linear_parallelism(spec("router", TensorParallelSplit::kReplicated)),
            LinearParallelism::kReplicated);
}

// fc1 (column) then fc2 (row) on TP rank `rank` of `tp`; returns the labels of the ops it issued.
std::vector<std::string> run_pair(TestRank& r, const Reference& ref, int rank, int tp, bool sp) {
  const std::int64_t f = kFfn / tp, rows = sp ? kTokens / tp : kTokens, first = sp ? rank * rows : 0;
  const TensorParallelRegions regions(r.backend, r.comm, sp);
  LinearParameters p1{r.make(f, kHidden, block(ref.w1, kHidden, rank * f, f, 0, kHidden)),
                      r.make(1, f, block(ref.b1, kFfn, 0, 1, rank * f, f)), r.make(f, kHidden, {}),
                      r.make(1, f, {})};
  LinearParameters p2{r.make(kHidden, f, block(ref.w2, kFfn, 0, kHidden, rank * f, f)),
                      r.make(1, kHidden, ref.b2), r.make(kHidden, f, {}), r.make(1, kHidden, {})};
  const TensorParallelLinear fc1(spec("fc1.weight", TensorParallelSplit::kRows), p1, {"fc1"}, 0, regions);
  const TensorParallelLinear fc2(spec("fc2.weight", TensorParallelSplit::kColumns), p2, {"fc2"}, 0, regions);
  const Tensor x = r.make(rows, kHidden, block(ref.x, kHidden, first, rows, 0, kHidden));
  const Tensor x_full = r.make(kTokens, kHidden, {}), z = r.make(kTokens, f, {});
  const Tensor y_partial = r.make(kTokens, kHidden, {}), y_shard = r.make(rows, kHidden, {});
  r.backend.recorder().set_enabled(true);
  const Tensor y = fc2.forward(fc1.forward(x, x_full, z, {}, OpPhase::kForward), {}, y_partial, y_shard,
                               OpPhase::kForward);
  const Tensor dy = r.make(rows, kHidden, block(ref.dy, kHidden, first, rows, 0, kHidden));
  const Tensor dy_full = r.make(kTokens, kHidden, {}), dz = r.make(kTokens, f, {});
  const Tensor dx_full = r.make(kTokens, kHidden, {}), dx_shard = r.make(rows, kHidden, {});
  fc2.backward({.dy = dy, .dy_full = dy_full, .x = z, .dx = dz}, false);
  const Tensor dx =
      fc1.backward({.dy = dz, .x = x, .x_full = x_full, .dx = dx_full, .dx_shard = dx_shard}, false);
  expect_near(r.read(y), block(ref.y, kHidden, first, rows, 0, kHidden), "output");
  expect_near(r.read(dx), block(ref.dx, kHidden, first, rows, 0, kHidden), "input gradient");
  expect_near(r.read(p1.d_weight), block(ref.dw1, kHidden, rank * f, f, 0, kHidden), "fc1 weight gradient");
  expect_near(r.read(p1.d_bias), block(ref.db1, kFfn, 0, 1, rank * f, f), "fc1 bias gradient");
  expect_near(r.read(p2.d_weight), block(ref.dw2, kFfn, 0, kHidden, rank * f, f), "fc2 weight gradient");
  expect_near(r.read(p2.d_bias), ref.db2, "fc2 bias gradient");
  std::vector<std::string> labels;
  for (const layouts::Op& op : r.backend.recorder().ops()) labels.push_back(op.label);
  return labels;
}

TEST(TensorParallelLinear, ColumnThenRowParallelReproducesTheUnsplitPair) {
  const Reference ref;
  using Labels = std::vector<std::string>;
  const Labels tp1 = {"fc1", "fc2", "fc2_dgrad", "fc2_wgrad", "fc1_dgrad", "fc1_wgrad"};
  const Labels tp2 = {"fc1",       "fc2",       "fc2_ar",    "fc2_dgrad",
                      "fc2_wgrad", "fc1_dgrad", "fc1_wgrad", "fc1_dgrad_ar"};
  const Labels tp2_sp = {"fc1_input_ag", "fc1",          "fc2",       "fc2_rs",    "fc2_grad_ag", "fc2_dgrad",
                         "fc2_wgrad",    "fc1_input_ag", "fc1_dgrad", "fc1_wgrad", "fc1_dgrad_rs"};
  struct Case {
    int tp;
    bool sp;
    Labels want;
  };
  for (const auto& [tp, sp, want] : {Case{1, false, tp1}, Case{2, false, tp2}, Case{2, true, tp2_sp}}) {
    SCOPED_TRACE("tp " + std::to_string(tp) + (sp ? " sp" : ""));
    std::mutex mutex;
    std::vector<Labels> issued(tp);
    run_thread_ranks(tp, [&](int rank, ThreadWorld& world) {
      TestRank r(layouts::RankGrid(tp, tp, 1, 1, 1, 1), rank, world);
      const Labels labels = run_pair(r, ref, rank, tp, sp);
      std::lock_guard<std::mutex> lock(mutex);
      issued[rank] = labels;
    });
    for (const Labels& labels : issued) EXPECT_EQ(labels, want);
  }
}

TEST(ExpertLinears, AnExpertWithoutRowsIsZeroedOnTheFirstWriteOnly) {
  CpuBackend backend;
  backend.reserve_arena(1 << 16);
  auto make = [&](std::int64_t rows, std::int64_t cols, float value) {
    Tensor t = backend.allocate(DType::kFP32, rows, cols, "test");
    const std::vector<float> v(rows * cols, value);
    backend.upload(t, v.data());
    return t;
  };
  std::vector<LinearParameters> experts;
  for (int e = 0; e < 2; ++e) experts.push_back({make(2, 3, 0.5f), {}, make(2, 3, 1.0f), {}});
  const ExpertLinears fc1(experts, "expert_fc1", 0, backend);
  const Tensor x = make(3, 3, 1.0f), dy = make(3, 2, 1.0f);
  const std::vector<std::int64_t> offsets = {0, 3, 3};  // expert 1 got no rows
  backend.recorder().set_enabled(true);
  fc1.weight_grad(dy, x, offsets, /*accumulate=*/true);
  std::vector<float> g(6);
  backend.download(experts[1].d_weight, g.data());
  EXPECT_EQ(g, std::vector<float>(6, 1.0f));
  fc1.weight_grad(dy, x, offsets, /*accumulate=*/false);
  backend.download(experts[1].d_weight, g.data());
  EXPECT_EQ(g, std::vector<float>(6, 0.0f));
  backend.download(experts[0].d_weight, g.data());
  EXPECT_EQ(g, std::vector<float>(6, 3.0f));                       // three rows of ones, overwritten
  fc1.forward(x, make(3, 2, 0.0f), {0, 0, 0}, OpPhase::kForward);  // no rows: no GEMM
  ASSERT_EQ(backend.recorder().ops().size(), 2u);
  EXPECT_EQ(backend.recorder().ops()[0].label, "expert_fc1_wgrad");
  EXPECT_THROW(fc1.forward(x, x, {0, 3}, OpPhase::kForward), std::logic_error);
}

}  // namespace
}  // namespace megatune::executor
