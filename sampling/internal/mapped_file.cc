#include "sampling/internal/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "base/status.h"

namespace keel::sampling::internal {

absl::StatusOr<std::shared_ptr<const MappedFile>> MappedFile::Open(const std::string& path) {
  KEEL_ASSIGN_OR_RETURN(base::UniqueFd fd, base::OpenFile(path, O_RDONLY));
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return base::ErrnoError("examining", path);
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("cannot map ", path, ": not a regular file"));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  uint8_t* data = nullptr;
  if (size > 0) {
    // MAP_NORESERVE: a writable private mapping of a large file must not be charged against
    // the commit limit up front; only pages actually written are copied.
    void* mapped =
        ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_NORESERVE, fd.get(), 0);
    if (mapped == MAP_FAILED) return base::ErrnoError("mapping", path);
    data = static_cast<uint8_t*>(mapped);
  }
  // Closing the descriptor leaves the mapping, which keeps the file open.
  return std::shared_ptr<const MappedFile>(new MappedFile(path, data, size));
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

}  // namespace keel::sampling::internal
