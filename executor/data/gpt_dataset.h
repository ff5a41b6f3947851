// GPTDataset: Megatron's GPT sampling over a SequenceSource (a split of it, several epochs, shuffled),
// with the indices of gpt_dataset_indices.h built once and held in memory.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "executor/data/gpt_dataset_indices.h"
#include "executor/data/sample_dataset.h"
#include "executor/data/sequence_source.h"

namespace megatune::executor::data {

struct GPTDatasetConfig {
  int64_t sequence_length = 0;  // --seq-length
  uint32_t random_seed = 1234;  // --seed
  bool add_extra_token_to_sequence = true;
  bool drop_last_partial_sequence = true;
  bool eod_mask_loss = false;  // --eod-mask-loss: positions whose input token is eod_token get mask 0
  int32_t eod_token = -1;
  // Padding (a short last sample when the partial sequence is kept) is written as token 0 and masked,
  // as Megatron does for a tokenizer without a pad id.
  int32_t pad_token = 0;
  int64_t vocab_size = 0;  // > 0: a token id >= vocab_size is a UserError naming the dataset
};

class GPTDataset final : public SampleDataset {
 public:
  // Samples from the sequences `sequence_ids` of `source` (a split). num_samples < 0: exactly one epoch.
  // The dataset holds at least num_samples samples (more: the rest of the last epoch).
  GPTDataset(std::shared_ptr<const SequenceSource> source, std::vector<int32_t> sequence_ids,
             int64_t num_samples, GPTDatasetConfig config);

  int64_t num_samples() const override { return indices_.num_samples(); }
  int64_t sequence_length() const override { return config_.sequence_length; }
  void get_sample(int64_t index, int32_t* tokens, int32_t* labels, float* loss_mask) const override;
  std::string description() const override;

  const GPTDatasetIndices& indices() const { return indices_; }
  const GPTDatasetConfig& config() const { return config_; }
  // The s + extra tokens of sample `index` before the split into tokens and labels, padded with
  // pad_token; returns how many of them are real tokens.
  int64_t read_sample_text(int64_t index, int32_t* text) const;

 private:
  std::shared_ptr<const SequenceSource> source_;
  std::vector<int32_t> sequence_ids_;
  GPTDatasetConfig config_;
  GPTDatasetIndices indices_;
};

}  // namespace megatune::executor::data
