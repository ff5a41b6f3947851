// PipelineLayout: megatron.md §1's examples, Megatron's regex semantics, validation errors, derived
// layouts and round-trips of the canonical string.
#include "layouts/pipeline_layout.h"

#include <gtest/gtest.h>

#include <random>

#include "base/user_error.h"

namespace megatune::layouts {
namespace {

// Stage strings by (pp, vpp) as "pp0: a | b".
std::vector<std::string> by_rank(const PipelineLayout& layout) {
  std::vector<std::string> out;
  for (int r = 0; r < layout.pp(); ++r) {
    std::string line;
    for (int v = 0; v < layout.vpp(); ++v) line += (v ? "|" : "") + layout.stage(r, v).to_string();
    out.push_back(line);
  }
  return out;
}

std::string error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(PipelineLayout, DeepSeekV3Assignment) {
  const auto layout = PipelineLayout::parse("Et*3|(tt|)*29,m|L", 16);
  ASSERT_EQ(layout.num_stages(), 32);
  EXPECT_EQ(layout.vpp(), 2);
  const auto ranks = by_rank(layout);
  EXPECT_EQ(ranks[0], "Ettt|tt");
  for (int r = 1; r <= 13; ++r) EXPECT_EQ(ranks[r], "tt|tt") << r;
  EXPECT_EQ(ranks[14], "tt|m");
  EXPECT_EQ(ranks[15], "tt|L");
  EXPECT_EQ(layout.num_decoder_layers(), 61);
  EXPECT_EQ(layout.num_mtp_layers(), 1);
  EXPECT_NO_THROW(layout.validate(61, 1));
  EXPECT_TRUE(layout.mtp_standalone());
  // Global decoder-layer offsets: vpp-major order.
  EXPECT_EQ(layout.stage(0, 0).first_decoder_layer, 0);
  EXPECT_EQ(layout.stage(1, 0).first_decoder_layer, 3);
  EXPECT_EQ(layout.stage(15, 0).first_decoder_layer, 31);
  EXPECT_EQ(layout.stage(0, 1).first_decoder_layer, 33);
  EXPECT_EQ(layout.stage(14, 1).num_decoder_layers, 0);
  EXPECT_EQ(layout.stage(15, 1).first_decoder_layer, 61);
  EXPECT_EQ(layout.to_string(), "Et*3|(tt|)*29m|L");
}

TEST(PipelineLayout, FunctionalTestExamples) {
  {
    const auto l = PipelineLayout::parse("Et*2|(tt|)*5t|tmL", 4);
    EXPECT_EQ(l.expanded_string(), "Ett|tt|tt|tt|tt|tt|t|tmL");
    EXPECT_EQ(l.vpp(), 2);
    EXPECT_EQ(l.num_decoder_layers(), 14);
    EXPECT_EQ(by_rank(l), (std::vector<std::string>{"Ett|tt", "tt|tt", "tt|t", "tt|tmL"}));
    EXPECT_NO_THROW(l.validate(14, 1));
  }
  {
    const auto l = PipelineLayout::parse("Et*7|t*7mL", 2);
    EXPECT_EQ(l.vpp(), 1);
    EXPECT_EQ(by_rank(l), (std::vector<std::string>{"Ettttttt", "tttttttmL"}));
    EXPECT_NO_THROW(l.validate(14, 1));
  }
  {
    const auto l = PipelineLayout::parse("Et*3|(tt|)*6tmL", 2);
    EXPECT_EQ(l.num_stages(), 8);
    EXPECT_EQ(l.vpp(), 4);
    EXPECT_EQ(l.num_decoder_layers(), 16);
    EXPECT_EQ(by_rank(l), (std::vector<std::string>{"Ettt|tt|tt|tt", "tt|tt|tt|tmL"}));
    EXPECT_NO_THROW(l.validate(16, 1));
  }
  {
    const auto l = PipelineLayout::parse("Et|(tt|)*6mL", 4);
    EXPECT_EQ(l.expanded_string(), "Et|tt|tt|tt|tt|tt|tt|mL");
    EXPECT_EQ(l.num_decoder_layers(), 13);
    EXPECT_NO_THROW(l.validate(13, 1));
  }
  {
    const auto l = PipelineLayout::parse("Et*3|(tt|)*6L", 4);
    EXPECT_EQ(l.expanded_string(), "Ettt|tt|tt|tt|tt|tt|tt|L");
    EXPECT_NO_THROW(l.validate(15, 0));
  }
}

TEST(PipelineLayout, UnitTestExamples) {
  // 8 layers, PP4 VPP2.
  const auto a = PipelineLayout::parse("E|t*3|(t|)*5mL", 4);
  EXPECT_EQ(by_rank(a), (std::vector<std::string>{"E|t", "ttt|t", "t|t", "t|mL"}));
  EXPECT_NO_THROW(a.validate(8, 1));
  EXPECT_FALSE(a.mtp_standalone());
  const auto b = PipelineLayout::parse("E|t*3|(t|)*4tm|L", 4);
  EXPECT_EQ(by_rank(b), (std::vector<std::string>{"E|t", "ttt|t", "t|tm", "t|L"}));
  EXPECT_NO_THROW(b.validate(8, 1));
  EXPECT_TRUE(b.mtp_standalone());
  const auto c = PipelineLayout::parse("E|t*3|(t|)*3tt|m|L", 4);
  EXPECT_EQ(by_rank(c), (std::vector<std::string>{"E|t", "ttt|tt", "t|m", "t|L"}));
  EXPECT_NO_THROW(c.validate(8, 1));
}

TEST(PipelineLayout, ArgHelpExampleParsesButBreaksMtpRules) {
  // "E|(t|)*3,m|m||L": 8 stages; with PP4 the two m stages land on pp ranks 0 and 1.
  const auto l = PipelineLayout::parse("E|(t|)*3,m|m||L", 4);
  EXPECT_EQ(l.expanded_string(), "E|t|t|t|m|m||L");
  EXPECT_EQ(by_rank(l), (std::vector<std::string>{"E|m", "t|m", "t|", "t|L"}));
  EXPECT_TRUE(contains(error_of([&] { l.validate(3, 2); }), "rank 0"));
  const auto two = PipelineLayout::parse("E|(t|)*3,m|m||L", 2);  // 8 stages / 2 -> VPP4
  EXPECT_EQ(two.vpp(), 4);
}

TEST(PipelineLayout, RegexSemantics) {
  EXPECT_EQ(expand_layout_repetitions("t*3"), "ttt");
  EXPECT_EQ(expand_layout_repetitions("(tt|)*2"), "tt|tt|");
  EXPECT_EQ(expand_layout_repetitions("t,t,t"), "ttt");
  EXPECT_EQ(expand_layout_repetitions("(t|)*0E"), "E");
  EXPECT_EQ(expand_layout_repetitions("t*0"), "");
  EXPECT_EQ(expand_layout_repetitions("t*003"), "ttt");
  // Group first, then single characters: (t*2|)*2 -> t*2|t*2| -> tt|tt|
  EXPECT_EQ(expand_layout_repetitions("(t*2|)*2"), "tt|tt|");
  // No nesting: the inner group is expanded, the outer '(' and ')*3' stay (and are then invalid).
  EXPECT_EQ(expand_layout_repetitions("((t)*2)*3"), "(t(t)))");
  // Single pass each: "t*2*3" -> "tt*3" is not expanded again.
  EXPECT_EQ(expand_layout_repetitions("t*2*3"), "tt*3");
  // The single-char pass applies to any character, ')' included.
  EXPECT_EQ(expand_layout_repetitions("E)*2"), "E))");
  EXPECT_EQ(expand_layout_repetitions("()*2"), "())");  // empty group: only the x*n pass applies
}

TEST(PipelineLayout, EmptyStagesAndMapping) {
  const auto l = PipelineLayout::parse("E||t|L", 2);
  ASSERT_EQ(l.num_stages(), 4);
  EXPECT_TRUE(l.stage(1, 0).empty());
  EXPECT_EQ(l.stage(0, 1).to_string(), "t");
  EXPECT_EQ(l.stage(1, 1).to_string(), "L");
  EXPECT_NO_THROW(l.validate(1, 0));
  EXPECT_EQ(l.to_string(), "E||t|L");
}

TEST(PipelineLayout, ParseErrors) {
  std::string e = error_of([] { PipelineLayout::parse("Et x|L", 2); });
  EXPECT_TRUE(contains(e, "--pipeline-model-parallel-layout")) << e;
  EXPECT_TRUE(contains(e, "invalid layer character ' ' at position 2")) << e;
  e = error_of([] { PipelineLayout::parse("Et|t|L", 2); });
  EXPECT_TRUE(contains(e, "3 stages are not a multiple of --pipeline-model-parallel-size 2")) << e;
  e = error_of([] { PipelineLayout::parse("((t|)*2)*2L", 1); });
  EXPECT_TRUE(contains(e, "groups cannot be nested")) << e;
  e = error_of([] { PipelineLayout::parse("Et*99999999999|L", 2); });
  EXPECT_TRUE(contains(e, "beyond 100000 symbols")) << e;
  e = error_of([] { PipelineLayout::parse("(tttttttttt|)*200000", 2); });
  EXPECT_TRUE(contains(e, "beyond 100000 symbols")) << e;
  e = error_of([] { PipelineLayout::parse("Et|L", 0); });
  EXPECT_TRUE(contains(e, "--pipeline-model-parallel-size 0")) << e;
}

TEST(PipelineLayout, ValidationErrors) {
  const auto check = [](const char* text, int pp, int layers, int mtp, const char* expected) {
    const std::string e = error_of([&] { PipelineLayout::parse(text, pp).validate(layers, mtp); });
    EXPECT_TRUE(contains(e, expected)) << text << " -> " << e;
    EXPECT_TRUE(contains(e, "--pipeline-model-parallel-layout")) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos);
  };
  check("tE|L", 2, 1, 0, "first layer must be the embedding E");
  check("Et|Lt", 2, 2, 0, "last layer must be the loss L");
  check("EtE|L", 2, 1, 0, "2 embeddings E");
  check("Et|LL", 2, 1, 0, "2 losses L");
  check("Et|tL", 2, 3, 0, "holds 2 decoder layers t but --num-layers is 3");
  check("Et|tmL", 2, 2, 0, "holds 1 MTP layers m but --mtp-num-layers is 0");
  check("Et|mtL", 2, 2, 1, "a decoder layer t follows an MTP layer m");
  check("Et|tm||L", 2, 2, 1, "not in the last virtual stage");
  check("Et|t|t|t|m|mL", 3, 4, 2, "MTP layers are spread over 2 stages");
  check("Et|t|m|L", 2, 2, 1, "MTP layers sit on pipeline rank 0");
  check("|Et|t|L", 2, 2, 0, "E is not in the first stage");
  check("Et|tL||", 2, 2, 0, "L is not in the last stage");
}

TEST(PipelineLayout, UniformUnevenAndAccounting) {
  const auto u = PipelineLayout::uniform(8, 4);
  EXPECT_EQ(u.to_string(), "Ett|tt|tt|ttL");
  const auto uv = PipelineLayout::uniform(16, 4, 2, 1);
  EXPECT_EQ(uv.to_string(), "Ett|(tt|)*6ttmL");
  EXPECT_NO_THROW(uv.validate(16, 1));
  EXPECT_EQ(u.num_decoder_layers(), 8);
  // --decoder-first-pipeline-num-layers 2 --decoder-last-pipeline-num-layers 3 over 4 ranks, 13 layers.
  const auto uneven = PipelineLayout::uneven(13, 4, 2, 3);
  EXPECT_EQ(uneven.expanded_string(), "Ett|tttt|tttt|tttL");
  // With VPP 2, each rank's layers split over its chunks: first 2 -> 1+1, middle 4 -> 2+2, last 2 -> 1+1.
  const auto uneven_vpp = PipelineLayout::uneven(12, 4, 2, 2, 2);
  EXPECT_EQ(uneven_vpp.expanded_string(), "Et|tt|tt|t|t|tt|tt|tL");
  EXPECT_NO_THROW(uneven_vpp.validate(12, 0));
  // Only the first given: the other ranks split the rest.
  EXPECT_EQ(PipelineLayout::uneven(10, 3, 4, -1).expanded_string(), "Etttt|ttt|tttL");
  // Embedding + loss each count as one layer: (30 + 2) / 4 = 8 per stage.
  const auto acc = PipelineLayout::accounting_for_embedding_and_loss(30, 4, true, true);
  EXPECT_EQ(acc.expanded_string(), "Ettttttt|tttttttt|tttttttt|tttttttL");
  EXPECT_NO_THROW(acc.validate(30, 0));
  EXPECT_TRUE(contains(error_of([] { PipelineLayout::uniform(61, 16); }), "does not split evenly"));
  EXPECT_TRUE(contains(error_of([] { PipelineLayout::uneven(13, 4, 2, 2); }), "middle pipeline ranks"));
  EXPECT_TRUE(
      contains(error_of([] { PipelineLayout::uneven(13, 4, 3, 2, 2); }), "not divisible by the 2 virtual"));
  EXPECT_TRUE(contains(error_of([] { PipelineLayout::accounting_for_embedding_and_loss(31, 4, true, true); }),
                       "not divisible by --pipeline-model-parallel-size 4"));
  // Every derived layout round-trips through its string.
  for (const auto& layout : {u, uv, uneven, uneven_vpp, acc}) {
    EXPECT_EQ(PipelineLayout::parse(layout.to_string(), layout.pp()), layout) << layout.to_string();
  }
}

TEST(PipelineLayout, RandomRoundTrips) {
  std::mt19937 rng(5);
  const LayerSymbol symbols[] = {LayerSymbol::kDecoder, LayerSymbol::kDecoder, LayerSymbol::kMtp,
                                 LayerSymbol::kEmbedding, LayerSymbol::kLoss};
  for (int trial = 0; trial < 500; ++trial) {
    const int pp = 1 + static_cast<int>(rng() % 6);
    const int vpp = 1 + static_cast<int>(rng() % 4);
    std::vector<std::vector<LayerSymbol>> stages(pp * vpp);
    const bool repetitive = rng() % 2;
    for (auto& stage : stages) {
      if (repetitive) {
        stage.assign(rng() % 3 == 0 ? 2 : 3, LayerSymbol::kDecoder);
      } else {
        const int n = static_cast<int>(rng() % 6);
        for (int i = 0; i < n; ++i) stage.push_back(symbols[rng() % 5]);
      }
    }
    const auto layout = PipelineLayout::from_stages(stages, pp);
    const std::string text = layout.to_string();
    SCOPED_TRACE(text + " / " + layout.expanded_string());
    const auto again = PipelineLayout::parse(text, pp);
    ASSERT_EQ(again, layout);
    ASSERT_EQ(again.to_string(), text);
    ASSERT_EQ(PipelineLayout::parse(layout.expanded_string(), pp), layout);
  }
}

}  // namespace
}  // namespace megatune::layouts
