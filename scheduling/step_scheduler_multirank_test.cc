#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduling/preemption.h"
#include "scheduling/step_scheduler.h"
#include "testing/ranks.h"
#include "testing/status_matchers.h"

namespace keel::scheduling {
namespace {

using ::keel::testing::Rank;
using ::keel::testing::RunOnRanks;
using ::testing::ElementsAre;

// Every rank runs the recipe loop over its own 10 micro-batches; `preempted` trips its own
// flag (standing in for a signal only it received) when it reaches step 3.
std::vector<std::vector<std::string>> RunRanks(int world, int preempted) {
  std::vector<std::vector<std::string>> traces(world);
  KEEL_EXPECT_OK(RunOnRanks(world, [&](Rank& r) -> absl::Status {
    std::vector<int> data(10, r.rank);
    StepSchedulerOptions o;
    o.global_batch_size = world;  // one micro-batch per rank per step
    o.num_epochs = 2;
    o.ckpt_every_steps = 1000;
    o.preemption_signal.reset();
    auto flag = std::make_unique<ManualPreemptionFlag>();
    ManualPreemptionFlag* local = flag.get();
    KEEL_ASSIGN_OR_RETURN(auto s,
                          BuildStepScheduler(o, data, world, 1, r.group.get(), std::move(flag)));
    for (int64_t epoch : s.Epochs()) {
      s.SetEpoch(epoch);
      for (auto& batches : s) {
        static_cast<void>(batches);
        if (r.rank == preempted && s.step() == 3) local->Set();
        const bool ckpt = s.IsCkptStep();
        traces[r.rank].push_back(
            absl::StrCat(s.step(), " ckpt=", ckpt, " sig=", s.SigtermReceived()));
      }
    }
    traces[r.rank].push_back(absl::StrCat("end step=", s.step(), " epoch=", s.epoch()));
    return s.preemption_status();
  }));
  return traces;
}

TEST(StepSchedulerMultiRankTest, OneRankPreemptedStopsEveryRankAtTheSameStep) {
  for (int world : {2, 3}) {
    for (int preempted = 0; preempted < world; ++preempted) {
      SCOPED_TRACE(absl::StrCat("world=", world, " preempted rank=", preempted));
      const auto traces = RunRanks(world, preempted);
      for (const auto& trace : traces) {
        EXPECT_THAT(trace, ElementsAre("0 ckpt=0 sig=0", "1 ckpt=0 sig=0", "2 ckpt=0 sig=0",
                                       "3 ckpt=1 sig=1", "end step=4 epoch=0"));
      }
    }
  }
}

TEST(StepSchedulerMultiRankTest, WithoutPreemptionEveryRankRunsToTheEnd) {
  const auto traces = RunRanks(3, /*preempted=*/-1);
  for (const auto& trace : traces) {
    ASSERT_EQ(trace.size(), 21u);           // 2 epochs of 10 steps, then the end line
    EXPECT_EQ(trace[9], "9 ckpt=1 sig=0");  // epoch boundary
    // max_steps ends the pass before its epoch increment, as in NeMo.
    EXPECT_EQ(trace[20], "end step=20 epoch=1");
  }
}

// A request that arrives after a step's poll (during validation, say) is seen by PollPreemption
// on every rank at once, and the step then checkpoints and ends the loop.
TEST(StepSchedulerMultiRankTest, PollPreemptionSeesALateRequestOnEveryRank) {
  for (int world : {2, 3}) {
    SCOPED_TRACE(absl::StrCat("world=", world));
    std::vector<std::vector<std::string>> traces(world);
    KEEL_EXPECT_OK(RunOnRanks(world, [&](Rank& r) -> absl::Status {
      std::vector<int> data(10, r.rank);
      StepSchedulerOptions o;
      o.global_batch_size = world;
      o.num_epochs = 1;
      o.ckpt_every_steps = 1000;
      o.preemption_signal.reset();
      auto flag = std::make_unique<ManualPreemptionFlag>();
      ManualPreemptionFlag* local = flag.get();
      KEEL_ASSIGN_OR_RETURN(auto s,
                            BuildStepScheduler(o, data, world, 1, r.group.get(), std::move(flag)));
      for (auto& batches : s) {
        static_cast<void>(batches);
        const bool ckpt = s.IsCkptStep();  // this step's poll
        if (s.step() == 2 && r.rank == world - 1) local->Set();
        const bool polled = s.PollPreemption();
        traces[r.rank].push_back(absl::StrCat(s.step(), " ckpt=", ckpt, " polled=", polled,
                                              " then ckpt=", s.IsCkptStep()));
      }
      traces[r.rank].push_back(absl::StrCat("end step=", s.step()));
      return s.preemption_status();
    }));
    for (const auto& trace : traces) {
      EXPECT_THAT(trace,
                  ElementsAre("0 ckpt=0 polled=0 then ckpt=0", "1 ckpt=0 polled=0 then ckpt=0",
                              "2 ckpt=0 polled=1 then ckpt=1", "end step=3"));
    }
  }
}

}  // namespace
}  // namespace keel::scheduling
