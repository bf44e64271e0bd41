// The NCCL stand-in: each exchange Keel uses gives, on the fake GPU, what the arithmetic says,
// and a host tensor is refused as LibTorch 2.x refuses it on an NCCL group.
#include "testing/nccl_like_group.h"

#include <cstdint>
#include <vector>

#include "ATen/ATen.h"
#include "absl/status/status.h"
#include "base/torch_status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/fake_gpu.h"
#include "testing/ranks.h"
#include "testing/status_matchers.h"

namespace keel::testing {
namespace {

using ::testing::HasSubstr;

// [rank * 10 + 0, rank * 10 + 1, ...] of `n` elements on `device`.
at::Tensor Ramp(int rank, int64_t n, const at::Device& device) {
  return (at::arange(n, at::kFloat) + 10.0 * rank).to(device);
}

TEST(NcclLikeGroupTest, RanksGetTheFakeGpuAndAGlooTwin) {
  KEEL_ASSERT_OK(RunOnRanksNcclLike(2, [](Rank& r) -> absl::Status {
    EXPECT_EQ(r.device, FakeGpu(static_cast<c10::DeviceIndex>(r.rank)));
    EXPECT_EQ(r.group->getBackendName(), "nccl");
    EXPECT_EQ(r.host_group->getBackendName(), "gloo");
    EXPECT_EQ(r.group->getRank(), r.rank);
    EXPECT_EQ(r.group->getSize(), 2);
    return absl::OkStatus();
  }));
}

TEST(NcclLikeGroupTest, CollectivesOnTheFakeGpuComputeOnTheRanksData) {
  constexpr int kWorld = 3;
  KEEL_ASSERT_OK(RunOnRanksNcclLike(kWorld, [](Rank& r) -> absl::Status {
    const at::Device device = r.device;
    // allreduce: sum of the ramps = 3 * [0, 1, 2, 3] + 10 * (0 + 1 + 2).
    std::vector<at::Tensor> sum = {Ramp(r.rank, 4, device)};
    r.group->allreduce(sum)->wait();
    EXPECT_EQ(sum[0].device(), device);
    EXPECT_TRUE(at::equal(sum[0].cpu(), at::arange(4, at::kFloat) * kWorld + 30.0));

    // broadcast from rank 2.
    std::vector<at::Tensor> from_two = {Ramp(r.rank, 2, device)};
    c10d::BroadcastOptions root;
    root.rootRank = 2;
    r.group->broadcast(from_two, root)->wait();
    EXPECT_TRUE(at::equal(from_two[0].cpu(), Ramp(2, 2, at::kCPU)));

    // allgather (list) and _allgather_base (flat): rank order.
    std::vector<at::Tensor> mine = {Ramp(r.rank, 2, device)};
    std::vector<std::vector<at::Tensor>> lists(1);
    for (int k = 0; k < kWorld; ++k) lists[0].push_back(at::empty({2}, mine[0].options()));
    r.group->allgather(lists, mine)->wait();
    at::Tensor flat = at::empty({2 * kWorld}, mine[0].options());
    r.group->_allgather_base(flat, mine[0])->wait();
    for (int k = 0; k < kWorld; ++k) {
      EXPECT_TRUE(at::equal(lists[0][k].cpu(), Ramp(k, 2, at::kCPU)));
      EXPECT_TRUE(at::equal(flat.cpu().narrow(0, 2 * k, 2), Ramp(k, 2, at::kCPU)));
    }

    // _reduce_scatter_base: rank r gets elements [2r, 2r + 2) of the sum.
    at::Tensor whole = Ramp(r.rank, 2 * kWorld, device);
    at::Tensor part = at::empty({2}, whole.options());
    r.group->_reduce_scatter_base(part, whole)->wait();
    EXPECT_TRUE(at::equal(part.cpu(), (at::arange(2, at::kFloat) + 2 * r.rank) * kWorld + 30.0));

    // alltoall_base with uneven splits: rank r sends k + 1 copies of r to rank k.
    std::vector<int64_t> send_sizes, receive_sizes;
    std::vector<at::Tensor> pieces;
    for (int k = 0; k < kWorld; ++k) {
      send_sizes.push_back(k + 1);
      receive_sizes.push_back(r.rank + 1);
      pieces.push_back(at::full({k + 1}, static_cast<float>(r.rank)));
    }
    at::Tensor outbound = at::cat(pieces).to(device);
    at::Tensor inbound = at::empty({kWorld * (r.rank + 1)}, outbound.options());
    r.group->alltoall_base(inbound, outbound, receive_sizes, send_sizes)->wait();
    for (int k = 0; k < kWorld; ++k) {
      EXPECT_TRUE(at::equal(inbound.cpu().narrow(0, k * (r.rank + 1), r.rank + 1),
                            at::full({r.rank + 1}, static_cast<float>(k))));
    }

    // send/recv around a ring: even ranks send first, odd ranks receive first.
    std::vector<at::Tensor> outgoing = {Ramp(r.rank, 3, device)};
    std::vector<at::Tensor> incoming = {at::empty({3}, outgoing[0].options())};
    const int next = (r.rank + 1) % kWorld, previous = (r.rank + kWorld - 1) % kWorld;
    if (r.rank % 2 == 0) {
      r.group->send(outgoing, next, 0)->wait();
      r.group->recv(incoming, previous, 0)->wait();
    } else {
      r.group->recv(incoming, previous, 0)->wait();
      r.group->send(outgoing, next, 0)->wait();
    }
    EXPECT_TRUE(at::equal(incoming[0].cpu(), Ramp(previous, 3, at::kCPU)));
    r.group->barrier()->wait();
    return absl::OkStatus();
  }));
}

TEST(NcclLikeGroupTest, RefusesHostTensorsAsNcclDoes) {
  KEEL_ASSERT_OK(RunOnRanksNcclLike(2, [](Rank& r) -> absl::Status {
    std::vector<at::Tensor> host = {at::ones({2})};
    EXPECT_THAT(base::CallTorch(absl::StatusCode::kUnavailable, "all-reducing",
                                [&] { r.group->allreduce(host)->wait(); }),
                StatusIs(absl::StatusCode::kUnavailable,
                         HasSubstr("No backend type associated with device type cpu")));
    at::Tensor device_output = at::empty({4}, at::TensorOptions().device(r.device));
    EXPECT_THAT(base::CallTorch(absl::StatusCode::kUnavailable, "all-gathering",
                                [&] { r.group->_allgather_base(device_output, host[0]); }),
                StatusIs(absl::StatusCode::kUnavailable, HasSubstr("device type cpu")));
    // Nothing was exchanged above, so the group still pairs the ranks' next collective.
    std::vector<at::Tensor> ones = {at::ones({1}).to(r.device)};
    r.group->allreduce(ones)->wait();
    EXPECT_EQ(ones[0].cpu().item<float>(), 2.0f);
    return absl::OkStatus();
  }));
}

}  // namespace
}  // namespace keel::testing
