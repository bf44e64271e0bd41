// The collectives on real Gloo ranks (threads), including one rank failing among two and three,
// and on a device group (the NCCL-like group of a fake GPU's tensors).
#include "base/collectives.h"

#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/ranks.h"
#include "testing/status_matchers.h"

namespace keel::base {
namespace {

using ::keel::testing::Rank;
using ::keel::testing::RunOnRanks;
using ::keel::testing::RunOnRanksNcclLike;
using ::keel::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(AllReduceTest, SumMaxAndMinOverThreeRanks) {
  std::vector<std::vector<int64_t>> results(3);
  KEEL_ASSERT_OK(RunOnRanks(3, [&](Rank& r) -> absl::Status {
    for (Reduce op : {Reduce::kSum, Reduce::kMax, Reduce::kMin}) {
      at::Tensor value = at::full({1}, r.rank + 1, at::kLong);
      KEEL_RETURN_IF_ERROR(AllReduce(value, op, *r.group, "a test value"));
      results[r.rank].push_back(value.item<int64_t>());
    }
    return absl::OkStatus();
  }));
  for (const auto& result : results) EXPECT_THAT(result, ElementsAre(1 + 2 + 3, 3, 1));
}

TEST(AllGatherBytesTest, PayloadsOfEveryLengthInRankOrder) {
  std::vector<std::vector<std::string>> gathered(3);
  KEEL_ASSERT_OK(RunOnRanks(3, [&](Rank& r) -> absl::Status {
    KEEL_ASSIGN_OR_RETURN(gathered[r.rank],
                          AllGatherBytes(std::string(r.rank * 3, 'a' + r.rank), *r.group, "bytes"));
    return absl::OkStatus();
  }));
  for (const auto& g : gathered) EXPECT_THAT(g, ElementsAre("", "bbb", "cccccc"));
}

// One rank fails: every rank returns that rank's status, code and message, and none waits.
TEST(AgreeOnStatusTest, EveryRankReturnsTheFailingRanksStatus) {
  for (int world : {2, 3}) {
    SCOPED_TRACE(absl::StrCat("world_size=", world));
    std::vector<absl::Status> statuses(world);
    KEEL_ASSERT_OK(RunOnRanks(world, [&](Rank& r) -> absl::Status {
      const absl::Status mine =
          r.rank == 1 ? absl::DataLossError("shard 1 is corrupt") : absl::OkStatus();
      statuses[r.rank] = AgreeOnStatus(mine, r.group.get(), "a decision");
      return absl::OkStatus();
    }));
    for (const absl::Status& status : statuses) {
      EXPECT_THAT(status, StatusIs(absl::StatusCode::kDataLoss, "rank 1: shard 1 is corrupt"));
    }
  }
}

// A failing rank keeps its status; its peers learn of the lowest failing rank in one
// all-reduce; with no failure every rank gets OK.
TEST(AgreeOnFailureTest, PeersLearnTheLowestFailingRank) {
  for (int world : {2, 3}) {
    SCOPED_TRACE(absl::StrCat("world_size=", world));
    std::vector<absl::Status> failed(world), fine(world);
    KEEL_ASSERT_OK(RunOnRanks(world, [&](Rank& r) -> absl::Status {
      const absl::Status mine = r.rank >= 1
                                    ? absl::InternalError(absl::StrCat("step threw on ", r.rank))
                                    : absl::OkStatus();
      failed[r.rank] = AgreeOnFailure(mine, *r.group, at::kCPU, "stepping the shards");
      fine[r.rank] = AgreeOnFailure(absl::OkStatus(), *r.group, at::kCPU, "stepping the shards");
      return absl::OkStatus();
    }));
    EXPECT_THAT(failed[0], StatusIs(absl::StatusCode::kAborted,
                                    "rank 1 failed stepping the shards; see its error"));
    for (int rank = 1; rank < world; ++rank) {
      EXPECT_THAT(failed[rank],
                  StatusIs(absl::StatusCode::kInternal, absl::StrCat("step threw on ", rank)));
    }
    for (const absl::Status& status : fine) KEEL_EXPECT_OK(status);
  }
}

TEST(CheckGroupCarriesTest, DeviceGroupsCarryDeviceTensorsAndGlooGroupsHostTensors) {
  KEEL_EXPECT_OK(CheckGroupCarries(nullptr, at::kCPU, "alone"));
  KEEL_ASSERT_OK(RunOnRanksNcclLike(2, [&](Rank& r) -> absl::Status {
    KEEL_EXPECT_OK(CheckGroupCarries(r.group.get(), r.device, "the gradient buckets"));
    KEEL_EXPECT_OK(CheckGroupCarries(r.host_group.get(), at::kCPU, "the checkpointer"));
    EXPECT_THAT(CheckGroupCarries(r.group.get(), at::kCPU, "the step scheduler's exchanges"),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         "the step scheduler's exchanges: a host (cpu) tensor cannot go over a "
                         "process group of backend \"nccl\", which carries device tensors only; "
                         "keep it on the group's device, or exchange host values over a Gloo "
                         "group of the same ranks"));
    EXPECT_THAT(CheckGroupCarries(r.host_group.get(), r.device, "the loss sum"),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         absl::StrCat("the loss sum: a ", r.device.str(),
                                      " tensor cannot go over a process group of backend "
                                      "\"gloo\", which Keel uses for host (cpu) tensors only; "
                                      "copy it to the host, or use the device group of the same "
                                      "ranks")));
    return absl::OkStatus();
  }));
}

