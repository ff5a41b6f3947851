// Tests NumpyRandomState against reference values printed by numpy 1.24 (legacy RandomState / MT19937).
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "executor/data/numpy_random.h"

namespace megatune::executor::data {
namespace {

TEST(NumpyRandomState, IntegerSeedStateMatchesNumpy) {
  // numpy.random.RandomState(1234).get_state(): key[0..3], key[623], pos
  NumpyRandomState state(1234);
  EXPECT_EQ(state.state_words()[0], 0x4d2u);
  EXPECT_EQ(state.state_words()[1], 0xbc5448dbu);
  EXPECT_EQ(state.state_words()[2], 0xf22bde9fu);
  EXPECT_EQ(state.state_words()[3], 0xebb44f8fu);
  EXPECT_EQ(state.state_words()[623], 0xb6a83c43u);
  EXPECT_EQ(state.position(), 624);
}

TEST(NumpyRandomState, RawOutputsMatchNumpy) {
  // MT19937()._legacy_seeding(1234).random_raw(5)
  NumpyRandomState state(1234);
  const std::vector<uint32_t> expected{822569775u, 2137449171u, 2671936806u, 3512589365u, 1880026316u};
  for (const uint32_t value : expected) EXPECT_EQ(state.next_uint32(), value);
  // The published MT19937 reference: init_genrand(5489) starts 3499211612, 581869302, 3890346734.
  NumpyRandomState reference(5489);
  EXPECT_EQ(reference.next_uint32(), 3499211612u);
  EXPECT_EQ(reference.next_uint32(), 581869302u);
  EXPECT_EQ(reference.next_uint32(), 3890346734u);
}

TEST(NumpyRandomState, ArraySeedMatchesNumpy) {
  // numpy.random.RandomState([1, 2, 3]): key[0..2], key[623], then random_raw(3)
  const std::vector<uint32_t> key{1, 2, 3};
  NumpyRandomState state{std::span<const uint32_t>(key)};
  EXPECT_EQ(state.state_words()[0], 2147483648u);
  EXPECT_EQ(state.state_words()[1], 188977461u);
  EXPECT_EQ(state.state_words()[2], 1294596893u);
  EXPECT_EQ(state.state_words()[623], 2738794993u);
  EXPECT_EQ(state.next_uint32(), 2619334238u);
  EXPECT_EQ(state.next_uint32(), 1552691353u);
  EXPECT_EQ(state.next_uint32(), 3808334787u);
}

TEST(NumpyRandomState, RandomSampleMatchesNumpy) {
  NumpyRandomState state(1234);
  EXPECT_DOUBLE_EQ(state.random_sample(), 0.1915194503788923);
  EXPECT_DOUBLE_EQ(state.random_sample(), 0.6221087710398319);
  EXPECT_DOUBLE_EQ(state.random_sample(), 0.4377277390071145);
}

TEST(NumpyRandomState, ShuffleMatchesNumpy) {
  NumpyRandomState state(1234);
  std::vector<int32_t> a(10);
  std::iota(a.begin(), a.end(), 0);
  state.shuffle(std::span<int32_t>(a));
  EXPECT_EQ(a, (std::vector<int32_t>{7, 2, 9, 1, 0, 8, 4, 5, 6, 3}));
  std::vector<int64_t> b(10);  // the same RandomState continues
  std::iota(b.begin(), b.end(), 0);
  state.shuffle(std::span<int64_t>(b));
  EXPECT_EQ(b, (std::vector<int64_t>{7, 3, 5, 1, 4, 8, 0, 2, 6, 9}));

  NumpyRandomState seed0(0);
  std::vector<int32_t> c{0, 1, 2, 3, 4};
  seed0.shuffle(std::span<int32_t>(c));
  EXPECT_EQ(c, (std::vector<int32_t>{2, 0, 1, 3, 4}));
}

TEST(NumpyRandomState, LargeShuffleMatchesNumpy) {
  NumpyRandomState state(1234);
  std::vector<uint32_t> a(1000);
  std::iota(a.begin(), a.end(), 0u);
  state.shuffle(std::span<uint32_t>(a));
  EXPECT_EQ(std::vector<uint32_t>(a.begin(), a.begin() + 8),
            (std::vector<uint32_t>{681, 990, 155, 768, 438, 363, 688, 555}));
  int64_t weighted = 0;
  for (size_t i = 0; i < a.size(); ++i) weighted += static_cast<int64_t>(i) * a[i];
  EXPECT_EQ(weighted, 251398022);
}

TEST(NumpyRandomState, SixtyFourBitIntervalMatchesNumpyRandint) {
  // RandomState(1234).randint(0, 2**40 + 5, dtype=int64) uses the same masked 64-bit rejection.
  NumpyRandomState state(1234);
  const uint64_t max = (uint64_t{1} << 40) + 4;
  EXPECT_EQ(state.random_interval(max), 878802328948u);
  EXPECT_EQ(state.random_interval(max), 656147994617u);
  EXPECT_EQ(state.random_interval(max), 617876871857u);
  EXPECT_EQ(state.random_interval(0), 0u);
}

TEST(NumpyRandomState, SerializeRoundTripContinuesTheStream) {
  NumpyRandomState state(42);
  for (int i = 0; i < 700; ++i) state.next_uint32();
  const auto bytes = state.serialize();
  NumpyRandomState restored = NumpyRandomState::deserialize(bytes);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(restored.next_uint32(), state.next_uint32());
  std::vector<uint8_t> damaged(bytes.begin(), bytes.end() - 1);
  EXPECT_ANY_THROW(NumpyRandomState::deserialize(damaged));
}

}  // namespace
}  // namespace megatune::executor::data
