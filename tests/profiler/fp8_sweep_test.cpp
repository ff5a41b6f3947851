// The profiling sweep of FP8 step programs (profile's FP8 flags): the linears' GEMMs as FP8 items (every
// variant, each shape of the FP8 program), their casts as FP8 memory-bound items whose bytes, copies and
// scaling reproduce layouts::fp8_cast_bytes, keyed apart from the bf16 element-wise rows; the LM head stays
// bf16, and a bf16 sweep has no FP8 item.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <tuple>

#include "layouts/fp8.h"
#include "layouts/step_program.h"
#include "profiler/sweep_builder.h"

namespace megatune::profiler {
namespace {

using layouts::DType;

SweepCandidates one_gpu(layouts::Fp8Recipe recipe, bool fp8) {
  SweepCandidates candidates;
  candidates.tensor_parallel = {1};
  candidates.context_parallel = {1};
  candidates.micro_batch = {2};
  if (fp8) {
    candidates.fp8.format = layouts::Fp8Format::kHybrid;
    candidates.fp8.recipe = recipe;
  }
  return candidates;
}

TEST(Fp8Sweep, ListsEveryFp8GemmAndCastOfTheFp8StepProgram) {
  const layouts::ModelSpec model = layouts::model_preset("llama3-1b");
  const SweepCandidates candidates = one_gpu(layouts::Fp8Recipe::kDelayed, true);
  const Sweep sweep = model_sweep(model, candidates);
  layouts::ParallelConfig config;
  config.micro_batch_size = 2;
  config.validate(model);
  layouts::StepProgramOptions options;
  options.fp8 = candidates.fp8;
  const layouts::StepProgram program = layouts::build_step_program(model, config, 0, options);
  std::set<std::tuple<std::int64_t, std::int64_t, std::int64_t, DType>> program_gemms, swept_gemms;
  std::set<std::int64_t> program_casts, swept_casts;
  for (const layouts::Op& op : program.ops) {
    if (op.kind == layouts::OpKind::kGemm) program_gemms.insert({op.m, op.n, op.k, op.dtype});
    if (op.kind == layouts::OpKind::kElementwise && op.dtype == DType::kFP8) program_casts.insert(op.bytes);
  }
  for (const GemmItem& g : sweep.gemms) swept_gemms.insert({g.m, g.n, g.k, g.dtype});
  for (const MemoryBoundItem& m : sweep.memory_bound) {
    if (!m.is_fp8_cast()) continue;
    swept_casts.insert(m.bytes);
    EXPECT_EQ(m.kind, layouts::OpKind::kElementwise);
    EXPECT_EQ(kernel_timing_key(m).dtype, "fp8");
    EXPECT_EQ(kernel_timing_key(m).op_kind, "elementwise");
    // The item's copies and scaling give back its bytes, so the runner casts what the program prices.
    EXPECT_EQ(layouts::fp8_cast_bytes(m.cast_elements(), m.cast_outputs, m.cast_current_scaling), m.bytes)
        << describe(m);
  }
  EXPECT_EQ(swept_gemms, program_gemms);
  EXPECT_EQ(swept_casts, program_casts);
  ASSERT_FALSE(program_casts.empty());

  const std::int64_t tokens = 2LL * model.seq_length, h = model.hidden_size;
  const std::int64_t qkv = (model.num_attention_heads + 2 * model.query_groups()) * model.head_dim();
  int fp8_variants = 0;
  for (const GemmItem& g : sweep.gemms) {
    if (g.m == tokens && g.n == qkv && g.k == h) EXPECT_EQ(g.dtype, DType::kFP8);              // qkv forward
    if (g.n == model.vocab_size || g.m == model.vocab_size) EXPECT_EQ(g.dtype, DType::kBF16);  // LM head
    if (g.dtype == DType::kFP8) fp8_variants |= 1 << static_cast<int>(g.variant);
  }
  EXPECT_EQ(fp8_variants, 7);  // forward, data and weight gradients
  // Delayed scaling: the input casts take one pass (1 copy), the transposed input's cast always two.
  bool delayed_input = false, current_transposed = false, two_copies = false;
  for (const MemoryBoundItem& m : sweep.memory_bound) {
    if (!m.is_fp8_cast()) continue;
    delayed_input |= m.cast_outputs == 1 && !m.cast_current_scaling && m.cast_elements() == tokens * h;
    current_transposed |= m.cast_outputs == 1 && m.cast_current_scaling;
    two_copies |= m.cast_outputs == 2;
  }
  EXPECT_TRUE(delayed_input && current_transposed && two_copies);
}

TEST(Fp8Sweep, TensorwiseCastsTakeTheAmaxPassAndBf16SweepsHaveNoFp8Items) {
  const layouts::ModelSpec model = layouts::model_preset("gpt-125m");
  const Sweep tensorwise = model_sweep(model, one_gpu(layouts::Fp8Recipe::kTensorwise, true));
  int casts = 0;
  for (const MemoryBoundItem& m : tensorwise.memory_bound)
    if (m.is_fp8_cast()) {
      ++casts;
      EXPECT_TRUE(m.cast_current_scaling) << describe(m);
    }
  EXPECT_GT(casts, 0);
  const Sweep bf16 = model_sweep(model, one_gpu(layouts::Fp8Recipe::kDelayed, false));
  for (const GemmItem& g : bf16.gemms) EXPECT_EQ(g.dtype, DType::kBF16);
  for (const MemoryBoundItem& m : bf16.memory_bound) EXPECT_FALSE(m.is_fp8_cast());
  EXPECT_LT(bf16.memory_bound.size(), tensorwise.memory_bound.size());
}

TEST(Fp8Sweep, LayoutsWhoseShapesFp8CannotTakeAreLeftOut) {
  // A layout train's FP8 refuses (24 tokens per micro-batch: not a multiple of 16) is counted invalid.
  layouts::ModelSpec model = layouts::model_preset("gpt-125m");
  SweepCandidates candidates = one_gpu(layouts::Fp8Recipe::kDelayed, true);
  candidates.micro_batch = {1};
  model.seq_length = 24;
  model.max_position_embeddings = std::max(model.max_position_embeddings, 24);
  ModelSweepReport report;
  const Sweep sweep = model_sweep(model, candidates, &report);
  EXPECT_EQ(report.layouts_expanded, 0);
  EXPECT_EQ(report.layouts_invalid, 1);
  EXPECT_TRUE(sweep.gemms.empty());
}

}  // namespace
}  // namespace megatune::profiler
