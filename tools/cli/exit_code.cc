#include "tools/cli/exit_code.h"

#include <iostream>

#include "absl/strings/str_cat.h"

namespace keel::tools::cli {

int ExitCodeFor(const absl::Status& status) {
  if (status.ok()) return kExitSuccess;
  return status.code() == absl::StatusCode::kInvalidArgument ? kExitUsage : kExitFailure;
}

int Exit(absl::string_view program, const absl::Status& status) {
  // One write, so that the lines of ranks failing together do not interleave.
  if (!status.ok()) std::cerr << absl::StrCat(program, ": ", status.message(), "\n");
  return ExitCodeFor(status);
}

int Exit(absl::string_view program, const absl::StatusOr<int>& code) {
  return code.ok() ? *code : Exit(program, code.status());
}

}  // namespace keel::tools::cli
