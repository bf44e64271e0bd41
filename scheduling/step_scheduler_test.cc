#include "scheduling/step_scheduler.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"
#include "torch/data/dataloader.h"
#include "torch/data/datasets/base.h"
#include "torch/data/example.h"
#include "torch/data/samplers/sequential.h"
#include "torch/types.h"

namespace keel::scheduling {
namespace {

using ::absl::StatusCode;
using ::keel::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

StepSchedulerOptions Options() {
  StepSchedulerOptions o;
  o.global_batch_size = 4;
  o.num_epochs = 2;
  o.ckpt_every_steps.reset();
  o.preemption_signal.reset();
  return o;
}

std::vector<int> Range(int n) {
  std::vector<int> v(n);
  for (int i = 0; i < n; ++i) v[i] = i;
  return v;
}

// A source without size(): its length is unknown, like an IterableDataset.
struct Unsized {
  std::vector<int> items;
  auto begin() { return items.begin(); }
  auto end() { return items.end(); }
};

// One line per group: "step epoch [batches] flags", flags read in NeMo's recipe order.
template <typename S>
std::vector<std::string> Trace(StepScheduler<S>& s, int stop_after_groups = -1) {
  std::vector<std::string> lines;
  for (int64_t epoch : s.Epochs()) {
    s.SetEpoch(epoch);
    for (auto& batches : s) {
      std::string line = absl::StrCat(s.step(), " ", s.epoch(), " [");
      for (int b : batches) absl::StrAppend(&line, b, ",");
      absl::StrAppend(&line, "] ckpt=", s.IsCkptStep(), " val=", s.IsValStep(),
                      " last=", s.IsLastStep(), " last_batch=", s.IsLastBatch(),
                      " gc=", s.IsGcStep(), " log=", s.IsRemoteLoggingStep(),
                      " sig=", s.SigtermReceived());
      lines.push_back(line);
      if (static_cast<int>(lines.size()) == stop_after_groups) return lines;
    }
  }
  return lines;
}

TEST(StepSchedulerTest, DerivesGradAccEpochLenMaxStepsAndCkptCadence) {
  std::vector<int> data = Range(10);
  // 4 samples per step / (1 per micro-batch * 2 ranks) = 2 micro-batches per step;
  // ceil(10 / 2) = 5 steps per epoch; 2 epochs: 10 steps; checkpoint once per epoch.
  KEEL_ASSERT_OK_AND_ASSIGN(auto s, BuildStepScheduler(Options(), data, /*dp_size=*/2,
                                                       /*local_batch_size=*/1));
  EXPECT_EQ(s.grad_acc_steps(), 2);
  EXPECT_EQ(s.epoch_len(), 5);
  EXPECT_EQ(s.max_steps(), 10);
  EXPECT_EQ(s.ckpt_every_steps(), 5);
  EXPECT_EQ(s.num_epochs(), 2);

  StepSchedulerOptions o = Options();
  o.num_epochs.reset();
  o.max_steps = 12;  // ceil(12 / 5) = 3 epochs
  KEEL_ASSERT_OK_AND_ASSIGN(auto from_max, BuildStepScheduler(o, data, 2, 1));
  EXPECT_EQ(from_max.num_epochs(), 3);

  Unsized unsized{data};
  o.max_steps = 9;  // unknown length: 10 epochs, checkpoint every max(1, 9 / 2) = 4
  KEEL_ASSERT_OK_AND_ASSIGN(auto iterable, BuildStepScheduler(o, unsized, 2, 1));
  EXPECT_EQ(iterable.epoch_len(), std::nullopt);
  EXPECT_EQ(iterable.num_epochs(), 10);
  EXPECT_EQ(iterable.ckpt_every_steps(), 4);
}

TEST(StepSchedulerTest, GroupsMicroBatchesWithAPartialTailAndCountsSteps) {
  std::vector<int> data = Range(5);
  StepSchedulerOptions o = Options();
  o.global_batch_size = 2;  // 2 micro-batches per step: [0,1] [2,3] [4]
  o.num_epochs = 1;
  KEEL_ASSERT_OK_AND_ASSIGN(auto s, BuildStepScheduler(o, data, 1, 1));
  EXPECT_THAT(Trace(s), ElementsAre(HasSubstr("0 0 [0,1,]"), HasSubstr("1 0 [2,3,]"),
                                    HasSubstr("2 0 [4,] ckpt=1 val=1 last=1 last_batch=1")));
  EXPECT_EQ(s.step(), 3);
  EXPECT_EQ(s.epoch(), 1);
}

TEST(StepSchedulerTest, FlagsFollowNemoCadences) {
  std::vector<int> data = Range(6);
  StepSchedulerOptions o = Options();
  o.global_batch_size = 1;
  o.num_epochs = 1;
  o.ckpt_every_steps = 4;        // steps 3 (and the last, 5)
  o.val_every_steps = 2;         // steps 1, 3, 5
  o.gc_every_steps = 3;          // steps 0, 3
  o.log_remote_every_steps = 2;  // steps 0, 2, 4
  KEEL_ASSERT_OK_AND_ASSIGN(auto s, BuildStepScheduler(o, data, 1, 1));
  EXPECT_THAT(Trace(s),
              ElementsAre(HasSubstr("ckpt=0 val=0 last=0 last_batch=0 gc=1 log=1 sig=0"),
                          HasSubstr("ckpt=0 val=1 last=0 last_batch=0 gc=0 log=0 sig=0"),
                          HasSubstr("ckpt=0 val=0 last=0 last_batch=0 gc=0 log=1 sig=0"),
                          HasSubstr("ckpt=1 val=1 last=0 last_batch=0 gc=1 log=0 sig=0"),
                          HasSubstr("ckpt=0 val=0 last=0 last_batch=0 gc=0 log=1 sig=0"),
                          HasSubstr("ckpt=1 val=1 last=1 last_batch=1 gc=0 log=0 sig=0")));
}

TEST(StepSchedulerTest, CheckpointStepsValidateOnlyWhenAsked) {
  std::vector<int> data = Range(2);
  StepSchedulerOptions o = Options();
  o.global_batch_size = 1;
  o.num_epochs = 1;
  o.validate_on_checkpoint = false;
  KEEL_ASSERT_OK_AND_ASSIGN(auto s, BuildStepScheduler(o, data, 1, 1));
  EXPECT_THAT(Trace(s), ElementsAre(HasSubstr("ckpt=0 val=0"), HasSubstr("ckpt=1 val=0")));
}

TEST(StepSchedulerTest, LastStepWhenEpochsRunOutBeforeMaxSteps) {
  std::vector<int> data = Range(3);
  StepSchedulerOptions o = Options();
  o.global_batch_size = 1;
  o.num_epochs = 2;
  o.max_steps = 100;  // 2 epochs of 3 steps end at step 5
  o.save_checkpoint_every_epoch = false;
  o.ckpt_every_steps = 1000;
  KEEL_ASSERT_OK_AND_ASSIGN(auto s, BuildStepScheduler(o, data, 1, 1));
  const std::vector<std::string> trace = Trace(s);
  ASSERT_EQ(trace.size(), 6u);
  EXPECT_THAT(trace[2], HasSubstr("ckpt=0 val=0 last=0 last_batch=1"));  // epoch 0 ends
  EXPECT_THAT(trace[5], HasSubstr("ckpt=1 val=1 last=1 last_batch=1"));  // the run ends
}

TEST(StepSchedulerTest, MaxStepsStopsMidEpochWithoutConsumingMore) {
  std::vector<int> data = Range(10);
  StepSchedulerOptions o = Options();
  o.global_batch_size = 2;
  o.max_steps = 2;
  KEEL_ASSERT_OK_AND_ASSIGN(auto s, BuildStepScheduler(o, data, 1, 1));
  EXPECT_THAT(Trace(s),
              ElementsAre(HasSubstr("0 0 [0,1,] ckpt=0"), HasSubstr("1 0 [2,3,] ckpt=1")));
  EXPECT_EQ(s.epoch(), 0);           // the pass was cut short: no epoch increment
  EXPECT_EQ(s.StateDict().step, 2);  // min(max_steps, step + 1)
}

struct EpochAwareSource {
  std::vector<int> items = Range(2);
  std::vector<int64_t> epochs_seen;
  size_t size() const { return items.size(); }
  auto begin() { return items.begin(); }
  auto end() { return items.end(); }
  void SetEpoch(int64_t epoch) { epochs_seen.push_back(epoch); }
};

TEST(StepSchedulerTest, SetEpochForwardsToTheSource) {
  EpochAwareSource source;
  StepSchedulerOptions o = Options();
  o.global_batch_size = 1;
  o.num_epochs = 3;
  o.start_epoch = 1;
  KEEL_ASSERT_OK_AND_ASSIGN(auto s, BuildStepScheduler(o, source, 1, 1));
  Trace(s);
  EXPECT_THAT(source.epochs_seen, ElementsAre(1, 2));
}

// A restored stateful loader: its first pass resumes after `skip` items; len() is unchanged.
struct ResumedSource {
  std::vector<int> items;
  int64_t skip = 0;
  size_t size() const { return items.size(); }
  auto begin() {
    auto it = items.begin() + std::min<int64_t>(skip, items.size());
    skip = 0;
    return it;
  }
  auto end() { return items.end(); }
};

TEST(StepSchedulerTest, ResumingFromAStateDictContinuesTheExactTrace) {
  StepSchedulerOptions o = Options();
  o.global_batch_size = 2;  // 7 items: groups [0,1] [2,3] [4,5] [6] per epoch
  o.num_epochs = 3;
  o.ckpt_every_steps = 3;
  o.val_every_steps = 2;
  o.gc_every_steps = 2;
  ResumedSource whole_source{Range(7)};
  KEEL_ASSERT_OK_AND_ASSIGN(auto whole, BuildStepScheduler(o, whole_source, 1, 1));
  const std::vector<std::string> expected = Trace(whole);
  ASSERT_EQ(expected.size(), 12u);
  for (int stop = 1; stop < 12; ++stop) {
    SCOPED_TRACE(stop);
    ResumedSource first_source{Range(7)};
    KEEL_ASSERT_OK_AND_ASSIGN(auto first, BuildStepScheduler(o, first_source, 1, 1));
    std::vector<std::string> trace = Trace(first, stop);
    const StepSchedulerState state = first.StateDict();

    const int64_t groups_into_epoch = stop - 4 * state.epoch;
    ResumedSource second_source{Range(7), 2 * groups_into_epoch};
    KEEL_ASSERT_OK_AND_ASSIGN(auto second, BuildStepScheduler(o, second_source, 1, 1));
    KEEL_ASSERT_OK(second.LoadStateDict(state));
    for (std::string& line : Trace(second)) trace.push_back(std::move(line));
    EXPECT_EQ(trace, expected);
  }
}

TEST(StepSchedulerTest, LoadStateDictRejectsNegativeValues) {
  std::vector<int> data = Range(4);
  KEEL_ASSERT_OK_AND_ASSIGN(auto s, BuildStepScheduler(Options(), data, 1, 1));
  EXPECT_THAT(
      s.LoadStateDict({-1, 0}),
      StatusIs(StatusCode::kInvalidArgument, HasSubstr("step (-1) and epoch (0) must be >= 0")));
}

// A torch::data dataset of 6 scalar examples, batched by 2: a source of unknown length.
class Numbers : public torch::data::datasets::Dataset<Numbers, torch::data::Example<>> {
 public:
  torch::data::Example<> get(size_t index) override {
    return {torch::full({1}, static_cast<int64_t>(index)), torch::zeros({1})};
  }
  c10::optional<size_t> size() const override { return 6; }
};

TEST(StepSchedulerTest, IteratesALibTorchDataLoader) {
  auto loader = torch::data::make_data_loader<torch::data::samplers::SequentialSampler>(
      Numbers(), torch::data::DataLoaderOptions().batch_size(2));
  StepSchedulerOptions o = Options();
  o.global_batch_size = 4;  // 2 batches of 2 per step
  o.num_epochs = 1;
  o.max_steps = 2;
  KEEL_ASSERT_OK_AND_ASSIGN(auto s, BuildStepScheduler(o, *loader, 1, 2));
  std::vector<int64_t> firsts;
  std::vector<size_t> sizes;
  for (int64_t epoch : s.Epochs()) {
    s.SetEpoch(epoch);
    for (auto& batches : s) {
      sizes.push_back(batches.size());
      firsts.push_back(batches[0][0].data.item<int64_t>());
    }
  }
  EXPECT_THAT(sizes, ElementsAre(2, 1));   // 3 batches of 2 examples: a full group, then the tail
  EXPECT_THAT(firsts, ElementsAre(0, 4));  // batches {0,1} {2,3} | {4,5}
}

struct RejectCase {
  const char* name;
  void (*mutate)(StepSchedulerOptions&, int64_t& dp, int64_t& local);
  const char* message;
};

TEST(StepSchedulerValidationTest, RejectsEveryInvalidArgumentWithNemosMessage) {
  const RejectCase cases[] = {
      {"gbs", [](StepSchedulerOptions& o, int64_t&, int64_t&) { o.global_batch_size = 0; },
       "global_batch_size must be greater than 0, got 0"},
      {"lbs", [](StepSchedulerOptions&, int64_t&, int64_t& l) { l = -1; },
       "local_batch_size must be greater than 0, got -1"},
      {"dp", [](StepSchedulerOptions&, int64_t& d, int64_t&) { d = 0; },
       "dp_size must be greater than 0, got 0"},
      {"divisible", [](StepSchedulerOptions&, int64_t& d, int64_t&) { d = 3; },
       "global_batch_size (4) must be divisible by local_batch_size * dp_size (1 * 3)"},
      {"start_step", [](StepSchedulerOptions& o, int64_t&, int64_t&) { o.start_step = -1; },
       "start_step must be greater than or equal to 0, got -1"},
      {"start_epoch", [](StepSchedulerOptions& o, int64_t&, int64_t&) { o.start_epoch = -2; },
       "start_epoch must be greater than or equal to 0, got -2"},
      {"num_epochs", [](StepSchedulerOptions& o, int64_t&, int64_t&) { o.num_epochs = 0; },
       "num_epochs must be greater than 0 or None if max_steps is provided, got 0"},
      {"val", [](StepSchedulerOptions& o, int64_t&, int64_t&) { o.val_every_steps = 0; },
       "val_every_steps must be greater than 0 if not None, got 0"},
      {"log", [](StepSchedulerOptions& o, int64_t&, int64_t&) { o.log_remote_every_steps = 0; },
       "log_remote_every_steps must be greater than 0, got 0"},
      {"loss window",
       [](StepSchedulerOptions& o, int64_t&, int64_t&) { o.loss_average_window_steps = -3; },
       "loss_average_window_steps must be greater than 0, got -3"},
      {"gc", [](StepSchedulerOptions& o, int64_t&, int64_t&) { o.gc_every_steps = 0; },
       "gc_every_steps must be greater than 0 if not None, got 0"},
      {"max_steps", [](StepSchedulerOptions& o, int64_t&, int64_t&) { o.max_steps = 0; },
       "max_steps must be greater than 0, got 0"},
      {"ckpt", [](StepSchedulerOptions& o, int64_t&, int64_t&) { o.ckpt_every_steps = -1; },
       "ckpt_every_steps must be greater than 0, got -1"},
      {"signals",
       [](StepSchedulerOptions& o, int64_t&, int64_t&) { o.preemption_signal.emplace(); },
       "At least one signal must be provided"},
      {"signal name",
       [](StepSchedulerOptions& o, int64_t&, int64_t&) { o.preemption_signal = {{"SIGFOO"}}; },
       "Unknown signal name: 'SIGFOO'"},
      {"overflow",
       [](StepSchedulerOptions& o, int64_t&, int64_t&) { o.num_epochs = int64_t{1} << 62; },
       "overflows int64"},
      // 2^40 * 2^40 wraps to 0 in int64, which NeMo's modulo would then divide by.
      {"batch overflow",
       [](StepSchedulerOptions&, int64_t& dp, int64_t& local) {
         dp = int64_t{1} << 40;
         local = int64_t{1} << 40;
       },
       "local_batch_size (1099511627776) * dp_size (1099511627776) overflows int64"},
  };
  std::vector<int> data = Range(8);
  for (const RejectCase& c : cases) {
    SCOPED_TRACE(c.name);
    StepSchedulerOptions o = Options();
    int64_t dp = 1;
    int64_t local = 1;
    c.mutate(o, dp, local);
    EXPECT_THAT(BuildStepScheduler(o, data, dp, local),
                StatusIs(StatusCode::kInvalidArgument, HasSubstr(c.message)));
  }
}

TEST(StepSchedulerValidationTest, SourceWithoutLengthNeedsMaxStepsAndEmptySourceNeedsEpochs) {
  Unsized unsized{Range(3)};
  EXPECT_THAT(BuildStepScheduler(Options(), unsized, 1, 1),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("epoch_len must be provided if max_steps is not provided")));
  std::vector<int> empty;
  StepSchedulerOptions o = Options();
  o.num_epochs.reset();
  o.max_steps = 5;
  EXPECT_THAT(BuildStepScheduler(o, empty, 1, 1),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("yields no micro-batch")));
}

