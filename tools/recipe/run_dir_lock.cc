#include "tools/recipe/run_dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "base/status.h"

namespace keel::tools::recipe {
namespace {

constexpr char kLockName[] = ".keel.lock";

std::string HostName() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

}  // namespace

absl::StatusOr<RunDirLock> RunDirLock::Acquire(const std::string& run_dir) {
  KEEL_RETURN_IF_ERROR(base::MakeDirectories(run_dir));
  const std::string path = base::JoinPath(run_dir, kLockName);
  // Opened without truncation: the holder's record stays readable for the message below.
  KEEL_ASSIGN_OR_RETURN(base::UniqueFd fd, base::OpenFile(path, O_RDWR | O_CREAT));
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK) return base::ErrnoError("locking", path);
    absl::StatusOr<std::string> holder = base::ReadFile(path);
    const std::string who = holder.ok() && !holder->empty()
                                ? std::string(absl::StripTrailingAsciiWhitespace(*holder))
                                : std::string("another process");
    return absl::FailedPreconditionError(
        absl::StrCat("run directory ", run_dir, " is in use by ", who, " (lock ", path,
                     "); wait for that run to end, stop it, or choose another run_dir"));
  }
  const std::string record = absl::StrCat("process ", ::getpid(), " on ", HostName(), "\n");
  if (::ftruncate(fd.get(), 0) != 0) return base::ErrnoError("truncating", path);
  KEEL_RETURN_IF_ERROR(base::WriteAll(fd.get(), record, path));
  return RunDirLock(path, std::move(fd));
}

}  // namespace keel::tools::recipe
