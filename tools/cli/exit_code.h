// How every Keel command-line tool ends (train, launch, preprocess, parity, ckpt, data, eval):
//   0  success (verify: nothing wrong; diff: identical)
//   1  failure: the work failed (I/O, a peer, corrupt data), or a check found problems or
//      differences
//   2  bad usage: an unknown flag, a bad value or configuration (kInvalidArgument, and
//      flags.h's for the flags Abseil parses); nothing was done
//   3  train: the hang watchdog ended the rank (recipe::kHangExitCode)
// launch also passes on the code of the first rank that failed (128 + N for signal N), and
// returns 127 when a rank cannot be started.
//
//   int main(int argc, char** argv) {
//     return keel::tools::cli::Exit("ckpt", keel::tools::Run(argc, argv));
//   }
#ifndef KEEL_TOOLS_CLI_EXIT_CODE_H_
#define KEEL_TOOLS_CLI_EXIT_CODE_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace keel::tools::cli {

inline constexpr int kExitSuccess = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

// kExitSuccess for OK, kExitUsage for kInvalidArgument, kExitFailure for any other error.
int ExitCodeFor(const absl::Status& status);

// Prints "<program>: <message>" to stderr for an error; returns ExitCodeFor(status).
int Exit(absl::string_view program, const absl::Status& status);

// As Exit for an error; otherwise the code the tool computed (a check's verdict).
int Exit(absl::string_view program, const absl::StatusOr<int>& code);

}  // namespace keel::tools::cli

#endif  // KEEL_TOOLS_CLI_EXIT_CODE_H_
