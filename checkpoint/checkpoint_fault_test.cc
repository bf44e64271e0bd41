// Real faults during a save, in forked children: SIGKILL at many points, a file-size limit
// standing in for a full disk. The previous checkpoint must stay loadable and a partial one
// must never be picked.
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ATen/ATen.h"
#include "ATen/CPUGeneratorImpl.h"
#include "ATen/Parallel.h"
#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_testutil.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "parallel/layout.h"
#include "testing/files.h"
#include "testing/ranks.h"
#include "testing/status_matchers.h"

namespace keel::checkpoint {
namespace {

using ::keel::checkpoint::testing::TensorsState;
using ::keel::testing::NewTempDir;
using ::testing::AllOf;
using ::testing::HasSubstr;

// ~24 MiB over several tensors, so a save spends a while writing; `seed` sets the values. A
// generator of its own: at::manual_seed would also seed CUDA's, which a CUDA build initializes
// for it, and CUDA cannot be used in the forked children that run this after the parent did.
TensorsState BigState(int seed) {
  at::Generator generator = at::detail::createCPUGenerator(static_cast<uint64_t>(seed));
  TensorsState state;
  for (int i = 0; i < 6; ++i) {
    state.tensors[absl::StrCat("layer", i)] = {at::randn({1 << 20}, generator)};
  }
  state.values = {{"seed", seed}};
  return state;
}

absl::Status SaveStep(const std::string& dir, int64_t step, int seed) {
  CheckpointerOptions options;
  options.checkpoint_dir = dir;
  options.keep_last_k = 2;
  KEEL_ASSIGN_OR_RETURN(auto checkpointer, Checkpointer::Create(options, nullptr));
  TensorsState state = BigState(seed);
  return checkpointer->Save({{"model", &state}}, step, 0);
}

// The latest checkpoint loads, verifies byte for byte, and holds the state of its step.
void ExpectLatestIsIntact(const std::string& dir, int64_t min_step) {
  KEEL_ASSERT_OK_AND_ASSIGN(FindResult found, FindLatest(dir, VerifyLevel::kChecksums));
  ASSERT_TRUE(found.latest.has_value());
  EXPECT_GE(found.latest->step, min_step);
  EXPECT_TRUE(found.warnings.empty()) << found.warnings[0];  // a partial save is never visible
  const int seed = static_cast<int>(found.latest->step);
  TensorsState loaded = BigState(seed).EmptyLike();
  KEEL_ASSERT_OK(LoadCheckpoint(found.latest->path, {{"model", &loaded}}).status());
  const TensorsState expected = BigState(seed);
  for (const auto& [name, ref] : expected.tensors) {
    EXPECT_TRUE(at::equal(loaded.tensors.at(name).tensor, ref.tensor)) << name;
  }
  EXPECT_EQ(loaded.values["seed"], seed);
}

TEST(CheckpointFaultTest, SigkillAnywhereInASaveLeavesTheLastCheckpointLoadable) {
  at::set_num_threads(1);  // no OpenMP team in the parent: children fork cleanly
  const std::string dir = NewTempDir("sigkill");
  KEEL_ASSERT_OK(SaveStep(dir, 1, 1));
  // Measure a save, then kill children at points spread over its whole length. The fastest of
  // three saves is the measure: a busy machine only makes some slower, and a measure that is
  // too long would let children finish before their kill.
  auto duration = std::chrono::steady_clock::duration::max();
  for (int64_t step = 2; step <= 4; ++step) {
    const auto start = std::chrono::steady_clock::now();
    KEEL_ASSERT_OK(SaveStep(dir, step, static_cast<int>(step)));
    duration = std::min(duration, std::chrono::steady_clock::now() - start);
  }
  std::mt19937 random(12345);
  int64_t step = 5;
  int killed = 0;
  for (int trial = 0; trial < 30; ++trial, ++step) {
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      ::_exit(SaveStep(dir, step, static_cast<int>(step)).ok() ? 0 : 1);
    }
    // Fault injection, not synchronization: the kill lands at a random point of the save.
    std::uniform_int_distribution<int64_t> delay(
        0, std::chrono::duration_cast<std::chrono::microseconds>(duration).count() * 5 / 4);
    std::this_thread::sleep_for(std::chrono::microseconds(delay(random)));
    ::kill(child, SIGKILL);
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    if (WIFSIGNALED(status)) ++killed;
    SCOPED_TRACE(absl::StrCat("trial ", trial, WIFSIGNALED(status) ? " killed" : " finished"));
    if (!WIFSIGNALED(status)) {
      EXPECT_EQ(WEXITSTATUS(status), 0);  // a save that ran through
    }
    ExpectLatestIsIntact(dir, 2);
  }
  EXPECT_GT(killed, 10);  // most kills land inside a save
  // Saving still works after all those leftovers, and retention cleans them.
  KEEL_ASSERT_OK(SaveStep(dir, 1000, 1000));
  ExpectLatestIsIntact(dir, 1000);
}

TEST(CheckpointFaultTest, FullDiskFailsClearlyAndKeepsEarlierCheckpoints) {
  at::set_num_threads(1);
  const std::string dir = NewTempDir("full_disk");
  KEEL_ASSERT_OK(SaveStep(dir, 1, 1));
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The disk "fills" at 8 MiB: writes past it fail with EFBIG (SIGXFSZ ignored).
    ::signal(SIGXFSZ, SIG_IGN);
    struct rlimit limit = {8 << 20, 8 << 20};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    const absl::Status status = SaveStep(dir, 2, 2);
    const std::string message = status.ToString();
    (void)!::write(pipe_fds[1], message.data(), message.size());
    ::_exit(0);
  }
  ::close(pipe_fds[1]);
  std::string message;
  char buffer[512];
  for (ssize_t n; (n = ::read(pipe_fds[0], buffer, sizeof(buffer))) > 0;) message.append(buffer, n);
  ::close(pipe_fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_THAT(message, AllOf(HasSubstr("RESOURCE_EXHAUSTED"), HasSubstr("File too large"),
                             HasSubstr("__0.keel"), HasSubstr("tensor \"model/layer"),
                             HasSubstr("step_0000000002")));
  ExpectLatestIsIntact(dir, 1);
  KEEL_ASSERT_OK_AND_ASSIGN(FindResult found, FindLatest(dir));
  EXPECT_EQ(found.latest->step, 1);
}

// Ranks are processes here, since a file-size limit is per process: rank 1's disk "fills" at
// 64 KiB while it writes its 1 MiB block. The save fails on every rank with rank 1's error,
// commits nothing and leaves nothing behind.
TEST(CheckpointFaultTest, OneRanksFullDiskFailsTheSaveOnEveryRank) {
  at::set_num_threads(1);
  for (int world : {2, 3}) {
    SCOPED_TRACE(absl::StrCat("world_size=", world));
    const std::string dir = NewTempDir(absl::StrCat("rank_full_disk_", world));
    const std::vector<absl::Status> statuses =
        keel::testing::RunOnRankProcesses(world, [&](keel::testing::Rank& r) -> absl::Status {
          if (r.rank == 1) {
            ::signal(SIGXFSZ, SIG_IGN);
            struct rlimit limit = {64 << 10, 64 << 10};
            ::setrlimit(RLIMIT_FSIZE, &limit);
          }
          CheckpointerOptions options;
          options.checkpoint_dir = dir;
          KEEL_ASSIGN_OR_RETURN(auto checkpointer, Checkpointer::Create(options, r.group.get()));
          TensorsState state;  // each rank holds its own 1 MiB block of "w"
          state.tensors["w"] = {at::full({1, 1 << 18}, r.rank, at::kFloat),
                                parallel::BlockLayout({world, 1 << 18}, {r.rank, 0})};
          return checkpointer->Save({{"model", &state}}, 1, 0);
        });
    for (const absl::Status& status : statuses) {
      EXPECT_THAT(status, ::keel::testing::StatusIs(
                              absl::StatusCode::kResourceExhausted,
                              AllOf(HasSubstr("rank 1: "), HasSubstr("File too large"),
                                    HasSubstr("__1.keel"))));
    }
    KEEL_ASSERT_OK_AND_ASSIGN(FindResult found, FindLatest(dir));
    EXPECT_FALSE(found.latest.has_value());
    KEEL_ASSERT_OK_AND_ASSIGN(std::vector<std::string> names, base::ListDirectory(dir));
    EXPECT_THAT(names, ::testing::IsEmpty());  // the temporary directory is gone too
  }
}

}  // namespace
}  // namespace keel::checkpoint
