// Test main for every Keel test: GoogleTest's flags first, then Keel's own (e.g. --golden).
#include "absl/flags/parse.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleMock(&argc, argv);
  absl::ParseCommandLine(argc, argv);
  return RUN_ALL_TESTS();
}
