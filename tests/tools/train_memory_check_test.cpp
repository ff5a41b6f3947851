// `megatune train`'s free-memory check with the free memory injected: a model that does not fit is refused
// with the executor's predicted arena, the free memory and a layout that fits; one that fits passes.
#include "tools/train_memory_check.h"

#include <gtest/gtest.h>

#include "base/user_error.h"
#include "executor/backend/sizing_backend.h"

namespace megatune::tools {
namespace {

std::unique_ptr<executor::Backend> sizing() { return std::make_unique<executor::SizingBackend>(); }

layouts::ParallelConfig one_gpu(int micro_batch, int global_batch) {
  layouts::ParallelConfig config;
  config.micro_batch_size = micro_batch;
  config.global_batch_size = global_batch;
  return config;
}

std::string refusal(const layouts::ModelSpec& model, const layouts::ParallelConfig& config,
                    DeviceMemory memory) {
  try {
    require_arena_fits(model, config, executor::TrainOptions{}, memory, sizing);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(TrainMemoryCheck, Llama8bOnOneH200IsRefusedBeforeAllocating) {
  const layouts::ModelSpec model = layouts::model_preset("llama3-8b");
  const layouts::ParallelConfig config = one_gpu(1, 8);
  const std::int64_t need = predicted_arena_bytes(model, config, executor::TrainOptions{}, sizing);
  EXPECT_GT(need, std::int64_t{139} << 30);  // bf16 weights + fp32 grads, main params and Adam: > 16 B/param
  const std::string message = refusal(model, config, {std::int64_t{139} << 30, std::int64_t{141} << 30});
  EXPECT_NE(message.find("llama3-8b"), std::string::npos) << message;
  EXPECT_NE(message.find("arena per GPU"), std::string::npos) << message;
  EXPECT_NE(message.find("139.00 GiB free of 141.00 GiB"), std::string::npos) << message;
  EXPECT_NE(message.find("it fits with --recompute-granularity full"), std::string::npos) << message;
  EXPECT_NE(message.find("GPUs with --tp"), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

TEST(TrainMemoryCheck, AdviceNamesTheRecomputationThatFits) {
  const layouts::ModelSpec model = layouts::model_preset("gpt-1.3b");
  const layouts::ParallelConfig config = one_gpu(4, 32);
  layouts::ParallelConfig full = config;
  full.recompute_granularity = layouts::RecomputeGranularity::kFull;
  full.recompute_method = layouts::RecomputeMethod::kUniform;
  full.recompute_num_layers = 1;
  const executor::TrainOptions options;
  const std::int64_t need = predicted_arena_bytes(model, config, options, sizing);
  const std::int64_t need_full = predicted_arena_bytes(model, full, options, sizing);
  ASSERT_LT(need_full, need);
  const std::int64_t free_bytes = (need + need_full) / 2 + kFixedWorkspaceAllowanceBytes;
  const std::string message = refusal(model, config, {free_bytes, 0});
  EXPECT_NE(message.find("it fits with --recompute-granularity"), std::string::npos) << message;
  EXPECT_EQ(refusal(model, config, {need + kFixedWorkspaceAllowanceBytes, 0}), "");  // exactly enough
}

TEST(TrainMemoryCheck, ASmallModelFits) {
  EXPECT_EQ(refusal(layouts::model_preset("tiny"), one_gpu(2, 8), {std::int64_t{1} << 30, 0}), "");
}

}  // namespace
}  // namespace megatune::tools
