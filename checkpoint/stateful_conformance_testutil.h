// The test battery every Stateful runs (the Stateful protocol's conformance suite): state that
// round-trips through memory and through a checkpoint on disk into an object in another state,
// loads that overwrite everything they restore, a stable StateDict, and strict loads that name
// what is missing. Each implementation instantiates it with its own factory:
//
//   INSTANTIATE_TEST_SUITE_P(ModelState, StatefulConformanceTest,
//                            ::testing::Values(StatefulCase{"tied_lm", &MakeTiedLm}),
//                            StatefulCaseName);
#ifndef KEEL_CHECKPOINT_STATEFUL_CONFORMANCE_TESTUTIL_H_
#define KEEL_CHECKPOINT_STATEFUL_CONFORMANCE_TESTUTIL_H_

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "checkpoint/state_dict.h"
#include "gtest/gtest.h"

namespace keel::checkpoint::testing {

// A Stateful with everything it refers to (a model, an optimizer, a struct).
class StatefulUnderTest {
 public:
  virtual ~StatefulUnderTest() = default;
  virtual Stateful& stateful() = 0;
};

struct StatefulCase {
  std::string name;
  // A new object in a state of its own: objects made with different `variant`s (1 and 2)
  // differ in what StateDict returns; objects of the same variant are equal.
  std::function<std::unique_ptr<StatefulUnderTest>(int variant)> make;
};

// The case name, for INSTANTIATE_TEST_SUITE_P.
std::string StatefulCaseName(const ::testing::TestParamInfo<StatefulCase>& info);

class StatefulConformanceTest : public ::testing::TestWithParam<StatefulCase> {};

// LoadFromMemory with `strict` as given.
absl::StatusOr<LoadReport> LoadInMemory(const Statefuls& targets,
                                        const std::map<std::string, State>& saved,
                                        bool strict = true);

}  // namespace keel::checkpoint::testing

#endif  // KEEL_CHECKPOINT_STATEFUL_CONFORMANCE_TESTUTIL_H_
