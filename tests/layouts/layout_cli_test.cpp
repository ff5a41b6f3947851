// `megatune layout` pieces: the Megatron flag set (aliases, presets, overrides, errors) and the text/JSON
// report, including the DeepSeek-V3 assignment of the Done-when command.
#include <gtest/gtest.h>

#include "base/user_error.h"
#include "layouts/layout_report.h"
// tools/ sources are compiled only into the megatune executable; this test compiles the flag set itself.
#include "tools/megatron_args.h"

namespace megatune::tools {
namespace {

struct Parsed {
  layouts::ModelSpec model;
  layouts::ParallelConfig config;
};

Parsed parse(const std::string& command_line) {
  CLI::App app{"test"};
  MegatronArgs args;
  add_model_flags(app, args);
  add_parallel_flags(app, args);
  add_batch_flags(app, args);
  app.parse(command_line, false);
  return {resolve_model(args), resolve_parallel(args)};
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Brackets balance outside strings and every string closes: enough to catch broken JSON assembly.
bool json_balanced(const std::string& json) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < json.size(); ++i) {
    const char ch = json[i];
    if (in_string) {
      if (ch == '\\')
        ++i;
      else if (ch == '"')
        in_string = false;
      continue;
    }
    if (ch == '"') in_string = true;
    if (ch == '{' || ch == '[') ++depth;
    if (ch == '}' || ch == ']') --depth;
    if (depth < 0) return false;
  }
  return depth == 0 && !in_string;
}

TEST(MegatronArgs, DeepSeekDoneWhenCommand) {
  const Parsed p = parse(
      "--model deepseek-v3 --num-layers 61 --mtp-num-layers 1 --pp 16 "
      "--pipeline-model-parallel-layout Et*3|(tt|)*29,m|L --world-size 16 --gbs 32");
  EXPECT_EQ(p.config.pp(), 16);
  EXPECT_EQ(p.config.global_batch_size, 32);
  const std::string text = layouts::layout_report_text(p.model, p.config);
  EXPECT_TRUE(contains(text, "layout    Et*3|(tt|)*29m|L  (32 stages)")) << text.substr(0, 2000);
  EXPECT_TRUE(contains(text, "     0     0    0  Ettt             E t0-2"));
  EXPECT_TRUE(contains(text, "    16     0    1  tt               t33-34"));
  EXPECT_TRUE(contains(text, "    30    14    1  m                m0"));
  EXPECT_TRUE(contains(text, "    31    15    1  L                L"));
  EXPECT_TRUE(contains(text, "rank 14  tp 0 cp 0 dp 0 pp 14"));
  EXPECT_TRUE(contains(text, "  chunk 0  stage 14: t29-30\n  chunk 1  stage 30: m0\n"));
  EXPECT_TRUE(contains(text, "schedule (46 warm-up forwards, 47 in flight): F0.0 [+a0.0@1] F1.0"));
  EXPECT_TRUE(contains(text, "embedding [0,15]"));
}

TEST(MegatronArgs, AliasesPresetsAndOverrides) {
  const Parsed p = parse(
      "--model llama3-8b --num-layers 16 --tp 2 --cp 2 --dp 2 --mbs 2 --gbs 64 --sequence-parallel "
      "--recompute-granularity full --recompute-method block --recompute-num-layers 2 "
      "--use-distributed-optimizer");
  EXPECT_EQ(p.model.num_layers, 16);
  EXPECT_EQ(p.model.hidden_size, 4096);
  EXPECT_EQ(p.config.world_size, 8);  // tp x cp x pp x dp
  EXPECT_EQ(p.config.dp(), 2);
  EXPECT_EQ(p.config.num_microbatches(), 16);
  EXPECT_TRUE(p.config.sequence_parallel_enabled());
  EXPECT_EQ(p.config.recompute_method, layouts::RecomputeMethod::kBlock);
  EXPECT_NO_THROW(p.config.validate(p.model));
  const Parsed custom = parse(
      "--num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 128 --vocab-size 1000 --swiglu "
      "--normalization RMSNorm --position-embedding-type rope --disable-bias-linear --num-experts 4 "
      "--moe-layer-freq ([0]*1+[1]*3) --moe-router-topk 2 --untie-embeddings-and-output-weights");
  EXPECT_EQ(custom.model.name, "custom");
  EXPECT_EQ(custom.model.activation, layouts::Activation::kSwiglu);
  EXPECT_FALSE(custom.model.add_bias_linear);
  EXPECT_FALSE(custom.model.is_moe_layer(0));
  EXPECT_TRUE(custom.model.is_moe_layer(3));
  EXPECT_EQ(custom.config.world_size, 1);
}

TEST(MegatronArgs, ErrorsNameTheFlag) {
  const auto error = [](const std::string& line) {
    try {
      const Parsed p = parse(line);
      p.config.validate(p.model);
    } catch (const UserError& e) {
      return std::string(e.what());
    } catch (const CLI::ParseError& e) {  // a CLI11 validator's refusal (the CLI prints it as one line)
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_TRUE(contains(error("--model llama3-8b --tp 3"),
                       "--tensor-model-parallel-size 3 does not divide --num-attention-heads 32"));
  EXPECT_TRUE(contains(error("--model llama3-8b --normalization BatchNorm"),
                       "--normalization: BatchNorm not in {LayerNorm,RMSNorm}"));
  EXPECT_TRUE(contains(error("--model nope"), "--model 'nope' is not a known preset"));
  EXPECT_TRUE(contains(error("--hidden-size 64"), "--num-layers 0 must be a positive integer"));
  EXPECT_TRUE(contains(error("--model llama3-8b --recompute-granularity some"),
                       "--recompute-granularity: some not in {none,selective,full}"));
  EXPECT_TRUE(contains(error("--model llama3-8b --pp 4 --pipeline-model-parallel-layout Et*8|t*8|t*8|t*7L"),
                       "holds 31 decoder layers t but --num-layers is 32"));
  EXPECT_TRUE(contains(error("--model tiny --moe-layer-freq [1,1,1]"), "--moe-layer-freq '[1,1,1]'"));
  EXPECT_TRUE(contains(error("--model tiny --cp 2 --cp-comm-type a2a"),
                       "--cp-comm-type 'a2a' is not run or priced by megatune yet: use --cp-comm-type p2p"));
  EXPECT_TRUE(contains(error("--model tiny --cp 2 --cp-comm-type ring"), "is not one of p2p, all_gather"));
  EXPECT_EQ(error("--model tiny --cp 2 --cp-comm-type p2p"), "");
}

TEST(LayoutReport, JsonAndRankFilter) {
  const Parsed p =
      parse("--model mixtral-8x7b --world-size 16 --tp 2 --ep 4 --pp 2 --sequence-parallel --gbs 32");
  layouts::LayoutReportOptions only;
  only.only_rank = 13;
  const std::string json = layouts::layout_report_json(p.model, p.config, only);
  EXPECT_TRUE(json_balanced(json)) << json;
  EXPECT_TRUE(contains(json, "\"rank\": 13, \"tp\": 1, \"cp\": 0, \"dp\": 2, \"pp\": 1"));
  EXPECT_TRUE(contains(json, "\"ep\": [9,11,13,15]"));
  EXPECT_FALSE(contains(json, "\"rank\": 12,"));
  const std::string all = layouts::layout_report_json(p.model, p.config);
  EXPECT_TRUE(json_balanced(all));
  EXPECT_TRUE(contains(all, "\"rank\": 0,") && contains(all, "\"rank\": 15,"));
  only.only_rank = 16;
  EXPECT_THROW(layouts::layout_report_text(p.model, p.config, only), UserError);
  EXPECT_EQ(base::json_quote("a\"b\\c\n"), "\"a\\\"b\\\\c\\n\"");
}

TEST(LayoutReport, StageContents) {
  const auto layout = layouts::PipelineLayout::parse("E|tt||t|t|tt|tm|L", 4);
  EXPECT_EQ(layouts::stage_contents(layout.stage(0, 0)), "E");
  EXPECT_EQ(layouts::stage_contents(layout.stage(1, 0)), "t0-1");
  EXPECT_EQ(layouts::stage_contents(layout.stage(2, 0)), "(empty)");
  EXPECT_EQ(layouts::stage_contents(layout.stage(2, 1)), "t6 m0");
  EXPECT_EQ(layouts::stage_assignment_lines(layout).size(), 9u);
}

}  // namespace
}  // namespace megatune::tools
