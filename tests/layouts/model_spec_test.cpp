// ModelSpec: preset parameter counts against published figures, defaults, MoE patterns and validation.
#include "layouts/model_spec.h"

#include <gtest/gtest.h>

#include "base/user_error.h"

namespace megatune::layouts {
namespace {

double billions(const std::string& preset) { return model_preset(preset).parameter_counts().total / 1e9; }

TEST(ModelPresets, ParameterCountsMatchPublished) {
  EXPECT_NEAR(billions("gpt-125m"), 0.125, 0.125 * 0.01);
  EXPECT_NEAR(billions("gpt-1.3b"), 1.3, 1.3 * 0.015);
  EXPECT_NEAR(billions("gpt-2.7b"), 2.7, 2.7 * 0.02);
  EXPECT_NEAR(billions("gpt3-175b"), 174.6, 174.6 * 0.01);
  EXPECT_NEAR(billions("llama3-1b"), 1.24, 1.24 * 0.01);
  EXPECT_NEAR(billions("llama3-3b"), 3.21, 3.21 * 0.01);
  EXPECT_NEAR(billions("llama3-8b"), 8.03, 8.03 * 0.01);
  EXPECT_NEAR(billions("llama3-70b"), 70.6, 70.6 * 0.01);
  EXPECT_NEAR(billions("llama3-405b"), 405.9, 405.9 * 0.01);
  EXPECT_NEAR(billions("mixtral-8x7b"), 46.7, 46.7 * 0.01);
  const ParameterCounts mixtral = model_preset("mixtral-8x7b").parameter_counts();
  EXPECT_NEAR(mixtral.active_per_token / 1e9, 12.9, 12.9 * 0.01);
  // DeepSeek-V3: 671B in the main model, 37B activated per token (MTP module excluded).
  const ParameterCounts deepseek = model_preset("deepseek-v3").parameter_counts();
  EXPECT_NEAR((deepseek.total - deepseek.mtp) / 1e9, 671.0, 671.0 * 0.01);
  EXPECT_NEAR(deepseek.active_per_token / 1e9 - 0.6, 37.0, 37.0 * 0.03);
  EXPECT_EQ(deepseek.num_moe_layers, 58);
  EXPECT_EQ(deepseek.num_dense_layers, 3);
}

TEST(ModelPresets, HandCountedLlama3_8b) {
  const ParameterCounts c = model_preset("llama3-8b").parameter_counts();
  EXPECT_EQ(c.word_embedding, 128256LL * 4096);
  EXPECT_EQ(c.output_layer, 128256LL * 4096);
  EXPECT_EQ(c.position_embedding, 0);
  // norm + q + k + v + o
  EXPECT_EQ(c.attention_per_layer, 4096 + 4096LL * (4096 + 2 * 1024) + 4096LL * 4096);
  EXPECT_EQ(c.dense_mlp_per_layer, 4096 + 3LL * 4096 * 14336);
  EXPECT_EQ(c.total, 2 * 128256LL * 4096 + 4096 + 32 * (c.attention_per_layer + c.dense_mlp_per_layer));
}

TEST(ModelPresets, NamesAndErrors) {
  for (const std::string& name : model_preset_names()) {
    const ModelSpec m = model_preset(name);
    EXPECT_EQ(m.name, name);
    EXPECT_NO_THROW(m.validate()) << name;
  }
  try {
    model_preset("llama-9000");
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("--model 'llama-9000' is not a known preset"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("llama3-8b"), std::string::npos);
  }
  const ModelSpec tiny = model_preset("tiny");
  EXPECT_EQ(tiny.num_layers, 2);
  EXPECT_EQ(tiny.hidden_size, 64);
  EXPECT_EQ(tiny.query_groups(), 2);
  EXPECT_EQ(tiny.vocab_size, 256);
  EXPECT_EQ(tiny.seq_length, 32);
}

TEST(ModelPresets, TorchAnchorShapes) {
  const ModelSpec gpt = torch_anchor_model("gpt-1.3b");
  EXPECT_EQ(gpt.seq_length, 2048);
  EXPECT_EQ(gpt.padded_vocab_size(), 50304);
  EXPECT_TRUE(gpt.untie_embeddings_and_output_weights);
  const ModelSpec llama = torch_anchor_model("llama-1b");
  EXPECT_EQ(llama.seq_length, 4096);
  EXPECT_EQ(llama.query_groups(), 8);
  EXPECT_EQ(llama.activation, Activation::kSwiglu);
  EXPECT_THROW(torch_anchor_model("gpt-7b"), UserError);
  for (const std::string& name : torch_anchor_model_names())
    EXPECT_NO_THROW(torch_anchor_model(name).validate());
}

TEST(ModelSpec, DefaultsAndPadding) {
  ModelSpec m;
  m.num_layers = 2;
  m.hidden_size = 1000;
  m.num_attention_heads = 10;
  m.seq_length = 16;
  m.vocab_size = 50257;
  EXPECT_EQ(m.ffn_size(), 4000);
  m.activation = Activation::kSwiglu;
  EXPECT_EQ(m.ffn_size(), 2624);  // int((4 * 1000 * 2 / 3) / 64) * 64
  EXPECT_EQ(m.head_dim(), 100);
  EXPECT_EQ(m.query_groups(), 10);
  EXPECT_EQ(m.padded_vocab_size(1), 50304);
  EXPECT_EQ(m.padded_vocab_size(8), 51200);  // multiple of 128 * 8
  EXPECT_EQ(m.max_positions(), 16);
}

TEST(ModelSpec, MoeLayerFreq) {
  EXPECT_EQ(parse_moe_layer_freq("2", 5), (std::vector<int>{1, 0, 1, 0, 1}));
  EXPECT_EQ(parse_moe_layer_freq("[0,1,1]", 3), (std::vector<int>{0, 1, 1}));
  const auto deepseek = parse_moe_layer_freq("([0]*3+[1]*58)", 61);
  EXPECT_EQ(deepseek.size(), 61u);
  EXPECT_EQ(deepseek[2], 0);
  EXPECT_EQ(deepseek[3], 1);
  EXPECT_THROW(parse_moe_layer_freq("([0]*3+[1]*5)", 61), UserError);
  EXPECT_THROW(parse_moe_layer_freq("[0,2]", 2), UserError);
  EXPECT_THROW(parse_moe_layer_freq("[0,1", 2), UserError);
  EXPECT_THROW(parse_moe_layer_freq("0", 2), UserError);
  EXPECT_THROW(parse_moe_layer_freq("[1]*99999999", 2), UserError);
  ModelSpec m = model_preset("mixtral-8x7b");
  m.moe_layer_freq = 2;
  EXPECT_TRUE(m.is_moe_layer(0));
  EXPECT_FALSE(m.is_moe_layer(1));
  EXPECT_EQ(m.num_moe_layers(), 16);
}

TEST(ModelSpec, ValidationNamesTheFlag) {
  const auto message = [](const ModelSpec& m) {
    try {
      m.validate();
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  ModelSpec m = model_preset("llama3-8b");
  m.num_query_groups = 5;
  EXPECT_NE(message(m).find("--num-query-groups 5 does not divide --num-attention-heads 32"),
            std::string::npos);
  m = model_preset("llama3-8b");
  m.hidden_size = 4100;
  m.kv_channels = 0;
  EXPECT_NE(message(m).find("--hidden-size 4100 is not divisible by --num-attention-heads 32"),
            std::string::npos);
  m = model_preset("mixtral-8x7b");
  m.moe_router_topk = 9;
  EXPECT_NE(message(m).find("--moe-router-topk 9 exceeds --num-experts 8"), std::string::npos);
  m = ModelSpec{};
  EXPECT_NE(message(m).find("--num-layers 0 must be a positive integer"), std::string::npos);
  m = model_preset("gpt-125m");
  m.max_position_embeddings = 1024;
  EXPECT_NE(message(m).find("--max-position-embeddings 1024 is below --seq-length 2048"), std::string::npos);
  m = model_preset("gpt-125m");
  m.moe_ffn_hidden_size = 100;
  EXPECT_NE(message(m).find("need --num-experts"), std::string::npos);
}

}  // namespace
}  // namespace megatune::layouts
