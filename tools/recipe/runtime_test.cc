// What only rank 0 runs before training is waited for through the store, not a collective: a
// phase longer than the groups' timeout passes, rank 1 says what it waits for, rank 0's error
// reaches every rank; the rendezvous says what it waits for too; and a rank that cannot open
// the data rank 0 prepared fails every rank at once with its own error.
#include "tools/recipe/runtime.h"

#include <chrono>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sampling/indexed_dataset_writer.h"
#include "testing/files.h"
#include "testing/ranks.h"
#include "testing/status_matchers.h"
#include "tools/recipe/data.h"
#include "tools/recipe/runtime_testutil.h"

namespace keel::tools::recipe {
namespace {

using ::keel::testing::Rank;
using ::keel::testing::RunOnRanks;
using ::keel::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr int kRanks = 3;

TrainRuntime RuntimeOf(const parallel::DeviceMesh& mesh, std::ostream& log) {
  TrainRuntime runtime;
  AttachMesh(mesh, at::kCPU, runtime);
  runtime.log = &log;
  return runtime;
}

// The trainer's polls back off to 1 s, or a quarter of a shorter collective timeout.
TEST(RunOnRankZeroTest, TheTrainersPollsStayUnderAQuarterOfTheTimeout) {
  TrainOptions options;
  EXPECT_EQ(RankZeroWaitFor(options).longest_poll, std::chrono::seconds(1));  // 600 s
  options.distributed.timeout_seconds = 2;
  EXPECT_EQ(RankZeroWaitFor(options).longest_poll, std::chrono::milliseconds(500));
}

TEST(RunOnRankZeroTest, APhaseLongerThanTheCollectiveTimeoutPasses) {
  std::vector<std::ostringstream> logs(kRanks);
  RankZeroWait wait;
  wait.progress_every = std::chrono::milliseconds(400);
  // Collectives time out after 1 s; rank 0's phase takes 2.5 s. The polls back off to 250 ms:
  // at the default 1 s a waiting rank could reach the collective after the phase as late as
  // the timeout (a flake seen under a loaded machine).
  wait.longest_poll = std::chrono::milliseconds(250);
  KEEL_ASSERT_OK(RunOnRanks(
      kRanks,
      [&](Rank& r) -> absl::Status {
        KEEL_ASSIGN_OR_RETURN(const parallel::DeviceMesh mesh,
                              GlooMesh(r, {}, std::chrono::seconds(1)));
        const TrainRuntime runtime = RuntimeOf(mesh, logs[r.rank]);
        KEEL_RETURN_IF_ERROR(RunOnRankZero(
            runtime, "a slow phase",
            [] {
              std::this_thread::sleep_for(std::chrono::milliseconds(2500));
              return absl::OkStatus();
            },
            wait));
        return AgreeOverRanks(absl::OkStatus(), runtime, "after the phase");
      },
      std::chrono::seconds(1)));
  EXPECT_THAT(logs[1].str(), HasSubstr("waiting for rank 0: a slow phase ("));
  EXPECT_THAT(logs[0].str(), IsEmpty());
  EXPECT_THAT(logs[2].str(), IsEmpty());  // one line for all waiting ranks
}

TEST(RunOnRankZeroTest, RankZerosErrorReachesEveryRank) {
  std::vector<absl::Status> statuses(kRanks);
  int runs = 0;
  KEEL_ASSERT_OK(RunOnRanks(kRanks, [&](Rank& r) -> absl::Status {
    std::ostringstream log;
    KEEL_ASSIGN_OR_RETURN(const parallel::DeviceMesh mesh, GlooMesh(r));
    statuses[r.rank] = RunOnRankZero(RuntimeOf(mesh, log), "preparing the corpus", [&] {
      ++runs;  // rank 0 alone
      return absl::NotFoundError("the corpus is missing");
    });
    return absl::OkStatus();
  }));
  EXPECT_EQ(runs, 1);
  EXPECT_THAT(statuses[0],
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("the corpus is missing")));
  for (int rank = 1; rank < kRanks; ++rank) {
    EXPECT_THAT(statuses[rank],
                StatusIs(absl::StatusCode::kNotFound, HasSubstr("rank 0: the corpus is missing")))
        << "rank " << rank;
  }
  // A single process runs the phase.
  std::ostringstream log;
  TrainRuntime alone;
  alone.log = &log;
  EXPECT_THAT(RunOnRankZero(alone, "preparing the corpus",
                            [] { return absl::NotFoundError("no corpus here"); }),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no corpus here")));
}

// A dataset rank 2 cannot see (a network file system that does not show it yet): every rank
// fails at once with rank 2's error, not at its next collective's timeout.
// A rank that comes late is waited for with a line on the first rank of each node, not in
// silence; the lines stop once the mesh is built.
TEST(ProcessGroupsTest, TheRendezvousSaysWhatItWaitsFor) {
  const int port = keel::testing::FreeTcpPort();
  ASSERT_GT(port, 0);
  std::vector<std::ostringstream> logs(2);
  std::vector<absl::Status> statuses(2);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.emplace_back([&, rank] {
      if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1200));
      parallel::WorkerEnv env;
      env.rank = rank;
      env.local_rank = rank;
      env.world_size = 2;
      env.local_world_size = 2;
      env.master_port = port;
      statuses[rank] = ProcessGroups::Connect(env, DistributedOptions{}, &logs[rank],
                                              std::chrono::milliseconds(300))
                           .status();
    });
  }
  for (std::thread& thread : ranks) thread.join();
  for (const absl::Status& status : statuses) KEEL_EXPECT_OK(status);
  // A line at 300, 600 and 900 ms at least (0 s each, unless the machine stalls).
  EXPECT_THAT(
      logs[0].str(),
      ::testing::ContainsRegex(absl::StrCat(
          "^rendezvous at 127\\.0\\.0\\.1:", port,
          ": waiting for the 2 ranks \\([0-9]+ s of distributed\\.timeout_seconds 600\\)\n")));
  EXPECT_THAT(logs[1].str(), IsEmpty());  // LOCAL_RANK 1
  const std::string written = logs[0].str();
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  EXPECT_EQ(logs[0].str(), written);
}

