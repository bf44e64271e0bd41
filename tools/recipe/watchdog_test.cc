// The watchdog on ranks that are threads with a store of their own: a phase that does not end
// is reported once, with the ranks that have not arrived (behind, or no longer refreshing their
// state as a stopped process does) and every rank's step and phase; the timeout follows the
// longest phase seen, above its floor.
#include "tools/recipe/watchdog.h"

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/ranks.h"
#include "testing/status_matchers.h"

namespace keel::tools::recipe {
namespace {

using ::keel::testing::Rank;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr int kRanks = 3;

// Runs `body` on kRanks ranks, each with a watchdog of `timeout(rank)` seconds; returns each
// rank's report ("" if its watchdog did not fire within 20 s).
std::vector<std::string> Reports(
    const std::function<double(int)>& timeout,
    const std::function<void(int, std::unique_ptr<HangWatchdog>&)>& body) {
  std::vector<std::string> reports(kRanks);
  std::mutex mutex;
  KEEL_EXPECT_OK(keel::testing::RunOnRanks(
      kRanks,
      [&](Rank& r) -> absl::Status {
        std::atomic<bool> fired{false};
        WatchdogOptions options;
        options.timeout_seconds = timeout(r.rank);
        options.publish_every = std::chrono::milliseconds(100);
        options.on_hang = [&](const std::string& report) {
          std::lock_guard<std::mutex> lock(mutex);
          reports[r.rank] = report;
          fired = true;
        };
        auto watchdog =
            std::make_unique<HangWatchdog>(r.rank, kRanks, r.store.get(), std::move(options));
        body(r.rank, watchdog);
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
        while (watchdog != nullptr && !fired && std::chrono::steady_clock::now() < deadline) {
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        return absl::OkStatus();
      },
      std::chrono::seconds(60)));
  return reports;
}

TEST(HangWatchdogTest, ARankBehindTheOthersIsNamedWithItsPhase) {
  // Ranks 0 and 2 wait in the gradient reduction of step 4; rank 1 is still in its forward
  // and backward passes, alive (its watchdog fires last).
  const std::vector<std::string> reports =
      Reports([](int rank) { return rank == 1 ? 3.0 : 1.0; },
              [](int rank, std::unique_ptr<HangWatchdog>& watchdog) {
                watchdog->Enter(4, Phase::kBatches);
                watchdog->Enter(4, rank == 1 ? Phase::kForwardBackward : Phase::kGradientSync);
              });
  int full = 0;
  for (int rank = 0; rank < kRanks; ++rank) {
    SCOPED_TRACE(rank);
    EXPECT_THAT(reports[rank],
                HasSubstr(absl::StrCat("hang: rank ", rank, " has made no progress for ")));
    if (reports[rank].find("Every rank") == std::string::npos) {
      EXPECT_THAT(reports[rank], HasSubstr("another rank reports every rank's state"));
      continue;
    }
    ++full;
    EXPECT_NE(rank, 1);
    EXPECT_THAT(
        reports[rank],
        AllOf(HasSubstr("at step 4, in waiting for the data-parallel gradient reduction"),
              HasSubstr("Not arrived: rank 1 (step 4, the forward and backward passes for "),
              HasSubstr("Every rank: rank 0: step 4, waiting for the data-parallel gradient "
                        "reduction for "),
              HasSubstr("Ending this rank (exit 3)"), Not(HasSubstr("stopped or dead"))));
  }
  EXPECT_EQ(full, 1);
}

TEST(HangWatchdogTest, ARankWhoseStateStopsRefreshingIsStoppedOrDead) {
  // Rank 1 stops in its forward and backward passes as a stopped process does: its watchdog
  // publishes no more.
  const std::vector<std::string> reports =
      Reports([](int) { return 4.0; },
              [](int rank, std::unique_ptr<HangWatchdog>& watchdog) {
                watchdog->Enter(7, rank == 1 ? Phase::kForwardBackward : Phase::kGradientSync);
                if (rank != 1) return;
                std::this_thread::sleep_for(std::chrono::milliseconds(300));  // published
                watchdog.reset();
              });
  EXPECT_EQ(reports[1], "");
  const std::string& full =
      reports[0].find("Every rank") != std::string::npos ? reports[0] : reports[2];
  EXPECT_THAT(full, AllOf(HasSubstr("Not arrived: rank 1 (step 7, the forward and backward "
                                    "passes for "),
                          HasSubstr("s ago: the process is stopped or dead)")));
}

TEST(HangWatchdogTest, TheDerivedTimeoutFollowsTheLongestPhaseAboveItsFloor) {
  WatchdogOptions options;
  options.floor_seconds = 0.2;
  options.factor = 10.0;
  options.on_hang = [](const std::string&) {};
  HangWatchdog watchdog(0, 1, nullptr, options);
  watchdog.Enter(1, Phase::kBatches);
  EXPECT_GE(watchdog.timeout_seconds(), 0.2);
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  watchdog.Enter(1, Phase::kForwardBackward);
  EXPECT_GE(watchdog.timeout_seconds(), 1.5);
  EXPECT_LT(watchdog.timeout_seconds(), 20.0);

  WatchdogOptions off;
  off.timeout_seconds = 0.0;
  HangWatchdog never(0, 1, nullptr, off);
  never.Enter(1, Phase::kBatches);
  EXPECT_EQ(never.timeout_seconds(), 0.0);
}

}  // namespace
}  // namespace keel::tools::recipe
