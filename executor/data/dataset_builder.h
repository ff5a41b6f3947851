// Builds the train/valid/test SampleDatasets of a run from Megatron's data flags (--data-path with
// optional weights, --split, --mock-data, --seq-length, --seed), like BlendedMegatronDatasetBuilder.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "executor/data/gpt_dataset.h"
#include "executor/data/mock_sequence_source.h"
#include "executor/data/sample_dataset.h"

namespace megatune::executor::data {

struct DataBlendEntry {
  double weight = 1.0;
  std::string path_prefix;
  bool weighted = false;  // the weight was given on the command line
};

// Megatron's --data-path list: "PREFIX" | "W1 PREFIX1 W2 PREFIX2 ..." | "PREFIX1 PREFIX2 ...". Throws
// UserError naming --data-path for an odd weighted list or a bad weight.
std::vector<DataBlendEntry> parse_data_path(const std::vector<std::string>& data_path);

struct DataConfig {
  std::vector<std::string> data_path;  // --data-path; empty with mock_data
  bool mock_data = false;              // --mock-data
  std::string split = "969,30,1";      // --split
  GPTDatasetConfig gpt;                // sequence length, seed, eod, vocab check
  MockDataConfig mock;                 // used with mock_data (vocab_size and eod_token are taken from gpt)
  // A validation or test split that --split leaves without sequences is not built (null) instead of a
  // UserError (training evaluates the splits that hold data).
  bool skip_empty_evaluation_splits = false;
};

struct TrainValidTestDatasets {
  std::shared_ptr<const SampleDataset> train;  // null when the split gives it no sequences
  std::shared_ptr<const SampleDataset> valid;
  std::shared_ptr<const SampleDataset> test;
};

// num_samples = {train, valid, test} samples the run will draw (Megatron: train_iters * global batch,
// (train_iters / eval_interval + 1) * eval_iters * global batch, eval_iters * global batch); 0 = that split
// is not built (null), < 0 = one epoch of it. A split that is empty (or too small for one sample) while
// samples are requested from it is a UserError. As Megatron's BlendedMegatronDatasetBuilder:
//   one prefix            -> a GPTDataset per split, asked for the split's samples;
//   weighted prefixes     -> per split a BlendedDataset of GPTDatasets asked for
//                            blend_per_dataset_num_samples each;
//   unweighted prefixes   -> one epoch of each GPTDataset, blended in proportion to their sizes:
//                            min(requested, total) samples, or every sample once (exhaustive) when no
//                            size is requested. Requesting more than one epoch holds is a UserError.
TrainValidTestDatasets build_train_valid_test_datasets(const DataConfig& config,
                                                       const std::array<int64_t, 3>& num_samples);

}  // namespace megatune::executor::data