// A source that yields nothing made NeMo divide by epoch_len = 0 at the first flag read (and
// Keel crash with SIGFPE). Whatever the options, it is refused when the scheduler is built.
TEST(StepSchedulerValidationTest, AnEmptySourceIsRefusedWhateverTheOptions) {
  std::vector<int> empty;
  StepSchedulerOptions with_both = Options();
  with_both.num_epochs = 2;
  with_both.max_steps = 5;  // the case that crashed: nothing else divides by epoch_len
  StepSchedulerOptions derived_ckpt = Options();
  derived_ckpt.max_steps = 5;
  derived_ckpt.ckpt_every_steps.reset();  // would be epoch_len = 0
  StepSchedulerOptions defaults = Options();
  for (const StepSchedulerOptions& o : {with_both, derived_ckpt, defaults}) {
    EXPECT_THAT(BuildStepScheduler(o, empty, 1, 1),
                StatusIs(StatusCode::kInvalidArgument,
                         HasSubstr("the data source yields no micro-batch (its length is 0)")));
  }
}

// The real signal path: a child process runs the loop and the parent sends it SIGTERM after
// the child reports step 2. Pipes order the two processes; nothing sleeps.
TEST(StepSchedulerSignalTest, SigtermFromAnotherProcessStopsAtTheNextStepWithACheckpoint) {
  int to_parent[2];
  int to_child[2];
  ASSERT_EQ(pipe(to_parent), 0);
  ASSERT_EQ(pipe(to_child), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(to_parent[0]);
    close(to_child[1]);
    std::vector<int> data = Range(100);
    StepSchedulerOptions o = Options();
    o.global_batch_size = 1;
    o.num_epochs = 1;
    o.ckpt_every_steps = 1000;
    o.preemption_signal = {{"SIGTERM"}};
    auto s = BuildStepScheduler(o, data, 1, 1);
    if (!s.ok()) _exit(100);
    int exit_code = 101;
    for (auto& batches : *s) {
      static_cast<void>(batches);
      const char step = static_cast<char>(s->step());
      if (write(to_parent[1], &step, 1) != 1) _exit(102);
      char go;
      if (read(to_child[0], &go, 1) != 1) _exit(103);  // SIGTERM, if sent, arrives before this
      if (s->IsCkptStep())
        exit_code = static_cast<int>(s->step()) + (s->SigtermReceived() ? 50 : 0);
    }
    _exit(exit_code);
  }
  close(to_parent[1]);
  close(to_child[0]);
  char step;
  while (read(to_parent[0], &step, 1) == 1) {
    if (step == 2) {
      ASSERT_EQ(kill(child, SIGTERM), 0);
    }
    const char go = 1;
    ASSERT_EQ(write(to_child[1], &go, 1), 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status),
            2 + 50);  // checkpointed at step 2 because of the signal, then stopped
}

}  // namespace
}  // namespace keel::scheduling
