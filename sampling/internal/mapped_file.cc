#include "sampling/internal/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace keel::sampling::internal {
namespace {

absl::Status SystemError(const std::string& what, const std::string& path, int error) {
  const std::string message = absl::StrCat(what, " ", path, ": ", std::strerror(error));
  return error == ENOENT ? absl::NotFoundError(message) : absl::UnavailableError(message);
}

}  // namespace

absl::StatusOr<std::shared_ptr<const MappedFile>> MappedFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return SystemError("cannot open", path, errno);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int error = errno;
    ::close(fd);
    return SystemError("cannot examine", path, error);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::UnavailableError(absl::StrCat("cannot map ", path, ": not a regular file"));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  uint8_t* data = nullptr;
  if (size > 0) {
    // MAP_NORESERVE: a writable private mapping of a large file must not be charged against
    // the commit limit up front; only pages actually written are copied.
    void* mapped =
        ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_NORESERVE, fd, 0);
    if (mapped == MAP_FAILED) {
      const int error = errno;
      ::close(fd);
      return SystemError("cannot map", path, error);
    }
    data = static_cast<uint8_t*>(mapped);
  }
  ::close(fd);  // the mapping keeps the file open
  return std::shared_ptr<const MappedFile>(new MappedFile(path, data, size));
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

}  // namespace keel::sampling::internal
