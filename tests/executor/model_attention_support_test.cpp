// GPTModel asks its backend whether the attention kernels take the model's attention shape (and, with
// --qk-layernorm, whether its norm kernels take rows of head_dim) when it is configured: an unsupported shape
// is one UserError line, before anything is allocated.
#include <gtest/gtest.h>

#include <string>

#include "base/user_error.h"
#include "executor/backend/sizing_backend.h"
#include "executor/cpu/cpu_backend.h"
#include "executor/model/gpt_model.h"
#include "executor/parallel/communicator.h"
#include "executor/training/arena_sizing.h"
#include "layouts/model_spec.h"
#include "layouts/parallel_config.h"

namespace megatune::executor {
namespace {

// The tiny preset (4 heads, 2 query groups) with --kv-channels 80 (or another head dim).
TransformerConfig tiny_with_head_dim(std::int64_t head_dim) {
  layouts::ModelSpec spec = layouts::model_preset("tiny");
  spec.kv_channels = head_dim;
  return transformer_config_from(spec, 1, 10000.0f, 1e-5f, 0.02f);
}

BatchShape tiny_batch() {
  BatchShape b;
  b.micro_batch = 1;
  b.seq = 8;
  return b;
}

// The rule of a backend whose kernels take head dims 64 and 128 only, as the CUDA backend's did.
std::string only_64_and_128(const AttentionShape& shape) {
  return shape.head_dim == 64 || shape.head_dim == 128 ? std::string()
                                                       : "head dim " + std::to_string(shape.head_dim);
}

TEST(ModelAttentionSupport, UnsupportedShapeIsRefusedBeforeAnyAllocation) {
  std::string seen_shape;
  SizingBackend backend(nullptr, [&](const AttentionShape& shape) {
    seen_shape = std::to_string(shape.seq_q) + "x" + std::to_string(shape.kv_len()) + " " +
                 std::to_string(shape.num_heads) + "/" + std::to_string(shape.num_kv_heads) + " d" +
                 std::to_string(shape.head_dim) + " stride " + std::to_string(shape.q_stride());
    return only_64_and_128(shape);
  });
  SingleRankCommunicator communicator{backend};
  backend.begin_sizing();
  try {
    GPTModel model(tiny_with_head_dim(80), tiny_batch(), RecomputeGranularity::kNone, DType::kBF16, backend,
                   communicator);
    FAIL() << "a head-dim-80 model was configured on a backend without head-dim-80 attention";
  } catch (const UserError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("--kv-channels 80"), std::string::npos) << what;
    EXPECT_NE(what.find("head dim 80"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << "one line: " << what;
  }
  EXPECT_TRUE(backend.arena_breakdown().empty()) << "nothing allocated before the refusal";
  // The model asked with its real attention call: packed qkv of 4 + 2 + 2 heads of 80.
  EXPECT_EQ(seen_shape, "8x8 4/2 d80 stride 640");
}

// --qk-layernorm on a backend whose norm kernels take widths that are multiples of 32 (the CUDA kernels':
// of 8): heads of 16 are refused in one line naming the flag and the head dim; without the flag the same
// model configures.
TEST(ModelAttentionSupport, QkLayernormHeadWidthTheNormsCannotTakeIsRefused) {
  const auto multiples_of_32 = [](std::int64_t width) {
    return width % 32 == 0 ? std::string() : "widths that are multiples of 32";
  };
  TransformerConfig config = tiny_with_head_dim(16);
  config.qk_layernorm = true;
  SizingBackend backend(nullptr, nullptr, multiples_of_32);
  SingleRankCommunicator communicator{backend};
  backend.begin_sizing();
  try {
    GPTModel model(config, tiny_batch(), RecomputeGranularity::kNone, DType::kBF16, backend, communicator);
    FAIL() << "heads of 16 were normalized on a backend without norms of width 16";
  } catch (const UserError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("--qk-layernorm", 0), 0u) << what;
    EXPECT_NE(what.find("heads of 16 (--kv-channels)"), std::string::npos) << what;
    EXPECT_NE(what.find("multiples of 32"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << "one line: " << what;
  }
  EXPECT_TRUE(backend.arena_breakdown().empty()) << "nothing allocated before the refusal";
  config.qk_layernorm = false;
  GPTModel plain(config, tiny_batch(), RecomputeGranularity::kNone, DType::kBF16, backend, communicator);
  EXPECT_FALSE(backend.arena_breakdown().empty());
}

TEST(ModelAttentionSupport, SupportedShapesConfigure) {
  const TransformerConfig config = tiny_with_head_dim(64);
  SizingBackend backend(nullptr, only_64_and_128);
  SingleRankCommunicator communicator{backend};
  backend.begin_sizing();
  GPTModel model(config, tiny_batch(), RecomputeGranularity::kNone, DType::kBF16, backend, communicator);
  EXPECT_FALSE(backend.arena_breakdown().empty());
  // The reference kernels of the CPU backend take every head dim.
  CpuBackend cpu;
  SingleRankCommunicator cpu_communicator{cpu};
  cpu.begin_sizing();
  GPTModel cpu_model(tiny_with_head_dim(80), tiny_batch(), RecomputeGranularity::kNone, DType::kFP32, cpu,
                     cpu_communicator);
  EXPECT_FALSE(cpu.arena_breakdown().empty());
}

// Under context parallelism the ring's half blocks (seq_q != seq_kv, no mask) are asked too: a backend
// with self-attention kernels only refuses the layout when the model is configured.
TEST(ModelAttentionSupport, ContextParallelRingShapesAreAskedToo) {
  const auto self_attention_only = [](const AttentionShape& shape) {
    return shape.kv_len() == shape.seq_q ? std::string() : std::string("self-attention only");
  };
  layouts::ModelSpec spec = layouts::model_preset("tiny");
  spec.kv_channels = 64;
  layouts::ParallelConfig config;
  config.context_parallel_size = 2;
  config.world_size = 2;
  config.micro_batch_size = 1;
  config.global_batch_size = 1;
  config.validate(spec);
  SizingBackend backend(nullptr, self_attention_only);
  try {
    size_rank_arena(spec, config, TrainOptions{}, 0, backend);
    FAIL() << "the ring's blocks were not asked";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("context parallelism's ring: self-attention only"),
              std::string::npos)
        << e.what();
  }
  config.context_parallel_size = 1;
  config.world_size = 1;
  SizingBackend plain(nullptr, self_attention_only);
  EXPECT_GT(size_rank_arena(spec, config, TrainOptions{}, 0, plain).total_bytes, 0);
}

}  // namespace
}  // namespace megatune::executor
