#include "checkpoint/training_state.h"

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "ATen/CPUGeneratorImpl.h"
#include "absl/status/status.h"
#include "base/fields.h"
#include "base/json.h"
#include "checkpoint/state_dict.h"
#include "checkpoint/stateful_conformance_testutil.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sampling/megatron_sampler.h"
#include "scheduling/step_scheduler.h"
#include "testing/status_matchers.h"

namespace keel::checkpoint {
namespace {

using ::absl::StatusCode;
using ::keel::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::StatefulConformanceTest;

using testing::LoadInMemory;

// A user's own state struct.
struct Counters {
  int64_t tokens = 0;
  double loss = 0.0;
  std::optional<int64_t> best_step;
};

template <typename O, typename V, base::IsFieldsOf<O, Counters> = 0>
void VisitFields(O& o, V&& v) {
  v("tokens", o.tokens);
  v("loss", o.loss);
  v("best_step", o.best_step);
}

// A ValueState over `*counters`; each set() is counted in `*sets`.
ValueState<Counters> CountersState(Counters* counters, int* sets) {
  return ValueState<Counters>([counters] { return *counters; },
                              [counters, sets](const Counters& c) {
                                *counters = c;
                                ++*sets;
                                return absl::OkStatus();
                              });
}

// ValueState over Counters, and RngState over a generator, each set from its variant.
class CountersUnderTest : public testing::StatefulUnderTest {
 public:
  explicit CountersUnderTest(int variant)
      : counters_{variant * 100, variant * 0.5, variant},
        state_(CountersState(&counters_, &sets_)) {}
  Stateful& stateful() override { return state_; }

 private:
  Counters counters_;
  int sets_ = 0;
  ValueState<Counters> state_;
};

class RngUnderTest : public testing::StatefulUnderTest {
 public:
  explicit RngUnderTest(int variant)
      : generator_(at::detail::createCPUGenerator(variant)), state_(0, 1, generator_) {}
  Stateful& stateful() override { return state_; }

