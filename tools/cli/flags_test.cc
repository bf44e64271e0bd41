// What a command line ends with, in a child process each (death tests): an unknown flag and a
// value that does not parse are bad usage (2), with Abseil's message; usage flags keep
// Abseil's exit; a good command line parses.
#include "tools/cli/flags.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "gtest/gtest.h"

ABSL_FLAG(int64_t, flags_test_count, 0, "A number.");
ABSL_FLAG(bool, flags_test_switch, false, "A switch.");

namespace keel::tools::cli {
namespace {

// ParseFlags over "tool" and `args`.
std::vector<std::string> Parse(std::vector<std::string> args) {
  args.insert(args.begin(), "tool");
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  std::vector<std::string> positional;
  for (char* arg : ParseFlags(static_cast<int>(argv.size()), argv.data())) {
    positional.emplace_back(arg);
  }
  return positional;
}

TEST(ParseFlagsTest, SetsFlagsAndReturnsThePositionalArguments) {
  EXPECT_EQ(Parse({"--flags_test_count=7", "inspect", "--noflags_test_switch", "--", "--x"}),
            (std::vector<std::string>{"tool", "inspect", "--x"}));
  EXPECT_EQ(absl::GetFlag(FLAGS_flags_test_count), 7);
  EXPECT_EQ(Parse({"--flags_test_count", "9", "--flags_test_switch"}),
            std::vector<std::string>{"tool"});
  EXPECT_EQ(absl::GetFlag(FLAGS_flags_test_count), 9);
  EXPECT_TRUE(absl::GetFlag(FLAGS_flags_test_switch));
}

TEST(ParseFlagsDeathTest, WhatDoesNotParseIsBadUsage) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(Parse({"--flags_test_cuont=1"}), ::testing::ExitedWithCode(2),
              "Unknown command line flag 'flags_test_cuont'");
  EXPECT_EXIT(Parse({"--flags_test_count=abc"}), ::testing::ExitedWithCode(2),
              "Illegal value 'abc' specified for flag 'flags_test_count'");
  EXPECT_EXIT(Parse({"--flags_test_count"}), ::testing::ExitedWithCode(2), "flags_test_count");
  EXPECT_EXIT(Parse({"--flags_test_switch=maybe"}), ::testing::ExitedWithCode(2), "maybe");
}

TEST(ParseFlagsDeathTest, UsageFlagsEndAsAbseilEndsThem) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(Parse({"--help"}), ::testing::ExitedWithCode(1), "");
  EXPECT_EXIT(Parse({"-helpfull", "--flags_test_cuont=1"}), ::testing::ExitedWithCode(1), "");
  EXPECT_EXIT(Parse({"--version"}), ::testing::ExitedWithCode(0), "");
  // After "--" a usage flag is an argument: the unknown flag before it is bad usage.
  EXPECT_EXIT(Parse({"--flags_test_cuont=1", "--", "--help"}), ::testing::ExitedWithCode(2),
              "flags_test_cuont");
}

}  // namespace
}  // namespace keel::tools::cli