TEST(OpenTrainDataTest, ARankThatCannotOpenTheDataFailsEveryRankAtOnce) {
  const std::string dir = keel::testing::NewTempDir("open_train_data");
  auto writer =
      sampling::IndexedDatasetWriter::Create(dir + "/tokens", sampling::TokenDtype::kUint16);
  ASSERT_TRUE(writer.ok());
  std::vector<int64_t> tokens(400);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int64_t>(i % 200);
  KEEL_ASSERT_OK(writer->AddDocument(tokens, {static_cast<int64_t>(tokens.size())}));
  KEEL_ASSERT_OK(writer->Finalize());
  std::vector<absl::Status> statuses(kRanks);
  const auto start = std::chrono::steady_clock::now();
  KEEL_ASSERT_OK(RunOnRanks(
      kRanks,
      [&](Rank& r) -> absl::Status {
        std::ostringstream log;
        TrainOptions options;
        options.run_dir = dir + "/run";
        options.data.prefix = dir + (r.rank == 2 ? "/not_visible_yet" : "/tokens");
        options.data.dataset.sequence_length = 16;
        options.step_scheduler.global_batch_size = 6;
        options.local_batch_size = 2;
        options.sampler.micro_batch_size = 2;
        options.sampler.global_batch_size = 6;
        KEEL_ASSIGN_OR_RETURN(const parallel::DeviceMesh mesh, GlooMesh(r));
        statuses[r.rank] = OpenTrainData(options, RuntimeOf(mesh, log)).status();
        return absl::OkStatus();
      },
      std::chrono::seconds(30)));
  for (const absl::Status& status : statuses) {
    // Rank 2's error, naming the field (a missing dataset is a configuration error).
    EXPECT_THAT(
        status,
        StatusIs(absl::StatusCode::kInvalidArgument,
                 AllOf(HasSubstr("rank 2: data.prefix names \"" + dir + "/not_visible_yet\""),
                       HasSubstr("opening " + dir + "/not_visible_yet.idx"))));
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

}  // namespace
}  // namespace keel::tools::recipe
