// NumpyRandomState: MT19937 with numpy's legacy seeding (randomkit / numpy/random/src/mt19937) and the
// draws Megatron's dataset code relies on.
#include "executor/data/numpy_random.h"

#include <cstring>

#include "base/user_error.h"

namespace megatune::executor::data {

namespace {
constexpr int kShift = 397;  // MT19937 "M"
constexpr uint32_t kMatrixA = 0x9908b0dfU;
constexpr uint32_t kUpperMask = 0x80000000U;
constexpr uint32_t kLowerMask = 0x7fffffffU;
}  // namespace

NumpyRandomState::NumpyRandomState(uint32_t seed) { seed_with(seed); }

NumpyRandomState::NumpyRandomState(std::span<const uint32_t> key) {
  if (key.empty()) throw UserError("random seed array is empty; give at least one seed value");
  seed_with(19650218U);
  size_t i = 1;
  size_t j = 0;
  for (size_t k = std::max<size_t>(kStateWords, key.size()); k > 0; --k) {
    key_[i] =
        (key_[i] ^ ((key_[i - 1] ^ (key_[i - 1] >> 30)) * 1664525U)) + key[j] + static_cast<uint32_t>(j);
    ++i;
    ++j;
    if (i >= static_cast<size_t>(kStateWords)) {
      key_[0] = key_[kStateWords - 1];
      i = 1;
    }
    if (j >= key.size()) j = 0;
  }
  for (size_t k = kStateWords - 1; k > 0; --k) {
    key_[i] = (key_[i] ^ ((key_[i - 1] ^ (key_[i - 1] >> 30)) * 1566083941U)) - static_cast<uint32_t>(i);
    ++i;
    if (i >= static_cast<size_t>(kStateWords)) {
      key_[0] = key_[kStateWords - 1];
      i = 1;
    }
  }
  key_[0] = 0x80000000U;
  position_ = kStateWords;
}

void NumpyRandomState::seed_with(uint32_t seed) {
  for (int pos = 0; pos < kStateWords; ++pos) {
    key_[pos] = seed;
    seed = 1812433253U * (seed ^ (seed >> 30)) + static_cast<uint32_t>(pos) + 1U;
  }
  position_ = kStateWords;
}

void NumpyRandomState::generate() {
  int i = 0;
  for (; i < kStateWords - kShift; ++i) {
    const uint32_t y = (key_[i] & kUpperMask) | (key_[i + 1] & kLowerMask);
    key_[i] = key_[i + kShift] ^ (y >> 1) ^ (-(y & 1U) & kMatrixA);
  }
  for (; i < kStateWords - 1; ++i) {
    const uint32_t y = (key_[i] & kUpperMask) | (key_[i + 1] & kLowerMask);
    key_[i] = key_[i + (kShift - kStateWords)] ^ (y >> 1) ^ (-(y & 1U) & kMatrixA);
  }
  const uint32_t y = (key_[kStateWords - 1] & kUpperMask) | (key_[0] & kLowerMask);
  key_[kStateWords - 1] = key_[kShift - 1] ^ (y >> 1) ^ (-(y & 1U) & kMatrixA);
  position_ = 0;
}

uint32_t NumpyRandomState::next_uint32() {
  if (position_ >= kStateWords) generate();
  uint32_t y = key_[position_++];
  y ^= (y >> 11);
  y ^= (y << 7) & 0x9d2c5680U;
  y ^= (y << 15) & 0xefc60000U;
  y ^= (y >> 18);
  return y;
}

uint64_t NumpyRandomState::next_uint64() {
  const uint64_t high = next_uint32();
  const uint64_t low = next_uint32();
  return (high << 32) | low;
}

double NumpyRandomState::random_sample() {
  const int32_t a = static_cast<int32_t>(next_uint32() >> 5);
  const int32_t b = static_cast<int32_t>(next_uint32() >> 6);
  return (a * 67108864.0 + b) / 9007199254740992.0;
}

uint64_t NumpyRandomState::random_interval(uint64_t max) {
  if (max == 0) return 0;
  uint64_t mask = max;
  mask |= mask >> 1;
  mask |= mask >> 2;
  mask |= mask >> 4;
  mask |= mask >> 8;
  mask |= mask >> 16;
  mask |= mask >> 32;
  uint64_t value;
  if (max <= 0xffffffffULL) {
    while ((value = (next_uint32() & mask)) > max) {
    }
  } else {
    while ((value = (next_uint64() & mask)) > max) {
    }
  }
  return value;
}

std::vector<uint8_t> NumpyRandomState::serialize() const {
  std::vector<uint8_t> bytes(4 + sizeof(key_));
  const uint32_t position = static_cast<uint32_t>(position_);
  std::memcpy(bytes.data(), &position, 4);
  std::memcpy(bytes.data() + 4, key_.data(), sizeof(key_));
  return bytes;
}

NumpyRandomState NumpyRandomState::deserialize(std::span<const uint8_t> bytes) {
  NumpyRandomState state(0U);
  uint32_t position = 0;
  if (bytes.size() == 4 + sizeof(state.key_)) std::memcpy(&position, bytes.data(), 4);
  if (bytes.size() != 4 + sizeof(state.key_) || position > static_cast<uint32_t>(kStateWords)) {
    throw UserError("saved MT19937 random state is malformed (" + std::to_string(bytes.size()) +
                    " bytes); the checkpoint is damaged, load an earlier one");
  }
  std::memcpy(state.key_.data(), bytes.data() + 4, sizeof(state.key_));
  state.position_ = static_cast<int>(position);
  return state;
}

}  // namespace megatune::executor::data
