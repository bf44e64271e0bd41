#include "scheduling/preemption.h"

#include <signal.h>

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace keel::scheduling {
namespace {

using ::absl::StatusCode;
using ::keel::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ResolveSignalsTest, AcceptsNamesInAnyCaseWithOrWithoutSigAndNumbers) {
  KEEL_ASSERT_OK_AND_ASSIGN(std::vector<int> signals,
                            ResolveSignals({"SIGTERM", "usr1", " Usr2 ", "2"}));
  EXPECT_THAT(signals, ElementsAre(SIGTERM, SIGUSR1, SIGUSR2, SIGINT));
  KEEL_ASSERT_OK_AND_ASSIGN(signals, ResolveSignals({"SIGIOT", "cld"}));  // aliases
  EXPECT_THAT(signals, ElementsAre(SIGABRT, SIGCHLD));
}

TEST(ResolveSignalsTest, RejectsWhatNemoRejectsWithItsMessages) {
  EXPECT_THAT(ResolveSignals({}), StatusIs(StatusCode::kInvalidArgument,
                                           HasSubstr("At least one signal must be provided")));
  EXPECT_THAT(ResolveSignals({"SIGUSR1", "usr1"}),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("Duplicate signals provided: ['SIGUSR1', 'SIGUSR1']")));
  EXPECT_THAT(ResolveSignals({"SIGNOPE"}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("Unknown signal name: 'SIGNOPE'")));
  EXPECT_THAT(ResolveSignals({"99"}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("Invalid signal number: 99")));
  EXPECT_THAT(ResolveSignals({"33"}),  // between SIGSYS and SIGRTMIN: not a Python member
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("Invalid signal number: 33")));
}

int g_previous_handler_calls = 0;
void PreviousHandler(int) { ++g_previous_handler_calls; }

TEST(SignalPreemptionFlagTest, CatchesRaisedSignalAndRestoresThePreviousHandler) {
  struct sigaction previous = {};
  previous.sa_handler = &PreviousHandler;
  sigemptyset(&previous.sa_mask);
  ASSERT_EQ(sigaction(SIGUSR2, &previous, nullptr), 0);
  {
    KEEL_ASSERT_OK_AND_ASSIGN(auto flag, SignalPreemptionFlag::Create({SIGUSR2}));
    EXPECT_FALSE(flag->Received());
    ASSERT_EQ(raise(SIGUSR2), 0);  // handled synchronously by this thread
    EXPECT_TRUE(flag->Received());
    EXPECT_EQ(g_previous_handler_calls, 0);
    KEEL_ASSERT_OK_AND_ASSIGN(auto later, SignalPreemptionFlag::Create({SIGUSR2}));
    EXPECT_FALSE(later->Received());  // only signals after its own Create count
  }
  ASSERT_EQ(raise(SIGUSR2), 0);
  EXPECT_EQ(g_previous_handler_calls, 1);  // the previous handler is back
  signal(SIGUSR2, SIG_DFL);
}

TEST(SignalPreemptionFlagTest, UncatchableSignalsAreAnError) {
  EXPECT_THAT(
      SignalPreemptionFlag::Create({SIGKILL}),
      StatusIs(StatusCode::kInvalidArgument, HasSubstr("cannot handle signal 9 (SIGKILL)")));
}

TEST(ManualPreemptionFlagTest, StaysSetOnceSet) {
  ManualPreemptionFlag flag;
  EXPECT_FALSE(flag.Received());
  flag.Set();
  EXPECT_TRUE(flag.Received());
}

}  // namespace
}  // namespace keel::scheduling
