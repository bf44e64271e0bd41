// Runs a function on several ranks at once, each on its own thread (or in its own process) with
// its own c10d Gloo process group, so multi-rank behaviour is tested for real.
//
//   std::vector<double> norms(world);
//   KEEL_ASSERT_OK(keel::testing::RunOnRanks(world, [&](keel::testing::Rank& r) {
//     KEEL_ASSIGN_OR_RETURN(norms[r.rank], ClipGradNorm(..., *r.group));
//     return absl::OkStatus();
//   }));
#ifndef KEEL_TESTING_RANKS_H_
#define KEEL_TESTING_RANKS_H_

#include <chrono>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "c10/core/Device.h"
#include "torch/csrc/distributed/c10d/ProcessGroup.hpp"
#include "torch/csrc/distributed/c10d/Store.hpp"

namespace keel::testing {

struct Rank {
  int rank = 0;
  int world_size = 1;
  // A group of all ranks for tensors on `device`: Gloo, or under RunOnRanksNcclLike an
  // NcclLikeGroup (nullptr under RunOnRanksWithStore).
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  // Where the tensors that `group` carries live: the CPU, or under RunOnRanksNcclLike the
  // rank's fake GPU (testing::FakeGpu(rank)).
  at::Device device = at::kCPU;
  // A Gloo group of all ranks for host (CPU) tensors: `group` itself, or under
  // RunOnRanksNcclLike one of its own (a DeviceMesh's Gloo twin); nullptr under
  // RunOnRanksWithStore.
  c10::intrusive_ptr<c10d::ProcessGroup> host_group;
  // The store the ranks rendezvous through, under a prefix of this call's own.
  c10::intrusive_ptr<c10d::Store> store;
};

// Runs `fn` on ranks 0..world_size-1 concurrently. Group construction and collectives time
// out after `timeout`, so a deadlock fails instead of hanging. Returns the first non-OK status
// in rank order (prefixed "rank N: "), including exceptions a rank threw.
[[nodiscard]] absl::Status RunOnRanks(int world_size, const std::function<absl::Status(Rank&)>& fn,
                                      std::chrono::milliseconds timeout = std::chrono::seconds(20));

// As RunOnRanks, but `group` refuses host tensors as an NCCL group does (an NcclLikeGroup over
// Gloo) and carries tensors on `device`, the rank's fake GPU: what runs here runs on GPUs with
// NCCL without a host tensor reaching a device group. Requires: world_size <= kFakeGpus.
[[nodiscard]] absl::Status RunOnRanksNcclLike(
    int world_size, const std::function<absl::Status(Rank&)>& fn,
    std::chrono::milliseconds timeout = std::chrono::seconds(20));

// As RunOnRanks, but without the group: each rank gets only the store, to build its own groups
// (a DeviceMesh) through it.
[[nodiscard]] absl::Status RunOnRanksWithStore(
    int world_size, const std::function<absl::Status(Rank&)>& fn,
    std::chrono::milliseconds timeout = std::chrono::seconds(20));

// As RunOnRanks, but each rank is a child process of its own (for what is per process:
// resource limits, signals, the default generator), connected through a TCPStore on a free
// local port. Returns every rank's status, in rank order; a rank that dies instead of
// returning gives kInternal naming how it ended. Requires: no other thread of the test is in
// LibTorch while it forks (at::set_num_threads(1) first if the test ran parallel kernels).
std::vector<absl::Status> RunOnRankProcesses(
    int world_size, const std::function<absl::Status(Rank&)>& fn,
    std::chrono::milliseconds timeout = std::chrono::seconds(20));

// A TCP port on 127.0.0.1 that was free a moment ago (base::PickFreePort; 0 if none).
int FreeTcpPort();

}  // namespace keel::testing

#endif  // KEEL_TESTING_RANKS_H_
