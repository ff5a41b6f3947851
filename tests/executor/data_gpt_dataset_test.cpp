// Tests GPTDataset index building and sampling against hand-derived indices and against values of a
// transcription of Megatron's gpt_dataset.py/helpers.cpp run with numpy; also blending, mock data and
// the train/valid/test builder.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <numeric>

#include "base/user_error.h"
#include "executor/data/blended_dataset.h"
#include "executor/data/dataset_builder.h"
#include "executor/data/gpt_dataset.h"
#include "executor/data/indexed_dataset_writer.h"
#include "executor/data/mock_sequence_source.h"

namespace megatune::executor::data {
namespace {

// Sequence i has tokens 100*i + t for t in [0, length_i): every token names where it came from.
class VectorSource final : public SequenceSource {
 public:
  explicit VectorSource(std::vector<int32_t> lengths) : lengths_(std::move(lengths)) {}
  int64_t num_sequences() const override { return static_cast<int64_t>(lengths_.size()); }
  const std::vector<int32_t>& sequence_lengths() const override { return lengths_; }
  void read_tokens(int64_t sequence, int64_t offset, int64_t length, int32_t* out) const override {
    ASSERT_LE(offset + length, lengths_[static_cast<size_t>(sequence)]);
    for (int64_t i = 0; i < length; ++i) out[i] = static_cast<int32_t>(100 * sequence + offset + i);
  }
  std::string description() const override { return "test corpus"; }

