#include "base/files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace keel::base {

absl::StatusCode ErrnoCode(int error) {
  switch (error) {
    case ENOENT:
      return absl::StatusCode::kNotFound;
    case EEXIST:
    case ENOTEMPTY:
      return absl::StatusCode::kAlreadyExists;
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
    case EMFILE:
    case ENFILE:
    case ENOMEM:
      return absl::StatusCode::kResourceExhausted;
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::StatusCode::kPermissionDenied;
    case ENOTDIR:
    case EISDIR:
    case ENAMETOOLONG:
    case ELOOP:
    case EINVAL:
      return absl::StatusCode::kInvalidArgument;
    case EIO:
      return absl::StatusCode::kDataLoss;
    case EAGAIN:
    case EBUSY:
    case EINTR:
    case ETIMEDOUT:
    case EPIPE:
    case ECONNREFUSED:
    case ECONNRESET:
      return absl::StatusCode::kUnavailable;
    default:
      return absl::StatusCode::kInternal;
  }
}

absl::Status ErrnoStatus(int error, absl::string_view what, absl::string_view path) {
  return absl::Status(ErrnoCode(error), absl::StrCat(what, path.empty() ? "" : " ", path, ": ",
                                                     std::strerror(error)));
}

absl::Status ErrnoError(absl::string_view what, absl::string_view path) {
  return ErrnoStatus(errno, what, path);
}

UniqueFd::UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.release();
  }
  return *this;
}

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) ::close(fd_);
}

int UniqueFd::release() { return std::exchange(fd_, -1); }

absl::Status UniqueFd::Close(absl::string_view path) {
  if (fd_ < 0) return absl::OkStatus();
  if (::close(release()) != 0) return ErrnoError("closing", path);
  return absl::OkStatus();
}

absl::StatusOr<UniqueFd> OpenFile(const std::string& path, int flags, mode_t mode) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  if (fd < 0) return ErrnoError("opening", path);
  return UniqueFd(fd);
}

absl::Status WriteAll(int fd, absl::string_view data, absl::string_view path) {
  while (!data.empty()) {
    const ssize_t written = ::write(fd, data.data(), data.size());
    if (written < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("writing", path);
    }
    if (written == 0) return ErrnoStatus(ENOSPC, "writing", path);  // no progress: no room
    data.remove_prefix(static_cast<size_t>(written));
  }
  return absl::OkStatus();
}

absl::Status PreadAll(int fd, absl::string_view path, void* out, size_t size, uint64_t offset) {
  char* bytes = static_cast<char*>(out);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd, bytes + done, size - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("reading", path);
    }
    if (n == 0) {
      return absl::DataLossError(absl::StrCat(path, " is truncated: wanted ", size,
                                              " bytes at offset ", offset, ", the file ends after ",
                                              done));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  KEEL_ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(path, O_RDONLY));
  std::string contents;
  char buffer[1 << 16];
  while (true) {
    const ssize_t got = ::read(fd.get(), buffer, sizeof(buffer));
    if (got < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("reading", path);
    }
    if (got == 0) return contents;
    contents.append(buffer, static_cast<size_t>(got));
  }
}

absl::Status WriteFile(const std::string& path, absl::string_view contents) {
  KEEL_ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(path, O_WRONLY | O_CREAT | O_TRUNC));
  KEEL_RETURN_IF_ERROR(WriteAll(fd.get(), contents, path));
  return fd.Close(path);
}

absl::StatusOr<UniqueFd> CreateFileExclusively(const std::string& path) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return ErrnoError("removing", path);
  return OpenFile(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW);
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents) {
  const std::string temporary = absl::StrCat(path, ".tmp");
  {
    KEEL_ASSIGN_OR_RETURN(UniqueFd fd, CreateFileExclusively(temporary));
    KEEL_RETURN_IF_ERROR(WriteAll(fd.get(), contents, temporary));
    if (::fsync(fd.get()) != 0) return ErrnoError("fsync of", temporary);
    KEEL_RETURN_IF_ERROR(fd.Close(temporary));
  }
  return RenameDurably(temporary, path);
}

absl::Status FsyncPath(const std::string& path) {
  KEEL_ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(path, O_RDONLY));
  if (::fsync(fd.get()) != 0) return ErrnoError("fsync of", path);
  return absl::OkStatus();
}

absl::Status RenameDurably(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    return ErrnoError(absl::StrCat("renaming ", from, " to"), to);
  }
  return FsyncPath(ParentDirectory(to));
}

absl::Status MakeDirectory(const std::string& path) {
  if (::mkdir(path.c_str(), 0755) != 0) {
    if (errno != EEXIST) return ErrnoError("creating directory", path);
    if (!IsDirectory(path)) return ErrnoStatus(ENOTDIR, "creating directory", path);
  }
  return absl::OkStatus();
}

absl::Status MakeDirectories(const std::string& path) {
  if (path.empty() || IsDirectory(path)) return absl::OkStatus();
  const std::string parent = ParentDirectory(path);
  if (parent != path) KEEL_RETURN_IF_ERROR(MakeDirectories(parent));
  return MakeDirectory(path);
}

absl::StatusOr<std::vector<std::string>> ListDirectory(const std::string& path) {
  DIR* dir = ::opendir(path.c_str());
  if (dir == nullptr) return ErrnoError("listing", path);
  std::vector<std::string> names;
  while (const dirent* entry = ::readdir(dir)) {
    const absl::string_view name = entry->d_name;
    if (name != "." && name != "..") names.emplace_back(name);
  }
  ::closedir(dir);
  return names;
}

absl::Status RemoveTree(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    return errno == ENOENT ? absl::OkStatus() : ErrnoError("examining", path);
  }
  if (S_ISDIR(st.st_mode)) {
    KEEL_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDirectory(path));
    for (const std::string& name : names) KEEL_RETURN_IF_ERROR(RemoveTree(JoinPath(path, name)));
    if (::rmdir(path.c_str()) != 0) return ErrnoError("removing", path);
  } else if (::unlink(path.c_str()) != 0) {
    return ErrnoError("removing", path);
  }
  return absl::OkStatus();
}

bool PathExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string JoinPath(absl::string_view dir, absl::string_view name) {
  if (dir.empty()) return std::string(name);
  if (dir.back() == '/') return absl::StrCat(dir, name);
  return absl::StrCat(dir, "/", name);
}

std::string ParentDirectory(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace keel::base
