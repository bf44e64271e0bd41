// The hang watchdog end to end: a rank stopped with SIGSTOP (mid-step, or rank 0, which serves
// the rendezvous store, between steps) on 2 and 4 ranks. Every other rank exits 3 within
// distributed.hang_timeout_seconds and a few seconds, long before distributed.timeout_seconds
// (600), and one of them names the stopped rank and its step and phase (for rank 0, which
// serves the store, the store that stopped answering).
#include <signal.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/files.h"
#include "testing/ranks.h"
#include "tools/cli/subprocess_testutil.h"
#include "tools/train_testutil.h"

namespace keel::tools {
namespace {

using ::keel::testing::NewTempDir;
using ::keel::tools::cli::Subprocess;
using ::testing::AllOf;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;

constexpr int kHangTimeout = 5;

struct Case {
  int ranks;
  int stopped;
};

void ExpectTheOthersEndNamingIt(const Case& c) {
  SCOPED_TRACE(absl::StrCat(c.ranks, " ranks, rank ", c.stopped, " stopped"));
  const std::string run_dir = NewTempDir("hang");
  const std::vector<std::string> args =
      SmallRun(run_dir, 4000,
               {"step_scheduler.local_batch_size=2",
                absl::StrCat("distributed.hang_timeout_seconds=", kHangTimeout)});
  const std::string port = absl::StrCat("MASTER_PORT=", keel::testing::FreeTcpPort());
  std::vector<Subprocess> ranks;
  for (int rank = 0; rank < c.ranks; ++rank) {
    ranks.push_back(
        StartTrain(args, absl::StrCat(run_dir, "/stderr.", rank),
                   {absl::StrCat("RANK=", rank), absl::StrCat("LOCAL_RANK=", rank),
                    absl::StrCat("WORLD_SIZE=", c.ranks),
                    absl::StrCat("LOCAL_WORLD_SIZE=", c.ranks), "MASTER_ADDR=127.0.0.1", port}));
  }
  // Rank 0 prints a step's line after the step: stopped then, it is between steps. By step
  // 40 every rank has published its state more than once (every second).
  ASSERT_TRUE(ReadUntilStep(ranks[0], 40)) << ranks[0].Stderr();
  ASSERT_EQ(kill(ranks[c.stopped].pid(), SIGSTOP), 0);
  std::string reports;
  for (int rank = 0; rank < c.ranks; ++rank) {
    if (rank == c.stopped) continue;
    const std::optional<int> code = ranks[rank].WaitFor(kHangTimeout + 25);
    ASSERT_TRUE(code.has_value()) << "rank " << rank << " still runs " << kHangTimeout + 25
                                  << " s after rank " << c.stopped << " stopped";
    EXPECT_EQ(*code, 3) << ranks[rank].Stderr();
    EXPECT_THAT(ranks[rank].Stderr(),
                HasSubstr(absl::StrCat("hang: rank ", rank, " has made no progress for ")));
    reports += ranks[rank].Stderr();
  }
  if (c.stopped == 0) {
    EXPECT_THAT(reports, HasSubstr("the rendezvous store did not answer within 5 s: its host "
                                   "(rank 0, unless an agent serves it) is stopped or dead"));
  } else {
    EXPECT_THAT(reports, ContainsRegex(absl::StrCat(
                             "Not arrived: (rank [0-9] \\([^)]*\\), )*rank ", c.stopped,
                             " \\(step [1-9][0-9]*, [^;]+ for [0-9.]+ s; its state stopped "
                             "refreshing [0-9.]+ s ago: the process is stopped or dead\\)")));
  }
  ASSERT_EQ(kill(ranks[c.stopped].pid(), SIGKILL), 0);
  EXPECT_EQ(ranks[c.stopped].Wait(), 128 + SIGKILL);
}

TEST(TrainHangTest, AStoppedRankEndsTheOthersNamingIt) {
  for (const Case& c : {Case{2, 1}, Case{4, 2}, Case{2, 0}, Case{4, 0}}) {
    ExpectTheOthersEndNamingIt(c);
  }
}

}  // namespace
}  // namespace keel::tools
