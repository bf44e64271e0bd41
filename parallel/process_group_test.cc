#include "parallel/process_group.h"

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/torch_compat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "parallel/torchrun_env.h"
#include "testing/ranks.h"
#include "testing/status_matchers.h"
#include "torch/csrc/distributed/c10d/HashStore.hpp"
#include "torch/csrc/distributed/c10d/ProcessGroup.hpp"
#include "torch/csrc/distributed/c10d/Store.hpp"
#include "torch/types.h"

namespace keel::parallel {
namespace {

using ::keel::testing::Rank;
using ::keel::testing::StatusIs;
using ::testing::HasSubstr;

constexpr std::chrono::seconds kTimeout(20);

std::vector<uint8_t> Bytes(const std::string& text) { return {text.begin(), text.end()}; }

TEST(BackendTest, ParsesGlooAndNcclOnly) {
  Backend backend = Backend::kNccl;
  std::string error;
  ASSERT_TRUE(AbslParseFlag("gloo", &backend, &error));
  EXPECT_EQ(backend, Backend::kGloo);
  ASSERT_TRUE(AbslParseFlag("nccl", &backend, &error));
  EXPECT_EQ(backend, Backend::kNccl);
  EXPECT_EQ(AbslUnparseFlag(Backend::kGloo), "gloo");
  EXPECT_FALSE(AbslParseFlag("NCCL", &backend, &error));
  EXPECT_THAT(error, HasSubstr("\"NCCL\" is not one of \"gloo\", \"nccl\""));
}

TEST(CreateProcessGroupTest, GlooGroupReducesOverItsRanks) {
  for (int world : {1, 3}) {
    SCOPED_TRACE(world);
    std::vector<int64_t> sums(world);
    KEEL_ASSERT_OK(testing::RunOnRanksWithStore(world, [&](Rank& r) -> absl::Status {
      KEEL_ASSIGN_OR_RETURN(
          auto group, CreateProcessGroup(Backend::kGloo, r.store, r.rank, r.world_size, kTimeout));
      std::vector<at::Tensor> tensors = {torch::full({1}, r.rank + 1, torch::kInt64)};
      group->allreduce(tensors)->wait();
      sums[r.rank] = tensors[0].item<int64_t>();
      return absl::OkStatus();
    }));
    for (int64_t sum : sums) EXPECT_EQ(sum, world * (world + 1) / 2);  // 1 + 2 + ... + world
  }
}

TEST(CreateProcessGroupTest, RefusesBadArguments) {
  const c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::HashStore>();
  EXPECT_THAT(CreateProcessGroup(Backend::kGloo, store, 2, 2, kTimeout),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("process group rank 2 is outside [0, 2)")));
  EXPECT_THAT(CreateProcessGroup(Backend::kGloo, {}, 0, 1, kTimeout),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("needs a rendezvous store")));
  if (!base::HasNccl()) {
    EXPECT_THAT(CreateProcessGroup(Backend::kNccl, store, 0, 1, kTimeout),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("backend \"nccl\" needs a CUDA build")));
  }
}

TEST(SelectDeviceTest, GlooComputesOnTheCpuAndNcclNeedsACudaBuild) {
  KEEL_ASSERT_OK_AND_ASSIGN(const c10::Device device, SelectDevice(Backend::kGloo, 3));
  EXPECT_EQ(device, c10::Device(c10::kCPU));
  if (!base::HasNccl()) {
    EXPECT_THAT(SelectDevice(Backend::kNccl, 0),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("backend \"nccl\" needs a CUDA build")));
  }
}

TEST(ConnectStoreTest, ALoneProcessGetsAnInProcessStore) {
  KEEL_ASSERT_OK_AND_ASSIGN(auto store, ConnectStore(WorkerEnv(), kTimeout));
  store->set("key", Bytes("value"));
  EXPECT_EQ(store->get("key"), Bytes("value"));
}

// torchrun's agent serves the store; a worker's keys live under /worker/attempt_<restarts>.
TEST(ConnectStoreTest, AgentStoreKeysLiveUnderTheAttemptPrefix) {
  const int port = testing::FreeTcpPort();
  ASSERT_GT(port, 0);
  const c10::intrusive_ptr<c10d::Store> agent =
      base::CreateTcpStore("127.0.0.1", port, /*is_server=*/true, /*world_size=*/1, kTimeout);
  WorkerEnv env;
  env.rank = 0;
  env.world_size = 2;
  env.master_port = port;
  env.agent_store = true;
  env.restart_count = 3;
  KEEL_ASSERT_OK_AND_ASSIGN(auto store, ConnectStore(env, kTimeout));
  store->set("probe", Bytes("from rank 0"));
  EXPECT_EQ(agent->get("/worker/attempt_3/probe"), Bytes("from rank 0"));
}

TEST(ConnectStoreTest, UnreachableStoreIsUnavailableNamingTheAddress) {
  const int port = testing::FreeTcpPort();
  WorkerEnv env;
  env.rank = 1;
  env.world_size = 2;
  env.master_port = port;  // nobody serves it
  EXPECT_THAT(ConnectStore(env, std::chrono::milliseconds(300)),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr(absl::StrCat("rendezvous at 127.0.0.1:", port))));
}

}  // namespace
}  // namespace keel::parallel
