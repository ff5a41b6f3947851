// Megatron's memory model under FP8 (--memory-model megatron): the FP8 weight copies and transposes of the
// dense linears (1 B each per weight) and the shared input and output-gradient casts with their transposes,
// as one item counted in the total; none without FP8, and the weights split by tensor parallelism.
#include <gtest/gtest.h>

#include "planner/memory_model.h"

namespace megatune::planner {
namespace {

std::int64_t fp8_item_bytes(const MemoryEstimate& e) {
  for (const MemoryItem& item : e.items)
    if (item.name == "FP8 weight copies + casts") return item.bytes;
  return -1;
}

TEST(Fp8Memory, WeightCopiesAndCastBuffersOfTheDenseLinears) {
  const layouts::ModelSpec model = layouts::model_preset("gpt-1.3b");
  layouts::ParallelConfig config;
  config.micro_batch_size = 4;
  config.validate(model);
  MemoryOptions bf16;
  MemoryOptions fp8 = bf16;
  fp8.step.fp8.format = layouts::Fp8Format::kHybrid;
  const MemoryEstimate plain = estimate_memory(model, config, 0, bf16);
  const MemoryEstimate with_fp8 = estimate_memory(model, config, 0, fp8);
  EXPECT_EQ(fp8_item_bytes(plain), -1);
  const std::int64_t h = model.hidden_size, ffn = model.ffn_size(), tokens = 4LL * model.seq_length;
  // qkv 3h x h, proj h x h, fc1 4h x h, fc2 h x 4h per layer, copy and transpose; the widest input (fc2's
  // ffn) and output-gradient (fc1's ffn) casts with their transposes.
  const std::int64_t expected =
      2 * model.num_layers * (3 * h * h + h * h + 2 * ffn * h) + 2 * tokens * (ffn + ffn);
  EXPECT_EQ(fp8_item_bytes(with_fp8), expected);
  EXPECT_NEAR(double(expected) / (1 << 30), 2.50, 0.01);  // the executor's FP8 arena items for this layout
  EXPECT_GT(with_fp8.total_bytes - plain.total_bytes, expected);  // plus the allocator margin on it

  config.world_size = config.tensor_model_parallel_size = 2;
  config.validate(model);
  const std::int64_t tp2 = fp8_item_bytes(estimate_memory(model, config, 0, fp8));
  EXPECT_EQ(tp2, expected / 2);  // the weights and the widest (column/row-split) casts both halve
}

}  // namespace
}  // namespace megatune::planner
