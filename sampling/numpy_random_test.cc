#include "sampling/numpy_random.h"

#include <cstdint>
#include <numeric>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace keel::sampling {
namespace {

using ::absl::StatusCode;
using ::keel::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Expected values printed by numpy 1.24.2 (Debian's python3-numpy), e.g.
//   numpy.random.RandomState(0)._bit_generator.random_raw(3)

TEST(NumpyRandomStateTest, RawDrawsMatchNumpy) {
  // RandomState(s)._bit_generator.random_raw(3)
  const std::vector<std::pair<int64_t, std::vector<uint32_t>>> cases = {
      {0, {2357136044u, 2546248239u, 3071714933u}},
      {1234, {822569775u, 2137449171u, 2671936806u}},
      {4294967295, {419326371u, 479346978u, 3918654476u}},
  };
  for (const auto& [seed, expected] : cases) {
    SCOPED_TRACE(seed);
    KEEL_ASSERT_OK_AND_ASSIGN(NumpyRandomState rng, NumpyRandomState::Create(seed));
    for (uint32_t value : expected) EXPECT_EQ(rng.NextUint32(), value);
  }
}

TEST(NumpyRandomStateTest, RandomSampleMatchesNumpy) {
  // repr(x) for x in RandomState(0).random_sample(3)
  KEEL_ASSERT_OK_AND_ASSIGN(NumpyRandomState rng, NumpyRandomState::Create(0));
  EXPECT_EQ(rng.RandomSample(), 0.5488135039273248);
  EXPECT_EQ(rng.RandomSample(), 0.7151893663724195);
  EXPECT_EQ(rng.RandomSample(), 0.6027633760716439);
}

TEST(NumpyRandomStateTest, ShuffleMatchesNumpy) {
  // a = numpy.arange(10, dtype=numpy.int32); RandomState(1234).shuffle(a)
  KEEL_ASSERT_OK_AND_ASSIGN(NumpyRandomState rng, NumpyRandomState::Create(1234));
  std::vector<int32_t> small(10);
  std::iota(small.begin(), small.end(), 0);
  rng.Shuffle(small.data(), static_cast<int64_t>(small.size()));
  EXPECT_THAT(small, ElementsAre(7, 2, 9, 1, 0, 8, 4, 5, 6, 3));

  // a = numpy.arange(1000, dtype=numpy.uint32); rs = RandomState(4294967295); rs.shuffle(a);
  // a[:10], then rs._bit_generator.random_raw(1): the shuffle drew exactly as numpy did.
  KEEL_ASSERT_OK_AND_ASSIGN(rng, NumpyRandomState::Create(4294967295));
  std::vector<uint32_t> large(1000);
  std::iota(large.begin(), large.end(), 0u);
  rng.Shuffle(large.data(), static_cast<int64_t>(large.size()));
  EXPECT_THAT(std::vector<uint32_t>(large.begin(), large.begin() + 10),
              ElementsAre(94, 405, 819, 632, 217, 169, 449, 275, 165, 828));
  EXPECT_EQ(rng.NextUint32(), 442012709u);
}

TEST(NumpyRandomStateTest, WideIntervalsDrawSixtyFourBits) {
  // RandomState(7).randint(0, 2**40, size=3, dtype=numpy.uint64): masked rejection with
  // 64-bit draws, high word first.
  KEEL_ASSERT_OK_AND_ASSIGN(NumpyRandomState rng, NumpyRandomState::Create(7));
  const uint64_t max = (uint64_t{1} << 40) - 1;
  EXPECT_EQ(rng.RandomInterval(max), 752595690692u);
  EXPECT_EQ(rng.RandomInterval(max), 108744157686u);
  EXPECT_EQ(rng.RandomInterval(max), 291964244179u);
}

TEST(NumpyRandomStateTest, IntervalOfZeroDrawsNothing) {
  KEEL_ASSERT_OK_AND_ASSIGN(NumpyRandomState rng, NumpyRandomState::Create(0));
  EXPECT_EQ(rng.RandomInterval(0), 0u);
  EXPECT_EQ(rng.NextUint32(), 2357136044u);  // still the first draw
}

TEST(NumpyRandomStateTest, RejectsSeedsNumpyRejects) {
  EXPECT_THAT(NumpyRandomState::Create(-1),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("random seed -1")));
  EXPECT_THAT(NumpyRandomState::Create(int64_t{1} << 32),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("[0, 2^32 - 1]")));
}

}  // namespace
}  // namespace keel::sampling
