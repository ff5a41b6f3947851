// A layout that does not fit the GPU's free memory is refused before allocation with the predicted need,
// the free memory and what would fit.
#include "planner/memory_fit.h"

#include <gtest/gtest.h>

#include "base/user_error.h"
#include "layouts/model_spec.h"

namespace megatune::planner {
namespace {

TEST(MemoryFit, Llama8bOnOneH200IsRefusedWithAdvice) {
  const layouts::ModelSpec model = layouts::model_preset("llama3-8b");
  layouts::ParallelConfig config;
  config.global_batch_size = 8;
  const std::int64_t h200 = 139LL << 30;
  try {
    require_fits_in_memory(model, config, h200, 141LL << 30);
    FAIL() << "llama3-8b with Adam does not fit one H200";
  } catch (const UserError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("needs about"), std::string::npos) << message;
    EXPECT_NE(message.find("free of"), std::string::npos) << message;
    EXPECT_NE(message.find("GPUs with --tp"), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos);
  }
}

TEST(MemoryFit, ASmallModelFits) {
  const layouts::ModelSpec model = layouts::model_preset("gpt-125m");
  layouts::ParallelConfig config;
  config.global_batch_size = 8;
  EXPECT_NO_THROW(require_fits_in_memory(model, config, 80LL << 30, 80LL << 30));
}

TEST(MemoryFit, RecomputationIsSuggestedWhenItIsEnough) {
  layouts::ModelSpec model = layouts::model_preset("gpt-125m");
  model.seq_length = 8192;
  model.max_position_embeddings = 8192;
  layouts::ParallelConfig config;
  config.micro_batch_size = 8;
  config.global_batch_size = 8;
  const std::int64_t need = peak_memory(model, config).total_bytes;
  layouts::ParallelConfig full = config;
  full.recompute_granularity = layouts::RecomputeGranularity::kFull;
  full.recompute_method = layouts::RecomputeMethod::kUniform;
  full.recompute_num_layers = 1;
  const std::int64_t with_full = peak_memory(model, full).total_bytes;
  ASSERT_LT(with_full, need);
  const std::string advice = fitting_alternatives(model, config, (need + with_full) / 2);
  EXPECT_NE(advice.find("--recompute-granularity"), std::string::npos) << advice;
}

}  // namespace
}  // namespace megatune::planner
