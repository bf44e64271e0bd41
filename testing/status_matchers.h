// gMock matchers and assertion macros for absl::Status and absl::StatusOr.
//
//   EXPECT_THAT(Foo::Create(bad), StatusIs(absl::StatusCode::kInvalidArgument,
//                                          HasSubstr("lr_decay_steps")));
//   KEEL_ASSERT_OK_AND_ASSIGN(auto foo, Foo::Create(good));
#ifndef KEEL_TESTING_STATUS_MATCHERS_H_
#define KEEL_TESTING_STATUS_MATCHERS_H_

#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace keel::testing {

inline const absl::Status& GetStatus(const absl::Status& status) { return status; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}

// Matches a Status or StatusOr whose code is `code` and whose message matches `message`.
MATCHER_P2(StatusIs, code, message,
           absl::StrCat("has code ", absl::StatusCodeToString(code), " and a message that ",
                        ::testing::DescribeMatcher<std::string>(message))) {
  const absl::Status& status = GetStatus(arg);
  *result_listener << "whose status is " << status;
  return status.code() == code && ::testing::Matches(::testing::Matcher<std::string>(message))(
                                      std::string(status.message()));
}

// Matches an OK Status or StatusOr.
MATCHER(IsOk, "is OK") {
  const absl::Status& status = GetStatus(arg);
  *result_listener << "whose status is " << status;
  return status.ok();
}

}  // namespace keel::testing

#define KEEL_EXPECT_OK(expr) EXPECT_THAT(expr, ::keel::testing::IsOk())
#define KEEL_ASSERT_OK(expr) ASSERT_THAT(expr, ::keel::testing::IsOk())

// Asserts that `rexpr` (a StatusOr) is OK and moves its value into `lhs`.
#define KEEL_ASSERT_OK_AND_ASSIGN(lhs, rexpr) \
  KEEL_ASSERT_OK_AND_ASSIGN_IMPL_(KEEL_STATUS_CONCAT_(keel_statusor_, __LINE__), lhs, rexpr)
#define KEEL_ASSERT_OK_AND_ASSIGN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                    \
  ASSERT_TRUE(statusor.ok()) << statusor.status();            \
  lhs = std::move(statusor).value()

#endif  // KEEL_TESTING_STATUS_MATCHERS_H_
