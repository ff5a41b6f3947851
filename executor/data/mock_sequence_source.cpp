// MockSequenceSource: synthetic documents for --mock-data (lengths from MT19937, content 1, 2, 3, ..., EOD).
#include "executor/data/mock_sequence_source.h"

#include "base/user_error.h"
#include "executor/data/numpy_random.h"

namespace megatune::executor::data {

MockSequenceSource::MockSequenceSource(MockDataConfig config) : config_(config) {
  if (config_.num_sequences < 1) throw UserError("mock data needs at least 1 sequence");
  if (config_.max_sequence_length < 2) {
    throw UserError("mock data max sequence length must be at least 2, got " +
                    std::to_string(config_.max_sequence_length));
  }
  if (config_.vocab_size < 3) {
    throw UserError("mock data needs --vocab-size of at least 3, got " + std::to_string(config_.vocab_size));
  }
  if (config_.eod_token < 0 || config_.eod_token >= config_.vocab_size) {
    throw UserError("mock data EOD token " + std::to_string(config_.eod_token) +
                    " is outside the vocabulary of " + std::to_string(config_.vocab_size));
  }
  NumpyRandomState random_state(config_.seed);
  sequence_lengths_.resize(static_cast<size_t>(config_.num_sequences));
  for (auto& length : sequence_lengths_) {
    length = 1 + static_cast<int32_t>(
                     random_state.random_interval(static_cast<uint64_t>(config_.max_sequence_length - 2)));
  }
}

void MockSequenceSource::read_tokens(int64_t sequence, int64_t offset, int64_t length, int32_t* out) const {
  if (sequence < 0 || sequence >= config_.num_sequences) {
    throw UserError("mock data: sequence " + std::to_string(sequence) + " requested but it holds " +
                    std::to_string(config_.num_sequences));
  }
  const int64_t sequence_length = sequence_lengths_[static_cast<size_t>(sequence)];
  if (offset < 0 || length < 0 || offset + length > sequence_length) {
    throw UserError("mock data: tokens [" + std::to_string(offset) + ", " + std::to_string(offset + length) +
                    ") requested from sequence " + std::to_string(sequence) + " of length " +
                    std::to_string(sequence_length));
  }
  const int64_t content_range = config_.vocab_size - 1;
  for (int64_t i = 0; i < length; ++i) {
    const int64_t t = offset + i;
    out[i] = t == sequence_length - 1 ? config_.eod_token : static_cast<int32_t>(1 + t % content_range);
  }
}

std::string MockSequenceSource::description() const {
  return "mock data (" + std::to_string(config_.num_sequences) + " documents, seed " +
         std::to_string(config_.seed) + ")";
}

}  // namespace megatune::executor::data
