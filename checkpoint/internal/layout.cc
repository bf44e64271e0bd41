#include "checkpoint/internal/layout.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "base/status.h"

namespace keel::checkpoint::internal {
namespace {

constexpr char kStepPrefix[] = "step_";
constexpr char kDeletingPrefix[] = ".deleting.";
constexpr char kTemporarySuffix[] = ".tmp";
constexpr char kQuarantineDir[] = "quarantine";

}  // namespace

std::string StepDirName(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step_%010lld", static_cast<long long>(step));
  return name;
}

std::optional<int64_t> StepOfDirName(const std::string& name) {
  if (!absl::StartsWith(name, kStepPrefix)) return std::nullopt;
  const std::string digits = name.substr(sizeof(kStepPrefix) - 1);
  int64_t step = 0;
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos ||
      !absl::SimpleAtoi(digits, &step)) {
    return std::nullopt;
  }
  return step;
}

std::string TemporaryDirName(const std::string& name) {
  return absl::StrCat(".", name, kTemporarySuffix);
}

std::string DeletingDirName(const std::string& name) { return absl::StrCat(kDeletingPrefix, name); }

bool IsLeftover(const std::string& name) {
  return absl::StartsWith(name, kDeletingPrefix) ||
         (absl::StartsWith(name, absl::StrCat(".", kStepPrefix)) &&
          absl::EndsWith(name, kTemporarySuffix));
}

absl::StatusOr<std::vector<CommittedStep>> ListCommitted(const std::string& checkpoint_dir) {
  KEEL_ASSIGN_OR_RETURN(std::vector<std::string> names, base::ListDirectory(checkpoint_dir));
  std::vector<CommittedStep> steps;
  for (const std::string& name : names) {
    if (std::optional<int64_t> step = StepOfDirName(name)) {
      steps.push_back({*step, name, base::JoinPath(checkpoint_dir, name)});
    }
  }
  std::sort(steps.begin(), steps.end(), [](const CommittedStep& a, const CommittedStep& b) {
    return a.step != b.step ? a.step > b.step : a.name > b.name;
  });
  return steps;
}

absl::StatusOr<std::string> Quarantine(const std::string& checkpoint_dir, const std::string& name) {
  const std::string dir = base::JoinPath(checkpoint_dir, kQuarantineDir);
  KEEL_RETURN_IF_ERROR(base::MakeDirectory(dir));
  std::string destination = base::JoinPath(dir, name);
  for (int suffix = 1; base::PathExists(destination); ++suffix) {
    destination = base::JoinPath(dir, absl::StrCat(name, ".", suffix));
  }
  KEEL_RETURN_IF_ERROR(base::RenameDurably(base::JoinPath(checkpoint_dir, name), destination));
  KEEL_RETURN_IF_ERROR(base::FsyncPath(checkpoint_dir));
  return destination;
}

bool SamePath(const std::string& a, const std::string& b) {
  struct stat sa, sb;
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

}  // namespace keel::checkpoint::internal
