// The step program under partial full recomputation: only the plan's layers issue recompute-forward ops,
// one span per unit right before the backward of its last layer, and the norm recomputes follow.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "layouts/step_program.h"

namespace megatune::layouts {
namespace {

ModelSpec tiny(int layers) {
  ModelSpec m = model_preset("tiny");
  m.num_layers = layers;
  return m;
}

ParallelConfig full_recompute(RecomputeMethod method, int n, int pp = 1) {
  ParallelConfig c;
  c.world_size = pp;
  c.pipeline_model_parallel_size = pp;
  c.global_batch_size = 2 * pp;
  c.recompute_granularity = RecomputeGranularity::kFull;
  c.recompute_method = method;
  c.recompute_num_layers = n;
  return c;
}

// The GEMMs of microbatch 0's decoder layers in recompute and backward, one token per run of one (phase,
// layer): "R4 R5 B5 B4" is a unit {4, 5} re-run before the backward of 5 and 4.
std::string recompute_trace(const std::vector<Op>& ops, int chunk = 0) {
  std::string out;
  int last_layer = -100;
  OpPhase last_phase = OpPhase::kForward;
  for (const Op& op : ops) {
    if (op.kind != OpKind::kGemm || op.microbatch != 0 || op.chunk != chunk || op.layer < 0) continue;
    if (op.phase != OpPhase::kRecompute && op.phase != OpPhase::kBackward) continue;
    if (op.layer == last_layer && op.phase == last_phase) continue;
    last_layer = op.layer;
    last_phase = op.phase;
    if (!out.empty()) out += ' ';
    out += op.phase == OpPhase::kRecompute ? 'R' : 'B';
    out += std::to_string(op.layer);
  }
  return out;
}

// The input norm's recomputes of `layer` (microbatch 0): the unit's re-run and the backward's own.
int input_norm_recomputes(const std::vector<Op>& ops, int layer) {
  int n = 0;
  for (const Op& op : ops)
    n += op.kind == OpKind::kNorm && op.phase == OpPhase::kRecompute && op.layer == layer &&
         op.microbatch == 0 && op.label == "input_norm";
  return n;
}

std::vector<Op> program(const ModelSpec& model, const ParallelConfig& config, int rank = 0) {
  config.validate(model);
  return build_step_program(model, config, rank).ops;
}

TEST(RecomputeStepProgram, UniformOneRecomputesEachLayerBeforeItsBackward) {
  const std::vector<Op> ops = program(tiny(3), full_recompute(RecomputeMethod::kUniform, 1));
  EXPECT_EQ(recompute_trace(ops), "R2 B2 R1 B1 R0 B0");
}

TEST(RecomputeStepProgram, UniformGroupsReRunTheUnitBeforeItsLastLayer) {
  const ModelSpec model = tiny(6);
  const std::vector<Op> two = program(model, full_recompute(RecomputeMethod::kUniform, 2));
  EXPECT_EQ(recompute_trace(two), "R4 R5 B5 B4 R2 R3 B3 B2 R0 R1 B1 B0");
  // The re-run leaves the last layer's norm outputs fresh; the inner layer recomputes them again.
  EXPECT_EQ(input_norm_recomputes(two, 5), 1);
  EXPECT_EQ(input_norm_recomputes(two, 4), 2);
  // 5 layers in units of 3: {0,1,2}, {3,4}.
  const std::vector<Op> three = program(tiny(5), full_recompute(RecomputeMethod::kUniform, 3));
  EXPECT_EQ(recompute_trace(three), "R3 R4 B4 B3 R0 R1 R2 B2 B1 B0");
  // Every layer is re-run once per microbatch: as many recompute GEMMs as uniform 1.
  const auto gemms = [](const std::vector<Op>& ops) {
    int n = 0;
    for (const Op& op : ops) n += op.kind == OpKind::kGemm && op.phase == OpPhase::kRecompute;
    return n;
  };
  EXPECT_EQ(gemms(two), gemms(program(model, full_recompute(RecomputeMethod::kUniform, 1))));
}

TEST(RecomputeStepProgram, BlockRecomputesOnlyTheFirstLayers) {
  const ModelSpec model = tiny(6);
  const std::vector<Op> block = program(model, full_recompute(RecomputeMethod::kBlock, 2));
  EXPECT_EQ(recompute_trace(block), "B5 B4 B3 B2 R1 B1 R0 B0");
  EXPECT_EQ(input_norm_recomputes(block, 5), 1);  // a kept layer: its norm output, as without recompute
  EXPECT_EQ(input_norm_recomputes(block, 1), 1);  // the re-run's
  // Block N >= the chunk's layers: every layer.
  EXPECT_EQ(recompute_trace(program(model, full_recompute(RecomputeMethod::kBlock, 6))),
            "R5 B5 R4 B4 R3 B3 R2 B2 R1 B1 R0 B0");
}

TEST(RecomputeStepProgram, PipelineRanksPlanTheirOwnLayers) {
  const ModelSpec model = tiny(6);
  const ParallelConfig config = full_recompute(RecomputeMethod::kUniform, 2, /*pp=*/2);
  EXPECT_EQ(recompute_trace(program(model, config, 0)), "R2 B2 R0 R1 B1 B0");
  EXPECT_EQ(recompute_trace(program(model, config, 1)), "R5 B5 R3 R4 B4 B3");
}

// VPP: "Ett|tt|tt|ttL" on pp 2: rank 0 holds layers 0,1 (chunk 0) and 4,5 (chunk 1); block 1 recomputes the
// first layer of each chunk.
TEST(RecomputeStepProgram, BlockAppliesPerVirtualChunk) {
  const ModelSpec model = tiny(8);
  ParallelConfig config = full_recompute(RecomputeMethod::kBlock, 1, /*pp=*/2);
  config.pipeline_model_parallel_layout = "Ett|tt|tt|ttL";
  config.overlap_p2p_comm = true;
  const std::vector<Op> ops = program(model, config, 0);
  EXPECT_EQ(recompute_trace(ops, 0), "B1 R0 B0");
  EXPECT_EQ(recompute_trace(ops, 1), "B5 R4 B4");
}

}  // namespace
}  // namespace megatune::layouts