// On a device group the helpers refuse a host tensor, naming the exchange, before c10d sees
// it; device tensors go through, and agreement works on the group's device.
TEST(CollectivesOnADeviceGroupTest, HostTensorsAreRefusedDeviceTensorsExchanged) {
  std::vector<absl::Status> failed(2);
  KEEL_ASSERT_OK(RunOnRanksNcclLike(2, [&](Rank& r) -> absl::Status {
    at::Tensor host = at::ones({1});
    EXPECT_THAT(AllReduce(host, Reduce::kSum, *r.group, "the norm"),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("all-reducing the norm: a host (cpu) tensor")));
    EXPECT_THAT(AllGatherBytes("plan", *r.group, "the plans"),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("all-gathering the plans: a host (cpu) tensor")));
    at::Tensor device = at::full({1}, r.rank + 1, at::kLong).to(r.device);
    KEEL_RETURN_IF_ERROR(AllReduce(device, Reduce::kSum, *r.group, "the norm"));
    EXPECT_EQ(device.cpu().item<int64_t>(), 1 + 2);
    const absl::Status mine = r.rank == 1 ? absl::InternalError("step threw") : absl::OkStatus();
    failed[r.rank] = AgreeOnFailure(mine, *r.group, r.device, "stepping the shards");
    return absl::OkStatus();
  }));
  EXPECT_THAT(failed[0], StatusIs(absl::StatusCode::kAborted,
                                  "rank 1 failed stepping the shards; see its error"));
  EXPECT_THAT(failed[1], StatusIs(absl::StatusCode::kInternal, "step threw"));
}

TEST(ExchangeWithStatusTest, PayloadsWhenAllSucceedAndAloneWithoutAGroup) {
  std::vector<std::vector<std::string>> payloads(2);
  KEEL_ASSERT_OK(RunOnRanks(2, [&](Rank& r) -> absl::Status {
    KEEL_ASSIGN_OR_RETURN(payloads[r.rank],
                          ExchangeWithStatus(absl::OkStatus(), absl::StrCat("plan ", r.rank),
                                             r.group.get(), "plans"));
    return absl::OkStatus();
  }));
  for (const auto& p : payloads) EXPECT_THAT(p, ElementsAre("plan 0", "plan 1"));
  EXPECT_THAT(ExchangeWithStatus(absl::NotFoundError("gone"), "", nullptr, "alone"),
              StatusIs(absl::StatusCode::kNotFound, "gone"));
}

}  // namespace
}  // namespace keel::base
