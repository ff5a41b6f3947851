// MockSequenceSource: deterministic synthetic documents for --mock-data, modelled on Megatron's
// MockGPTLowLevelDataset (documents of random length holding 1, 2, 3, ... and an EOD token).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "executor/data/sequence_source.h"

namespace megatune::executor::data {

struct MockDataConfig {
  int64_t num_sequences = 100000;      // Megatron: size = 100000
  int32_t max_sequence_length = 4096;  // lengths drawn uniformly from [1, max_sequence_length)
  uint32_t seed = 0;                   // Megatron: seed = 0
  int64_t vocab_size = 0;              // > 2; content tokens stay below it
  int32_t eod_token = 0;               // last token of every document; must be < vocab_size
};

// Sequence i has length L_i drawn with NumpyRandomState(seed).random_interval(max_len - 2) + 1 (Megatron
// draws the lengths with numpy's PCG64 generator instead, so lengths differ from Megatron's; the content
// rule is Megatron's). Its tokens are 1 + (t mod (vocab_size - 1)) for t = 0 .. L_i - 2, then eod_token.
// With vocab_size > max_sequence_length this is exactly Megatron's arange(L - 1) + 1 followed by EOD.
class MockSequenceSource final : public SequenceSource {
 public:
  explicit MockSequenceSource(MockDataConfig config);  // throws UserError on a bad config

  int64_t num_sequences() const override { return config_.num_sequences; }
  const std::vector<int32_t>& sequence_lengths() const override { return sequence_lengths_; }
  void read_tokens(int64_t sequence, int64_t offset, int64_t length, int32_t* out) const override;
  std::string description() const override;
  const MockDataConfig& config() const { return config_; }

 private:
  MockDataConfig config_;
  std::vector<int32_t> sequence_lengths_;  // (num_sequences)
};

}  // namespace megatune::executor::data
