// NumpyRandomState: numpy's legacy numpy.random.RandomState (MT19937) reproduced bit-exactly: seeding by
// an integer (init_genrand) or an array (init_by_array), raw outputs, random_sample, random_interval and
// the legacy in-place shuffle that Megatron's GPTDataset uses to build its indices.
#pragma once
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace megatune::executor::data {

class NumpyRandomState {
 public:
  static constexpr int kStateWords = 624;

  // numpy.random.RandomState(seed) for an integer seed in [0, 2^32): MT19937 init_genrand(seed).
  explicit NumpyRandomState(uint32_t seed = 1234);
  // numpy.random.RandomState([k0, k1, ...]): MT19937 init_by_array(key). Throws UserError if empty.
  explicit NumpyRandomState(std::span<const uint32_t> key);

  uint32_t next_uint32();  // one MT19937 output (genrand_int32)
  uint64_t next_uint64();  // (first output << 32) | second output, as numpy's mt19937_next64
  double random_sample();  // numpy random_sample(): 53-bit double in [0, 1)
  // numpy's random_interval(max): uniform in [0, max] by masked rejection sampling (32-bit draws when
  // max < 2^32, else 64-bit draws).
  uint64_t random_interval(uint64_t max);

  // numpy RandomState.shuffle on a 1-D array: for i = n-1 down to 1, swap x[i] with x[random_interval(i)].
  template <typename T>
  void shuffle(std::span<T> values) {
    for (size_t i = values.size(); i-- > 1;) {
      const size_t j = static_cast<size_t>(random_interval(i));
      std::swap(values[i], values[j]);
    }
  }

  // The 624 state words and the position, as numpy's get_state()[1] and [2].
  const std::array<uint32_t, kStateWords>& state_words() const { return key_; }
  int position() const { return position_; }

  // State as bytes (for checkpoints) and back. Throws UserError on a malformed byte string.
  std::vector<uint8_t> serialize() const;
  static NumpyRandomState deserialize(std::span<const uint8_t> bytes);

 private:
  void seed_with(uint32_t seed);
  void generate();  // refills key_ (the MT19937 "twist")

  std::array<uint32_t, kStateWords> key_{};
  int position_ = kStateWords;
};

}  // namespace megatune::executor::data
