// SampleDataset: what the data loader reads, a numbered list of training samples of fixed length
// (tokens, labels and loss mask), implemented by GPTDataset and BlendedDataset.
#pragma once
#include <cstdint>
#include <string>

namespace megatune::executor::data {

class SampleDataset {
 public:
  virtual ~SampleDataset() = default;
  virtual int64_t num_samples() const = 0;
  virtual int64_t sequence_length() const = 0;  // s
  // Fills sample `index` (0 <= index < num_samples()): tokens[s], labels[s] (next tokens) and
  // loss_mask[s] (1 for a real label; 0 for padding and, with eod_mask_loss, where the input token is EOD).
  virtual void get_sample(int64_t index, int32_t* tokens, int32_t* labels, float* loss_mask) const = 0;
  virtual std::string description() const = 0;
};

}  // namespace megatune::executor::data
