// One training run per run directory: an advisory lock (flock) on <run_dir>/.keel.lock that
// the kernel releases when the holder exits or dies, so a killed run never leaves a stale lock.
// The file names the holder (pid and host) for the message a second run gets.
//
//   KEEL_ASSIGN_OR_RETURN(RunDirLock lock, RunDirLock::Acquire(options.run_dir));
//   // ... the run; the lock is released when `lock` goes away
#ifndef KEEL_TOOLS_RECIPE_RUN_DIR_LOCK_H_
#define KEEL_TOOLS_RECIPE_RUN_DIR_LOCK_H_

#include <string>

#include "absl/status/statusor.h"
#include "base/files.h"

namespace keel::tools::recipe {

class RunDirLock {
 public:
  // Creates `run_dir` if it is missing and takes its lock without waiting; touches nothing
  // else in it. Errors: kFailedPrecondition naming the directory and the process that holds
  // it; base::ErrnoCode's for the directory or the lock file.
  [[nodiscard]] static absl::StatusOr<RunDirLock> Acquire(const std::string& run_dir);

  // The lock file's path.
  const std::string& path() const { return path_; }

 private:
  RunDirLock(std::string path, base::UniqueFd fd) : path_(std::move(path)), fd_(std::move(fd)) {}

  std::string path_;
  base::UniqueFd fd_;
};

}  // namespace keel::tools::recipe

#endif  // KEEL_TOOLS_RECIPE_RUN_DIR_LOCK_H_
