// PackInOrder against packs worked by hand from AutoModel's pack_dataset: a sample that would
// overflow the pack closes it and starts the next (never moved to a later pack with room, never
// split), an exact fit stays, a sample longer than a pack is dropped and the packing goes on.
#include "sampling/sequence_packing.h"

#include <cstdint>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace keel::sampling {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(SequencePackingTest, FillsInOrderAndStartsAPackWhereOneOverflows) {
  // 3 | 4 + 2 | 5 + 1 (an exact fit) | 6 (the whole pack) | 2: the 2 after 5 + 1 does not wait
  // for room in an earlier pack.
  const Packs packs = PackInOrder({3, 4, 2, 5, 1, 6, 2}, 6);
  EXPECT_THAT(packs.packs, ElementsAre(ElementsAre(0), ElementsAre(1, 2), ElementsAre(3, 4),
                                       ElementsAre(5), ElementsAre(6)));
  EXPECT_THAT(packs.dropped, IsEmpty());
}

TEST(SequencePackingTest, DropsSamplesLongerThanAPack) {
  const Packs packs = PackInOrder({2, 7, 3, 9, 1}, 6);
  EXPECT_THAT(packs.packs, ElementsAre(ElementsAre(0, 2, 4)));
  EXPECT_THAT(packs.dropped, ElementsAre(1, 3));
}

TEST(SequencePackingTest, EmptySamplesRideAlong) {
  EXPECT_THAT(PackInOrder({0, 4, 0, 2}, 4).packs,
              ElementsAre(ElementsAre(0, 1, 2), ElementsAre(3)));
}

TEST(SequencePackingTest, NothingToPack) {
  EXPECT_THAT(PackInOrder({}, 8).packs, IsEmpty());
  const Packs all_long = PackInOrder({9, 10}, 8);
  EXPECT_THAT(all_long.packs, IsEmpty());
  EXPECT_THAT(all_long.dropped, ElementsAre(0, 1));
}

}  // namespace
}  // namespace keel::sampling
