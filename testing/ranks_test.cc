#include "testing/ranks.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"
#include "torch/types.h"

namespace keel::testing {
namespace {

using ::testing::HasSubstr;

TEST(RunOnRanksTest, EveryRankJoinsOneGroupAndAllReducesMax) {
  for (int world : {1, 2, 3, 4}) {
    SCOPED_TRACE(world);
    std::vector<int64_t> maxima(world, -1);
    KEEL_ASSERT_OK(RunOnRanks(world, [&](Rank& r) {
      std::vector<at::Tensor> tensors = {torch::full({1}, r.rank * 10, torch::kInt64)};
      c10d::AllreduceOptions options;
      options.reduceOp = c10d::ReduceOp::MAX;
      r.group->allreduce(tensors, options)->wait();
      maxima[r.rank] = tensors[0].item<int64_t>();
      return absl::OkStatus();
    }));
    for (int64_t maximum : maxima) EXPECT_EQ(maximum, (world - 1) * 10);
  }
}

// Every rank reads what rank 0 wrote (get waits for the key), and no group was built.
TEST(RunOnRanksWithStoreTest, RanksShareTheStoreAndGetNoGroup) {
  std::vector<std::string> seen(3);
  KEEL_ASSERT_OK(RunOnRanksWithStore(3, [&](Rank& r) {
    if (r.group) return absl::InternalError("a group was built");
    if (r.rank == 0) r.store->set("greeting", std::vector<uint8_t>{'h', 'i'});
    const std::vector<uint8_t> value = r.store->get("greeting");
    seen[r.rank] = std::string(value.begin(), value.end());
    return absl::OkStatus();
  }));
  for (const std::string& value : seen) EXPECT_EQ(value, "hi");
}

TEST(RunOnRanksTest, ReportsTheFailingRankAndCatchesExceptions) {
  EXPECT_THAT(RunOnRanks(3,
                         [](Rank& r) {
                           return r.rank == 1 ? absl::DataLossError("bad shard") : absl::OkStatus();
                         }),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("rank 1: bad shard")));
  EXPECT_THAT(RunOnRanks(2,
                         [](Rank& r) -> absl::Status {
                           if (r.rank == 0) TORCH_CHECK(false, "boom");
                           return absl::OkStatus();
                         }),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("rank 0: exception: boom")));
}

}  // namespace
}  // namespace keel::testing