 private:
  at::Generator generator_;
  RngState state_;
};

INSTANTIATE_TEST_SUITE_P(
    TrainingState, StatefulConformanceTest,
    ::testing::Values(testing::StatefulCase{"value_state",
                                            [](int variant) {
                                              return std::make_unique<CountersUnderTest>(variant);
                                            }},
                      testing::StatefulCase{
                          "rng_state",
                          [](int variant) { return std::make_unique<RngUnderTest>(variant); }}),
    testing::StatefulCaseName);

TEST(ValueStateTest, SavesEveryFieldAndLoadsThemThroughTheSetter) {
  Counters source{1234, 0.5, 17};
  int source_sets = 0;
  ValueState<Counters> source_state = CountersState(&source, &source_sets);
  KEEL_ASSERT_OK_AND_ASSIGN(State saved, source_state.StateDict());
  EXPECT_TRUE(saved.tensors.empty());
  EXPECT_EQ(saved.values, base::Json({{"tokens", 1234}, {"loss", 0.5}, {"best_step", 17}}));

  Counters fresh;
  int sets = 0;
  ValueState<Counters> fresh_state = CountersState(&fresh, &sets);
  KEEL_ASSERT_OK_AND_ASSIGN(LoadReport report,
                            LoadInMemory({{"counters", &fresh_state}}, {{"counters", saved}}));
  EXPECT_TRUE(report.clean()) << report.ToString();
  EXPECT_EQ(sets, 1);
  EXPECT_EQ(fresh.tokens, 1234);
  EXPECT_EQ(fresh.loss, 0.5);
  EXPECT_EQ(fresh.best_step, 17);
}

TEST(ValueStateTest, AMissingFieldIsReportedAndNothingIsSet) {
  Counters source{1, 2.0, std::nullopt};
  int unused = 0;
  KEEL_ASSERT_OK_AND_ASSIGN(State saved, CountersState(&source, &unused).StateDict());
  saved.values.erase("loss");
  Counters fresh{7, 8.0, 9};
  int sets = 0;
  ValueState<Counters> fresh_state = CountersState(&fresh, &sets);
  EXPECT_THAT(LoadInMemory({{"counters", &fresh_state}}, {{"counters", saved}}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("loss")));
  EXPECT_EQ(sets, 0);
  EXPECT_EQ(fresh.tokens, 7);
}

TEST(ValueStateTest, IllTypedValuesAndSetterErrorsAreErrors) {
  Counters source;
  int unused = 0;
  KEEL_ASSERT_OK_AND_ASSIGN(State saved, CountersState(&source, &unused).StateDict());
  saved.values["tokens"] = "many";
  ValueState<Counters> target = CountersState(&source, &unused);
  EXPECT_THAT(LoadInMemory({{"counters", &target}}, {{"counters", saved}}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("tokens")));

  saved.values["tokens"] = 3;
  ValueState<Counters> refusing(
      [] { return Counters(); },
      [](const Counters& c) { return absl::FailedPreconditionError("not now"); });
  EXPECT_THAT(LoadInMemory({{"counters", &refusing}}, {{"counters", saved}}),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("not now")));
}

TEST(ValueStateTest, RoundTripsAStepScheduler) {
  scheduling::StepSchedulerOptions options;
  options.global_batch_size = 4;
  options.num_epochs = 3;
  options.ckpt_every_steps.reset();
  options.preemption_signal.reset();
  auto make = [&]() {
    scheduling::StepScheduleRuntime runtime;
    runtime.source_length = 40;
    return scheduling::StepSchedule::Create(options, std::move(runtime));
  };
  KEEL_ASSERT_OK_AND_ASSIGN(scheduling::StepSchedule source, make());
  KEEL_ASSERT_OK(source.LoadStateDict({/*step=*/5, /*epoch=*/1}));
  ValueState<scheduling::StepSchedulerState> source_state(
      [&] { return source.StateDict(); },
      [&](const scheduling::StepSchedulerState& s) { return source.LoadStateDict(s); });
  KEEL_ASSERT_OK_AND_ASSIGN(State saved, source_state.StateDict());

  KEEL_ASSERT_OK_AND_ASSIGN(scheduling::StepSchedule fresh, make());
  ValueState<scheduling::StepSchedulerState> fresh_state(
      [&] { return fresh.StateDict(); },
      [&](const scheduling::StepSchedulerState& s) { return fresh.LoadStateDict(s); });
  KEEL_ASSERT_OK_AND_ASSIGN(LoadReport report, LoadInMemory({{"step_scheduler", &fresh_state}},
                                                            {{"step_scheduler", saved}}));
  EXPECT_TRUE(report.clean()) << report.ToString();
  // The fresh scheduler resumes where the saved state says.
  EXPECT_EQ(fresh.step(), source.StateDict().step);
  EXPECT_EQ(fresh.epoch(), 1);
}

std::vector<std::vector<int64_t>> Take(sampling::MegatronSampler& sampler, int n) {
  std::vector<std::vector<int64_t>> batches;
  for (auto it = sampler.begin(); it != sampler.end() && static_cast<int>(batches.size()) < n;
       ++it) {
    batches.push_back(*it);
  }
  return batches;
}

TEST(ValueStateTest, RoundTripsARandomSampler) {
  sampling::MegatronSamplerOptions options;
  options.micro_batch_size = 2;
  options.global_batch_size = 4;
  options.dataloader_type = sampling::DataloaderType::kCyclic;
  KEEL_ASSERT_OK_AND_ASSIGN(auto source, sampling::CreateMegatronSampler(options, 32, 0, 1));
  Take(*source, 3);  // an abandoned pass keeps what it consumed
  ValueState<sampling::MegatronSamplerState> source_state(
      [&] { return source->State(); },
      [&](const sampling::MegatronSamplerState& s) { return source->LoadState(s); });
  KEEL_ASSERT_OK_AND_ASSIGN(State saved, source_state.StateDict());
  const std::vector<std::vector<int64_t>> expected = Take(*source, 4);
  ASSERT_EQ(expected.size(), 4);

  KEEL_ASSERT_OK_AND_ASSIGN(auto fresh, sampling::CreateMegatronSampler(options, 32, 0, 1));
  ValueState<sampling::MegatronSamplerState> fresh_state(
      [&] { return fresh->State(); },
      [&](const sampling::MegatronSamplerState& s) { return fresh->LoadState(s); });
  KEEL_ASSERT_OK_AND_ASSIGN(LoadReport report,
                            LoadInMemory({{"sampler", &fresh_state}}, {{"sampler", saved}}));
  EXPECT_TRUE(report.clean()) << report.ToString();
  EXPECT_EQ(Take(*fresh, 4), expected);
}

TEST(RngStateTest, SavesThisRanksRowOfAPerRankTensor) {
  at::Generator generator = at::detail::createCPUGenerator(42);
  KEEL_ASSERT_OK_AND_ASSIGN(State saved, RngState(2, 3, generator).StateDict());
  ASSERT_EQ(saved.tensors.count("cpu"), 1);
  const TensorRef& ref = saved.tensors["cpu"];
  const int64_t n = generator.get_state().numel();
  EXPECT_EQ(ref.tensor.scalar_type(), at::kByte);
  EXPECT_THAT(ref.tensor.sizes().vec(), ElementsAre(1, n));
  ASSERT_TRUE(ref.layout.has_value());
  EXPECT_THAT(ref.layout->global_shape, ElementsAre(3, n));
  EXPECT_THAT(ref.layout->offsets, ElementsAre(2, 0));
}

TEST(RngStateTest, RoundTripReproducesTheSameRandomNumbers) {
  at::Generator generator = at::detail::createCPUGenerator(42);
  at::randn({3}, generator);
  KEEL_ASSERT_OK_AND_ASSIGN(State saved, RngState(0, 1, generator).StateDict());
  const at::Tensor expected = at::randn({8}, generator);
  at::randn({100}, generator);  // moves the stream on

  // Another generator, as in a fresh process.
  at::Generator fresh = at::detail::createCPUGenerator(7);
  RngState target(0, 1, fresh);
  KEEL_ASSERT_OK_AND_ASSIGN(LoadReport report, LoadInMemory({{"rng", &target}}, {{"rng", saved}}));
  EXPECT_TRUE(report.clean()) << report.ToString();
  EXPECT_TRUE(at::equal(at::randn({8}, fresh), expected));
}

TEST(RngStateTest, DefaultsToTheDefaultCpuGenerator) {
  at::manual_seed(123);
  RngState rng(0, 1);
  KEEL_ASSERT_OK_AND_ASSIGN(State saved, rng.StateDict());
  const at::Tensor expected = at::randn({5});
  at::randn({50});
  KEEL_ASSERT_OK_AND_ASSIGN(LoadReport report, LoadInMemory({{"rng", &rng}}, {{"rng", saved}}));
  EXPECT_TRUE(report.clean()) << report.ToString();
  EXPECT_TRUE(at::equal(at::randn({5}), expected));
}

TEST(RngStateTest, AnotherWorldSizeIsAMismatchOnEveryRank) {
  at::Generator generator = at::detail::createCPUGenerator(42);
  KEEL_ASSERT_OK_AND_ASSIGN(State saved, RngState(1, 2, generator).StateDict());
  const at::Tensor expected = at::randn({4}, generator);

  // Rank 1 of 3 has a saved row: strict fails, non-strict restores it.
  at::Generator rank1 = at::detail::createCPUGenerator(7);
  RngState rank1_state(1, 3, rank1);
  EXPECT_THAT(LoadInMemory({{"rng", &rank1_state}}, {{"rng", saved}}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("saved for 2 ranks, loaded by 3")));
  rank1.set_current_seed(7);
  KEEL_ASSERT_OK_AND_ASSIGN(
      LoadReport report, LoadInMemory({{"rng", &rank1_state}}, {{"rng", saved}}, /*strict=*/false));
  EXPECT_THAT(report.mismatches, ElementsAre(HasSubstr("saved for 2 ranks, loaded by 3")));
  EXPECT_TRUE(at::equal(at::randn({4}, rank1), expected));

  // Rank 2 of 3 has none: its generator is left as it is.
  at::Generator rank2 = at::detail::createCPUGenerator(7);
  const at::Tensor rank2_expected = at::randn({4}, at::detail::createCPUGenerator(7));
  RngState rank2_state(2, 3, rank2);
  KEEL_ASSERT_OK_AND_ASSIGN(
      report, LoadInMemory({{"rng", &rank2_state}}, {{"rng", saved}}, /*strict=*/false));
  EXPECT_THAT(report.mismatches, ElementsAre(HasSubstr("saved for 2 ranks, loaded by 3")));
  EXPECT_TRUE(at::equal(at::randn({4}, rank2), rank2_expected));
}

// An elastic resume: with allow_world_size_change, a checkpoint of 2 ranks loads strictly on
// 1 and on 3 ranks, restores nothing, and says how many ranks saved it.
TEST(RngStateTest, AllowedWorldSizeChangeRestoresNothingAndSaysSo) {
  at::Generator generator = at::detail::createCPUGenerator(42);
  KEEL_ASSERT_OK_AND_ASSIGN(State saved, RngState(1, 2, generator).StateDict());
  for (int64_t world : {1, 3}) {
    SCOPED_TRACE(world);
    at::Generator mine = at::detail::createCPUGenerator(7);
    const at::Tensor untouched = at::randn({4}, at::detail::createCPUGenerator(7));
    RngStateOptions options;
    options.allow_world_size_change = true;
    RngState state(0, world, mine, options);
    EXPECT_EQ(state.saved_world_size(), std::nullopt);
    KEEL_ASSERT_OK_AND_ASSIGN(LoadReport report, LoadInMemory({{"rng", &state}}, {{"rng", saved}}));
    EXPECT_TRUE(report.clean()) << report.ToString();
    EXPECT_EQ(state.saved_world_size(), 2);
    EXPECT_TRUE(at::equal(at::randn({4}, mine), untouched));
  }
  // The same number of ranks restores as usual.
  RngStateOptions options;
  options.allow_world_size_change = true;
  at::Generator same = at::detail::createCPUGenerator(7);
  RngState state(1, 2, same, options);
  KEEL_ASSERT_OK(LoadInMemory({{"rng", &state}}, {{"rng", saved}}).status());
  EXPECT_EQ(state.saved_world_size(), 2);
  EXPECT_TRUE(at::equal(same.get_state(), generator.get_state()));
}

TEST(RngStateTest, AMissingStateIsReported) {
  RngState target(0, 1, at::detail::createCPUGenerator(1));
  EXPECT_THAT(LoadInMemory({{"rng", &target}}, {{"rng", State()}}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("rng/cpu")));
}

}  // namespace
}  // namespace keel::checkpoint