 private:
  std::vector<int32_t> lengths_;
};

const std::vector<int32_t> kLengths{5, 3, 7, 2, 6, 4, 8, 1, 9, 3};
const std::vector<int32_t> kTrainIds{0, 1, 2, 3, 4, 5, 6, 7};  // split 8,1,1 of 10 sequences

std::vector<int64_t> flat(std::initializer_list<int64_t> values) { return values; }

TEST(GPTDatasetIndices, SplitParsingAndBoundariesFollowMegatron) {
  const auto split = parse_split("969,30,1");
  EXPECT_DOUBLE_EQ(split[0], 0.969);
  EXPECT_DOUBLE_EQ(split[2], 0.001);
  EXPECT_EQ(split_boundaries(split, 1000), (std::array<int64_t, 4>{0, 969, 999, 1000}));
  EXPECT_EQ(split_boundaries(split, 10), (std::array<int64_t, 4>{0, 10, 10, 10}));
  EXPECT_EQ(split_boundaries(parse_split("8,1,1"), 10), (std::array<int64_t, 4>{0, 8, 9, 10}));
  // 0.5 * 3 = 1.5 rounds half to even (2) in Python; the overshoot shift brings the first boundary to 1.
  EXPECT_EQ(split_boundaries(parse_split("1,1"), 3), (std::array<int64_t, 4>{0, 1, 3, 3}));
  EXPECT_EQ(parse_split("98/2")[1], 0.02);
  EXPECT_THROW(parse_split("1,x,1"), UserError);
  EXPECT_THROW(parse_split("0,0,0"), UserError);
  EXPECT_THROW(parse_split("1,1,1,1"), UserError);
  EXPECT_THROW(parse_split(""), UserError);
}

TEST(GPTDatasetIndices, EpochCount) {
  EXPECT_EQ(compute_num_epochs(36, 5, 4, 1), 1);
  EXPECT_EQ(compute_num_epochs(36, 8, 4, 1), 1);   // 33 tokens needed
  EXPECT_EQ(compute_num_epochs(36, 9, 4, 1), 2);   // 37 tokens needed
  EXPECT_EQ(compute_num_epochs(36, 20, 4, 1), 3);  // 81 tokens needed
  EXPECT_EQ(compute_num_epochs(36, -1, 4, 1), 1);
}

// One epoch, hand-derived. Document index (numpy RandomState(1234).shuffle of 0..7): 2 1 6 0 4 5 3 7, with
// lengths 7 3 8 5 6 4 2 1 (36 tokens), s = 4, so n = (36 - 1) // 4 = 8 samples of 5 tokens:
//   (0,0): doc@0 has 7 -> remaining 5-7 = -2 <= 0 -> offset 0 + (-2 + 7 - 1) = 4      -> (0,4)
//   (0,4): 3 left in doc@0 -> remaining 2; doc@1 has 3 -> 2-3 = -1 -> offset -1+3-1 = 1 -> (1,1)
//   (1,1): 2 left -> 3; doc@2 has 8 -> -5 -> offset 2                                  -> (2,2)
//   (2,2): 6 left -> -1 -> offset 2 + (-1 + 6 - 1) = 6                                  -> (2,6)
//   (2,6): 2 left -> 3; doc@3 has 5 -> -2 -> offset 2                                   -> (3,2)
//   (3,2): 3 left -> 2; doc@4 has 6 -> -4 -> offset 1                                   -> (4,1)
//   (4,1): 5 left -> 0 -> offset 1 + (0 + 5 - 1) = 5                                    -> (4,5)
//   (4,5): 1 left -> 4; doc@5 has 4 -> 0 -> offset 3                                    -> (5,3)
TEST(GPTDatasetIndices, OneEpochMatchesHandDerivation) {
  GPTIndexConfig config;
  config.sequence_length = 4;
  const auto indices = build_gpt_dataset_indices(kLengths, kTrainIds, 5, config, "test");
  EXPECT_EQ(indices.tokens_per_epoch, 36);
  EXPECT_EQ(indices.num_epochs, 1);
  EXPECT_FALSE(indices.separate_final_epoch);
  EXPECT_EQ(indices.document_index, (std::vector<int32_t>{2, 1, 6, 0, 4, 5, 3, 7}));
  EXPECT_EQ(indices.sample_index, flat({0, 0, 0, 4, 1, 1, 2, 2, 2, 6, 3, 2, 4, 1, 4, 5, 5, 3}));
  // shuffle index: the same RandomState continues after the document shuffle (numpy values)
  EXPECT_EQ(indices.shuffle_index, flat({5, 0, 3, 4, 2, 6, 1, 7}));
}

TEST(GPTDatasetIndices, MultipleEpochsMatchMegatron) {
  // 16 samples need 65 tokens: 2 epochs; the final epoch gives 8 >= int(0.8 * 8) samples: not separate.
  GPTIndexConfig config;
  config.sequence_length = 4;
  const auto indices = build_gpt_dataset_indices(kLengths, kTrainIds, 16, config, "test");
  EXPECT_EQ(indices.num_epochs, 2);
  EXPECT_FALSE(indices.separate_final_epoch);
  EXPECT_EQ(indices.document_index, (std::vector<int32_t>{5, 3, 0, 4, 6, 2, 2, 7, 1, 1, 0, 4, 5, 6, 3, 7}));
  EXPECT_EQ(indices.sample_index, flat({0, 0, 1, 0, 2, 2, 3,  1, 3,  5, 4,  3, 4,  7, 5,  3, 6,  0,
                                        6, 4, 8, 0, 9, 1, 10, 2, 11, 1, 11, 5, 12, 3, 13, 3, 13, 7}));
  EXPECT_EQ(indices.shuffle_index, flat({8, 1, 15, 4, 3, 7, 11, 10, 14, 13, 2, 6, 9, 0, 5, 12, 16}));
}

TEST(GPTDatasetIndices, SeparateFinalEpochMatchesMegatron) {
  // 20 samples need 81 tokens: 3 epochs; n_sans = (72 - 1) // 4 = 17, the last epoch supplies 3 < int(0.8 *
  // 8).
  GPTIndexConfig config;
  config.sequence_length = 4;
  const auto indices = build_gpt_dataset_indices(kLengths, kTrainIds, 20, config, "test");
  EXPECT_EQ(indices.num_epochs, 3);
  EXPECT_TRUE(indices.separate_final_epoch);
  EXPECT_EQ(indices.num_samples_sans_final_epoch, 17);
  EXPECT_EQ(indices.document_index,
            (std::vector<int32_t>{5, 3, 0, 4, 6, 2, 2, 7, 1, 1, 0, 4, 5, 6, 3, 7, 5, 1, 3, 4, 0, 7, 6, 2}));
  EXPECT_EQ(indices.shuffle_index, flat({7, 10, 4, 1,  12, 8,  3,  15, 14, 13, 5,  11, 0,
                                         2, 6,  9, 16, 17, 22, 25, 23, 24, 18, 21, 20, 19}));
  // Shuffling never mixes the final epoch's samples with the earlier ones.
  for (size_t k = 0; k < 17; ++k) EXPECT_LT(indices.shuffle_index[k], 17);
  EXPECT_EQ(indices.sample_index.size(), 2u * 27u);
}

TEST(GPTDatasetIndices, SeedChangesTheOrder) {
  GPTIndexConfig config;
  config.sequence_length = 4;
  config.random_seed = 7;
  const auto indices = build_gpt_dataset_indices(kLengths, kTrainIds, 5, config, "test");
  EXPECT_EQ(indices.document_index, (std::vector<int32_t>{2, 5, 0, 6, 3, 1, 4, 7}));
  EXPECT_EQ(indices.shuffle_index, flat({3, 5, 7, 4, 2, 1, 0, 6}));
}

TEST(GPTDatasetIndices, KeepingThePartialLastSample) {
  // 36 tokens, s = 4: ceil(35 / 4) = 9 samples; the last one runs out at the end of the documents.
  const std::vector<int32_t> document_index{2, 1, 6, 0, 4, 5, 3, 7};
  const auto sample_index = build_sample_index(kLengths, document_index, 4, 1, 36, false, 1);
  ASSERT_EQ(sample_index.size(), 20u);
  EXPECT_EQ(sample_index[16], 5);  // sample 8 starts at (5, 3) ...
  EXPECT_EQ(sample_index[17], 3);
  EXPECT_EQ(sample_index[18], 7);  // ... and ends at the last document, offset len - 1 = 0
  EXPECT_EQ(sample_index[19], 0);
}

TEST(GPTDataset, SamplesAreShiftedTokensAndLabels) {
  GPTDatasetConfig config;
  config.sequence_length = 4;
  const GPTDataset dataset(std::make_shared<VectorSource>(kLengths), kTrainIds, 5, config);
  ASSERT_EQ(dataset.num_samples(), 8);
  int32_t tokens[4], labels[4];
  float mask[4];
  // Sample 0 = shuffled 5 = (3,2)..(4,1): sequence 0 tokens 2..4, then sequence 4 tokens 0..1.
  dataset.get_sample(0, tokens, labels, mask);
  EXPECT_EQ(std::vector<int32_t>(tokens, tokens + 4), (std::vector<int32_t>{2, 3, 4, 400}));
  EXPECT_EQ(std::vector<int32_t>(labels, labels + 4), (std::vector<int32_t>{3, 4, 400, 401}));
  EXPECT_EQ(std::vector<float>(mask, mask + 4), (std::vector<float>{1, 1, 1, 1}));
  // Sample 1 = shuffled 0 = (0,0)..(0,4): sequence 2 tokens 0..4.
  dataset.get_sample(1, tokens, labels, mask);
  EXPECT_EQ(std::vector<int32_t>(tokens, tokens + 4), (std::vector<int32_t>{200, 201, 202, 203}));
  // Sample 7 = shuffled 7 = (4,5)..(5,3): sequence 4 token 5, then sequence 5 tokens 0..3.
  dataset.get_sample(7, tokens, labels, mask);
  EXPECT_EQ(std::vector<int32_t>(tokens, tokens + 4), (std::vector<int32_t>{405, 500, 501, 502}));
  EXPECT_EQ(labels[3], 503);
}

TEST(GPTDataset, SamplesAcrossDocumentsMatchMegatron) {
  // Values from the numpy transcription: first samples of the 2-epoch dataset.
  GPTDatasetConfig config;
  config.sequence_length = 4;
  const GPTDataset dataset(std::make_shared<VectorSource>(kLengths), kTrainIds, 16, config);
  std::vector<int32_t> text(5);
  dataset.read_sample_text(0, text.data());
  EXPECT_EQ(text, (std::vector<int32_t>{200, 201, 202, 203, 204}));
  dataset.read_sample_text(1, text.data());
  EXPECT_EQ(text, (std::vector<int32_t>{300, 301, 0, 1, 2}));
  dataset.read_sample_text(2, text.data());
  EXPECT_EQ(text, (std::vector<int32_t>{503, 600, 601, 602, 603}));
}

TEST(GPTDataset, PaddingAndEodAreMasked) {
  GPTDatasetConfig config;
  config.sequence_length = 4;
  config.drop_last_partial_sequence = false;
  config.pad_token = 0;
  const GPTDataset dataset(std::make_shared<VectorSource>(std::vector<int32_t>{3, 3}), {0, 1}, -1, config);
  // 6 tokens: ceil(5 / 4) = 2 samples; the second is short and padded.
  ASSERT_EQ(dataset.num_samples(), 2);
  int32_t tokens[4], labels[4];
  float mask[4];
  bool saw_padding = false;
  for (int64_t k = 0; k < 2; ++k) {
    dataset.get_sample(k, tokens, labels, mask);
    for (int i = 0; i < 4; ++i) {
      if (mask[i] == 0.0f) {
        saw_padding = true;
        EXPECT_EQ(labels[i], 0);
      }
    }
  }
  EXPECT_TRUE(saw_padding);

  GPTDatasetConfig eod = config;
  eod.drop_last_partial_sequence = true;
  eod.eod_mask_loss = true;
  eod.eod_token = 100;  // sequence 1 token 0: sample 0 is 0 1 2 100 | 101
  const GPTDataset masked(std::make_shared<VectorSource>(std::vector<int32_t>{3, 3}), {0, 1}, -1, eod);
  masked.get_sample(0, tokens, labels, mask);
  EXPECT_EQ(std::vector<float>(mask, mask + 4), (std::vector<float>{1, 1, 1, 0}));
}

TEST(GPTDataset, TooLittleDataAndBadTokensAreUserErrors) {
  GPTDatasetConfig config;
  config.sequence_length = 8;
  EXPECT_THROW(GPTDataset(std::make_shared<VectorSource>(std::vector<int32_t>{3, 4}), {0, 1}, 10, config),
               UserError);
  EXPECT_THROW(GPTDataset(std::make_shared<VectorSource>(kLengths), {}, 10, config), UserError);
  config.sequence_length = 4;
  config.vocab_size = 150;  // the corpus holds ids up to 907
  const GPTDataset dataset(std::make_shared<VectorSource>(kLengths), kTrainIds, 5, config);
  int32_t tokens[4], labels[4];
  float mask[4];
  EXPECT_THROW(dataset.get_sample(0, tokens, labels, mask), UserError);
}

TEST(Blending, IndicesFollowHelpersCpp) {
  const auto weights = normalize_blend_weights(std::vector<double>{0.3, 0.7});
  const auto indices = build_blending_indices(weights, 10);
  // i=0: errors 0.3, 0.7 -> 1; i=1: 0.3, -0.3 -> 0; i=2: -0.4, 0.4 -> 1; i=3: -0.1, 0.1 -> 1; i=4: 0.2, -0.2
  // -> 0 ...
  EXPECT_EQ(indices.dataset_index, (std::vector<int16_t>{1, 0, 1, 1, 0, 1, 1, 0, 1, 1}));
  EXPECT_EQ(indices.dataset_sample_index, (std::vector<int64_t>{0, 0, 1, 2, 1, 3, 4, 2, 5, 6}));
  EXPECT_EQ(blend_per_dataset_num_samples(weights, 1000), (std::vector<int64_t>{302, 704}));
  EXPECT_THROW(normalize_blend_weights(std::vector<double>{0, 0}), UserError);
  EXPECT_THROW(normalize_blend_weights(std::vector<double>{-1, 2}), UserError);
}

TEST(Blending, ExhaustiveIndicesDrawEverySampleOnce) {
  // sizes 3 and 5: weights 0.375 / 0.625; i=0: 0.375 vs 0.625 -> 1; i=1: 0.375 vs -0.375 -> 0; i=2: -0.25 vs
  // 0.25 -> 1; i=3: 0.125 vs -0.125 -> 0; i=4 -> 1; i=5: -0.125 vs 0.125 -> 1; i=6: 0.25 vs -0.25 -> 0
  // (spent); i=7: only dataset 1 is left.
  const auto indices = build_exhaustive_blending_indices(std::vector<int64_t>{3, 5});
  EXPECT_EQ(indices.dataset_index, (std::vector<int16_t>{1, 0, 1, 0, 1, 1, 0, 1}));
  EXPECT_EQ(indices.dataset_sample_index, (std::vector<int64_t>{0, 0, 1, 1, 2, 3, 2, 4}));
  const auto with_empty = build_exhaustive_blending_indices(std::vector<int64_t>{0, 2});
  EXPECT_EQ(with_empty.dataset_index, (std::vector<int16_t>{1, 1}));
}

TEST(Blending, BlendedDatasetDrawsFromEachDataset) {
  GPTDatasetConfig config;
  config.sequence_length = 4;
  auto a = std::make_shared<GPTDataset>(std::make_shared<VectorSource>(kLengths), kTrainIds, 8, config);
  auto b = std::make_shared<GPTDataset>(std::make_shared<VectorSource>(std::vector<int32_t>{50, 50}),
                                        std::vector<int32_t>{0, 1}, 8, config);
  const BlendedDataset blend({a, b}, {1, 1}, 12);
  EXPECT_EQ(blend.num_samples(), 12);
  int32_t tokens[4], labels[4], expected_tokens[4], expected_labels[4];
  float mask[4], expected_mask[4];
  for (int64_t i = 0; i < 12; ++i) {
    blend.get_sample(i, tokens, labels, mask);
    const auto& source = blend.indices().dataset_index[static_cast<size_t>(i)] == 0 ? *a : *b;
    source.get_sample(blend.indices().dataset_sample_index[static_cast<size_t>(i)], expected_tokens,
                      expected_labels, expected_mask);
    EXPECT_EQ(std::vector<int32_t>(tokens, tokens + 4),
              std::vector<int32_t>(expected_tokens, expected_tokens + 4));
  }
  EXPECT_THROW(BlendedDataset({a, b}, {1, 1}, 40), UserError);  // a holds 8 samples, the blend wants 20
}

TEST(MockData, IsDeterministicAndShapedLikeMegatrons) {
  MockDataConfig config;
  config.num_sequences = 1000;
  config.max_sequence_length = 64;
  config.vocab_size = 100;
  config.eod_token = 0;
  const MockSequenceSource a(config), b(config);
  EXPECT_EQ(a.sequence_lengths(), b.sequence_lengths());
  for (const int32_t length : a.sequence_lengths()) {
    EXPECT_GE(length, 1);
    EXPECT_LT(length, 64);
  }
  const int32_t length = a.sequence_lengths()[3];
  std::vector<int32_t> tokens(static_cast<size_t>(length));
  a.read_tokens(3, 0, length, tokens.data());
  for (int32_t t = 0; t + 1 < length; ++t) EXPECT_EQ(tokens[static_cast<size_t>(t)], 1 + t % 99);
  EXPECT_EQ(tokens.back(), 0);
  config.vocab_size = 2;
  EXPECT_THROW(MockSequenceSource{config}, UserError);
}

TEST(DatasetBuilder, ParsesDataPathLikeMegatron) {
  const auto single = parse_data_path({"/data/a_text_document"});
  ASSERT_EQ(single.size(), 1u);
  EXPECT_EQ(single[0].path_prefix, "/data/a_text_document");
  const auto weighted = parse_data_path({"0.3", "/a", "0.7", "/b"});
  ASSERT_EQ(weighted.size(), 2u);
  EXPECT_DOUBLE_EQ(weighted[1].weight, 0.7);
  EXPECT_EQ(weighted[1].path_prefix, "/b");
  EXPECT_THROW(parse_data_path({"0.3", "/a", "0.7"}), UserError);
  EXPECT_THROW(parse_data_path({"/a.bin"}), UserError);
  EXPECT_THROW(parse_data_path({}), UserError);
}

TEST(DatasetBuilder, BuildsSplitsFromMockAndIndexedData) {
  DataConfig config;
  config.mock_data = true;
  config.split = "8,1,1";
  config.gpt.sequence_length = 32;
  config.gpt.vocab_size = 512;
  config.gpt.eod_token = 256;
  config.mock.num_sequences = 200;
  config.mock.max_sequence_length = 64;
  const auto mock = build_train_valid_test_datasets(config, {100, 10, 10});
  ASSERT_TRUE(mock.train && mock.valid && mock.test);
  EXPECT_GE(mock.train->num_samples(), 100);
  EXPECT_GE(mock.valid->num_samples(), 10);

  // Two indexed datasets blended 1:3.
  const auto directory =
      std::filesystem::temp_directory_path() / ("megatune_builder_" + std::to_string(::getpid()));
  std::filesystem::create_directories(directory);
  std::vector<std::string> prefixes;
  for (int d = 0; d < 2; ++d) {
    const std::string prefix = (directory / ("part" + std::to_string(d))).string();
    IndexedDatasetWriter writer(prefix + ".bin", prefix + ".idx", IndexDType::uint16);
    for (int doc = 0; doc < 50; ++doc) writer.add_document(std::vector<int32_t>(40, d * 100 + doc));
    writer.finalize();
    prefixes.push_back(prefix);
  }
  config.mock_data = false;
  config.data_path = {"1", prefixes[0], "3", prefixes[1]};
  const auto blended = build_train_valid_test_datasets(config, {64, 0, 0});
  ASSERT_TRUE(blended.train);
  EXPECT_EQ(blended.train->num_samples(), 64);
  int32_t tokens[32], labels[32];
  float mask[32];
  int from_second = 0;
  for (int64_t i = 0; i < 64; ++i) {
    blended.train->get_sample(i, tokens, labels, mask);
    from_second += tokens[0] >= 100 ? 1 : 0;
  }
  EXPECT_EQ(from_second, 48);  // exactly 3/4 of 64 by the blending rule
  // Without weights (Megatron): one epoch of each dataset, in proportion to their sizes.
  config.data_path = {prefixes[0], prefixes[1]};
  const auto unweighted = build_train_valid_test_datasets(config, {20, 0, 0});
  ASSERT_TRUE(unweighted.train);
  EXPECT_EQ(unweighted.train->num_samples(), 20);
  const auto everything = build_train_valid_test_datasets(config, {-1, 0, 0});
  const auto* exhaustive = dynamic_cast<const BlendedDataset*>(everything.train.get());
  ASSERT_NE(exhaustive, nullptr);
  // each part: 40 train sequences of 40 tokens -> (1600 - 1) // 32 = 49 samples; every one drawn once
  EXPECT_EQ(exhaustive->num_samples(), 98);
  EXPECT_EQ(
      std::count(exhaustive->indices().dataset_index.begin(), exhaustive->indices().dataset_index.end(), 1),
      49);
  EXPECT_THROW(build_train_valid_test_datasets(config, {99, 0, 0}), UserError);
  config.data_path = {"1", prefixes[0], "3", prefixes[1]};
  // No size requested: one epoch of each dataset, blended as far as the weights allow.
  const auto one_epoch = build_train_valid_test_datasets(config, {-1, 0, 0});
  ASSERT_TRUE(one_epoch.train);
  EXPECT_GT(one_epoch.train->num_samples(), 0);
  for (int64_t i = 0; i < one_epoch.train->num_samples(); ++i)
    one_epoch.train->get_sample(i, tokens, labels, mask);
  config.split = "1,0,0";
  EXPECT_THROW(build_train_valid_test_datasets(config, {64, 8, 0}), UserError);
  // A split too small for one sample is fine as long as no samples are asked of it.
  config.split = "90,5,5";
  config.data_path = {prefixes[0]};
  config.gpt.sequence_length = 100;  // the 5% splits hold 2 or 3 documents of 40 tokens
  const auto train_only = build_train_valid_test_datasets(config, {64, 0, 0});
  EXPECT_TRUE(train_only.train && !train_only.valid && !train_only.test);
  EXPECT_THROW(build_train_valid_test_datasets(config, {64, 1, 0}), UserError);
  std::filesystem::remove_all(directory);
}

}  // namespace
}  // namespace megatune::executor::data
