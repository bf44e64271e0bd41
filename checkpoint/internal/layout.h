// The names inside a checkpoint_dir: committed step directories ("step_<10 digits>"), the
// temporary directory a save writes into (".step_<...>.tmp"), directories being deleted
// (".deleting.step_<...>"), checkpoints that did not load (quarantine/step_<...>), and the
// "latest" file naming the newest committed step. Only names matching StepDirName directly under
// checkpoint_dir are checkpoints; everything else is out of the committed namespace.
#ifndef KEEL_CHECKPOINT_INTERNAL_LAYOUT_H_
#define KEEL_CHECKPOINT_INTERNAL_LAYOUT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace keel::checkpoint::internal {

inline constexpr char kLatestName[] = "latest";

// "step_0000000100" for step 100.
std::string StepDirName(int64_t step);
// The step of a committed directory name, if `name` is one.
std::optional<int64_t> StepOfDirName(const std::string& name);
// Where a save of step directory `name` is written before its commit.
std::string TemporaryDirName(const std::string& name);
// Where retention moves directory `name` before removing it.
std::string DeletingDirName(const std::string& name);
// Whether `name` is what an interrupted save or deletion left behind.
bool IsLeftover(const std::string& name);

struct CommittedStep {
  int64_t step = 0;
  std::string name;
  std::string path;
};

// The committed step directories under `checkpoint_dir`, newest first.
// Errors: kNotFound if `checkpoint_dir` does not exist.
[[nodiscard]] absl::StatusOr<std::vector<CommittedStep>> ListCommitted(
    const std::string& checkpoint_dir);

// Moves the step directory `name` out of the committed namespace, to
// <checkpoint_dir>/quarantine/<name>, or <name>.1, .2, ... when that is taken; returns the new
// path. The rename is durable. Errors: base::ErrnoCode's, naming the paths.
[[nodiscard]] absl::StatusOr<std::string> Quarantine(const std::string& checkpoint_dir,
                                                     const std::string& name);

// Whether two paths name the same existing file or directory.
bool SamePath(const std::string& a, const std::string& b);

}  // namespace keel::checkpoint::internal

#endif  // KEEL_CHECKPOINT_INTERNAL_LAYOUT_H_
