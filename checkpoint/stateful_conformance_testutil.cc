#include "checkpoint/stateful_conformance_testutil.h"

#include <string>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/checkpoint.h"
#include "gmock/gmock.h"
#include "testing/files.h"
#include "testing/status_matchers.h"

namespace keel::checkpoint::testing {
namespace {

using ::keel::testing::IsOk;
using ::keel::testing::StatusIs;
using ::testing::HasSubstr;

constexpr char kName[] = "object";

State StateOf(StatefulUnderTest& object) {
  absl::StatusOr<State> state = object.stateful().StateDict();
  EXPECT_THAT(state.status(), IsOk());
  return state.ok() ? *std::move(state) : State();
}

// Whether two states hold the same tensor keys, layouts, dtypes and bytes, and values.
::testing::AssertionResult SameState(const State& a, const State& b) {
  if (a.values != b.values) {
    return ::testing::AssertionFailure()
           << "values differ: " << a.values.dump() << " vs " << b.values.dump();
  }
  if (a.tensors.size() != b.tensors.size()) {
    return ::testing::AssertionFailure() << a.tensors.size() << " tensors vs " << b.tensors.size();
  }
  for (const auto& [key, ref] : a.tensors) {
    auto it = b.tensors.find(key);
    if (it == b.tensors.end()) return ::testing::AssertionFailure() << "no tensor " << key;
    const at::Tensor& other = it->second.tensor;
    if (ref.tensor.scalar_type() != other.scalar_type() || !ref.tensor.cpu().equal(other.cpu())) {
      return ::testing::AssertionFailure() << "tensor " << key << " differs";
    }
    const bool placed = ref.layout.has_value();
    if (placed != it->second.layout.has_value() ||
        (placed && (ref.layout->offsets != it->second.layout->offsets ||
                    ref.layout->global_shape != it->second.layout->global_shape))) {
      return ::testing::AssertionFailure() << "layout of " << key << " differs";
    }
  }
  return ::testing::AssertionSuccess();
}

// The round trips below could not fail if the two variants were equal.
TEST_P(StatefulConformanceTest, VariantsDifferAndStateDictIsStable) {
  auto first = GetParam().make(1);
  auto second = GetParam().make(2);
  const State state = StateOf(*first);
  EXPECT_FALSE(state.tensors.empty() && state.values.empty()) << "a Stateful with no state";
  EXPECT_TRUE(SameState(state, StateOf(*first)));
  EXPECT_TRUE(SameState(state, StateOf(*GetParam().make(1))));
  EXPECT_FALSE(SameState(state, StateOf(*second)));
}

TEST_P(StatefulConformanceTest, RoundTripsThroughMemory) {
  auto source = GetParam().make(1);
  auto target = GetParam().make(2);
  KEEL_ASSERT_OK_AND_ASSIGN(
      LoadReport report, LoadInMemory({{kName, &target->stateful()}}, {{kName, StateOf(*source)}}));
  EXPECT_TRUE(report.clean()) << report.ToString();
  EXPECT_TRUE(SameState(StateOf(*target), StateOf(*source)));
}

TEST_P(StatefulConformanceTest, RoundTripsThroughACheckpointOnDisk) {
  auto source = GetParam().make(1);
  auto target = GetParam().make(2);
  CheckpointerOptions options;
  options.checkpoint_dir = keel::testing::NewTempDir("conformance");
  KEEL_ASSERT_OK_AND_ASSIGN(auto checkpointer, Checkpointer::Create(options, nullptr));
  KEEL_ASSERT_OK(checkpointer->Save({{kName, &source->stateful()}}, /*step=*/5, /*epoch=*/1));
  KEEL_ASSERT_OK_AND_ASSIGN(
      LoadReport report,
      LoadCheckpoint(options.checkpoint_dir + "/step_0000000005", {{kName, &target->stateful()}}));
  EXPECT_TRUE(report.clean()) << report.ToString();
  EXPECT_TRUE(SameState(StateOf(*target), StateOf(*source)));
}

TEST_P(StatefulConformanceTest, LoadingTwiceIsLoadingOnce) {
  auto source = GetParam().make(1);
  auto target = GetParam().make(2);
  const std::map<std::string, State> saved = {{kName, StateOf(*source)}};
  KEEL_ASSERT_OK(LoadInMemory({{kName, &target->stateful()}}, saved).status());
  KEEL_ASSERT_OK(LoadInMemory({{kName, &target->stateful()}}, saved).status());
  EXPECT_TRUE(SameState(StateOf(*target), StateOf(*source)));
}

TEST_P(StatefulConformanceTest, StrictLoadFromNothingNamesTheObject) {
  auto target = GetParam().make(2);
  const State before = StateOf(*target);
  EXPECT_THAT(LoadInMemory({{kName, &target->stateful()}}, {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(absl::StrCat("missing keys: ", kName))));
  EXPECT_TRUE(SameState(StateOf(*target), before)) << "a failed load changed the object";
}

// A checkpoint that fits but for one extra tensor: a strict load refuses it, and the object
// keeps its state (the fitting parts are not loaded first).
TEST_P(StatefulConformanceTest, AStrictLoadWithAnUnexpectedKeyChangesNothing) {
  auto source = GetParam().make(1);
  auto target = GetParam().make(2);
  const State before = StateOf(*target);
  State saved = StateOf(*source);
  saved.tensors["not_a_key_of_this_object"] = TensorRef{at::ones({3})};
  EXPECT_THAT(LoadInMemory({{kName, &target->stateful()}}, {{kName, saved}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("unexpected keys: object/not_a_key_of_this_object")));
  EXPECT_TRUE(SameState(StateOf(*target), before)) << "a failed load changed the object";
}

// As above, with one saved tensor of another shape.
TEST_P(StatefulConformanceTest, AStrictLoadWithAMismatchedShapeChangesNothing) {
  auto source = GetParam().make(1);
  auto target = GetParam().make(2);
  const State before = StateOf(*target);
  State saved = StateOf(*source);
  if (saved.tensors.empty()) GTEST_SKIP() << "no tensors";
  TensorRef& last = saved.tensors.rbegin()->second;
  last = TensorRef{at::cat({last.tensor.reshape({-1}), last.tensor.reshape({-1})}).reshape({-1, 1}),
                   std::nullopt};
  EXPECT_THAT(LoadInMemory({{kName, &target->stateful()}}, {{kName, saved}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("in the checkpoint")));
  EXPECT_TRUE(SameState(StateOf(*target), before)) << "a failed load changed the object";
}

}  // namespace

std::string StatefulCaseName(const ::testing::TestParamInfo<StatefulCase>& info) {
  return info.param.name;
}

absl::StatusOr<LoadReport> LoadInMemory(const Statefuls& targets,
                                        const std::map<std::string, State>& saved, bool strict) {
  LoadOptions options;
  options.strict = strict;
  return LoadFromMemory(targets, saved, options);
}

}  // namespace keel::checkpoint::testing
