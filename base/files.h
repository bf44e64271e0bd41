// POSIX file plumbing for every Keel package: one errno -> status table, an owning file
// descriptor, whole-file reads and writes, durable atomic replacement, mkdir -p, directory
// listing and recursive removal. Every error names the operation and the path and carries the
// code of the table below, so a full disk is kResourceExhausted wherever it happens.
//
//   KEEL_RETURN_IF_ERROR(keel::base::MakeDirectories(dir));
//   KEEL_RETURN_IF_ERROR(keel::base::WriteFileAtomically(keel::base::JoinPath(dir, "latest"),
//                                                        "step_0000000100\n"));
//   KEEL_ASSIGN_OR_RETURN(std::string text, keel::base::ReadFile(path));
#ifndef KEEL_BASE_FILES_H_
#define KEEL_BASE_FILES_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace keel::base {

// The status code for an errno value:
//   ENOENT                                        kNotFound
//   EEXIST, ENOTEMPTY                             kAlreadyExists
//   ENOSPC, EDQUOT, EFBIG, EMFILE, ENFILE, ENOMEM kResourceExhausted (full disk, size limit)
//   EACCES, EPERM, EROFS                          kPermissionDenied
//   ENOTDIR, EISDIR, ENAMETOOLONG, ELOOP, EINVAL  kInvalidArgument (a path that cannot work)
//   EIO                                           kDataLoss (the device lost the bytes)
//   EAGAIN, EBUSY, EINTR, ETIMEDOUT, EPIPE,
//   ECONNREFUSED, ECONNRESET                      kUnavailable
//   anything else                                 kInternal
absl::StatusCode ErrnoCode(int error);

// "<what> <path>: <the system's reason>" with ErrnoCode(error).
absl::Status ErrnoStatus(int error, absl::string_view what, absl::string_view path);

// ErrnoStatus for the current errno, right after the system call `what` on `path` failed.
absl::Status ErrnoError(absl::string_view what, absl::string_view path);

// An open file descriptor, closed when the object goes away.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept;
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  ~UniqueFd();

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Gives up ownership.
  int release();
  // Closes now, reporting close(2)'s error (for files written: a late write error).
  [[nodiscard]] absl::Status Close(absl::string_view path);

 private:
  int fd_ = -1;
};

// open(2) with O_CLOEXEC added. Errors: from the table, naming `path`.
[[nodiscard]] absl::StatusOr<UniqueFd> OpenFile(const std::string& path, int flags,
                                                mode_t mode = 0644);

// Writes all of `data` at the file position, retrying short and interrupted writes.
[[nodiscard]] absl::Status WriteAll(int fd, absl::string_view data, absl::string_view path);

// Reads exactly `size` bytes at `offset`. Errors: kDataLoss if the file ends first.
[[nodiscard]] absl::Status PreadAll(int fd, absl::string_view path, void* out, size_t size,
                                    uint64_t offset);

[[nodiscard]] absl::StatusOr<std::string> ReadFile(const std::string& path);

// Creates or truncates `path` and writes `contents` (not fsynced).
[[nodiscard]] absl::Status WriteFile(const std::string& path, absl::string_view contents);

// A new, empty file at `path` for writing: whatever `path` names (a stale file, a symbolic
// link) is removed first, never written through, and the file is created exclusively
// (O_EXCL | O_NOFOLLOW: a link planted in between fails the call instead of being followed).
[[nodiscard]] absl::StatusOr<UniqueFd> CreateFileExclusively(const std::string& path);

// Replaces `path` with `contents` durably and atomically: a temporary sibling "<path>.tmp" is
// written and fsynced, renamed over `path`, and the directory fsynced. A crash leaves either
// the old or the new contents.
[[nodiscard]] absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents);

// fsync(2) of a file or directory.
[[nodiscard]] absl::Status FsyncPath(const std::string& path);

// rename(2), then fsync of the destination's parent directory.
[[nodiscard]] absl::Status RenameDurably(const std::string& from, const std::string& to);

// mkdir: creates the directory `path`, whose parent must exist; an existing one is fine.
[[nodiscard]] absl::Status MakeDirectory(const std::string& path);

// mkdir -p: creates `path` and its missing parents; an existing directory is fine.
[[nodiscard]] absl::Status MakeDirectories(const std::string& path);

// Names in a directory (no "." or ".."), unsorted. Errors: kNotFound for a missing directory.
[[nodiscard]] absl::StatusOr<std::vector<std::string>> ListDirectory(const std::string& path);

// Removes a file or a directory tree (without following links); a missing path is fine.
[[nodiscard]] absl::Status RemoveTree(const std::string& path);

bool PathExists(const std::string& path);
bool IsDirectory(const std::string& path);

// "dir/name" (no doubled '/'); `name` alone for an empty `dir`.
std::string JoinPath(absl::string_view dir, absl::string_view name);
// The directory part of `path` ("." when it has none).
std::string ParentDirectory(const std::string& path);

}  // namespace keel::base

#endif  // KEEL_BASE_FILES_H_
