// SequenceSource: the low-level dataset interface (a list of token sequences), implemented by the
// Megatron indexed dataset reader and by the mock dataset; GPTDataset samples from it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace megatune::executor::data {

class SequenceSource {
 public:
  virtual ~SequenceSource() = default;
  virtual int64_t num_sequences() const = 0;
  // Token count of every sequence, indexed by sequence id.  // (num_sequences)
  virtual const std::vector<int32_t>& sequence_lengths() const = 0;
  // Copies tokens [offset, offset + length) of sequence `sequence` into out[0..length), widened to int32.
  // Throws UserError if the range lies outside the sequence.
  virtual void read_tokens(int64_t sequence, int64_t offset, int64_t length, int32_t* out) const = 0;
  // What the source is, for error messages ("indexed dataset /data/x_text_document", "mock data").
  virtual std::string description() const = 0;
};

}  // namespace megatune::executor::data
