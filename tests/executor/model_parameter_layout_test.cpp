// ParameterLayout: Megatron's buffer order (reverse of forward), 64-element alignment, no overlaps, the
// decay flags, and parameter counts equal to layouts::ModelSpec's for the dense presets.
#include <gtest/gtest.h>

#include <algorithm>

#include "executor/model/parameter_layout.h"
#include "layouts/model_spec.h"

namespace megatune::executor {
namespace {

TEST(ModelParameterLayout, CountsMatchTheModelSpec) {
  for (const char* name : {"tiny", "gpt-125m", "gpt-1.3b", "llama3-1b", "llama3-8b"}) {
    const layouts::ModelSpec spec = layouts::model_preset(name);
    const ParameterLayout layout(transformer_config_from(spec, 1, 10000.0f, 1e-5f, 0.02f));
    EXPECT_EQ(layout.parameter_count(), spec.parameter_counts(1).total) << name;
  }
}

TEST(ModelParameterLayout, ReverseOrderAlignedAndDisjoint) {
  const ParameterLayout layout(
      transformer_config_from(layouts::model_preset("gpt-125m"), 1, 1e4f, 1e-5f, 0.02f));
  const std::vector<ParameterEntry>& entries = layout.entries();
  ASSERT_FALSE(entries.empty());
  EXPECT_EQ(entries.back().offset, 0);  // the last forward parameter opens the buffer
  for (std::size_t i = 0; i < entries.size(); ++i) {
    EXPECT_EQ(entries[i].offset % ParameterLayout::kAlignElements, 0) << entries[i].name;
    if (i + 1 < entries.size()) {
      EXPECT_GE(entries[i].offset, entries[i + 1].offset + entries[i + 1].numel()) << entries[i].name;
    }
  }
  EXPECT_GE(layout.total_elements(), entries.front().offset + entries.front().numel());
  EXPECT_LT(layout.total_elements(),
            layout.parameter_count() + ParameterLayout::kAlignElements * entries.size());
}

TEST(ModelParameterLayout, NoWeightDecayOnVectors) {
  const ParameterLayout layout(
      transformer_config_from(layouts::model_preset("gpt-125m"), 1, 1e4f, 1e-5f, 0.02f));
  for (const ParameterEntry& e : layout.entries()) {
    const bool vector = e.rows == 1;
    EXPECT_EQ(e.weight_decay, !vector) << e.name;
  }
  EXPECT_EQ(layout.find("decoder.layers.0.mlp.linear_fc2.weight").init, ParameterInit::kScaledNormal);
  EXPECT_EQ(layout.find("decoder.layers.0.self_attention.linear_proj.weight").init,
            ParameterInit::kScaledNormal);
  EXPECT_EQ(layout.find("decoder.layers.0.self_attention.linear_qkv.weight").init, ParameterInit::kNormal);
  EXPECT_THROW(layout.find("output_layer.weight"), std::out_of_range);  // gpt-125m ties its head
}

}  // namespace
}  // namespace megatune::executor
