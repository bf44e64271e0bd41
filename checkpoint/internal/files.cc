#include "checkpoint/internal/files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "xxh_x86dispatch.h"
#include "xxhash.h"

namespace keel::checkpoint::internal {
namespace {

// Reads and copies into the write buffer go in pieces that stay in the L2 cache, so hashing a
// piece right after reading or copying it costs no second trip to memory; writes go in larger
// blocks, which the disk prefers.
constexpr size_t kReadBlock = size_t{1} << 20;
constexpr size_t kCopyPiece = size_t{1} << 20;
constexpr size_t kWriteBlock = size_t{16} << 20;
// O_DIRECT needs buffer addresses, offsets and lengths in multiples of the logical block
// size: 4096 covers every disk.
constexpr size_t kDirectAlignment = 4096;

// The _dispatch entry points pick the widest vector unit of the CPU (AVX2, AVX-512) at run
// time; the plain ones use SSE2 in Debian's build. The hashes are the same.
XXH3_state_t* State(void* state) { return static_cast<XXH3_state_t*>(state); }

}  // namespace

absl::Status ErrnoError(absl::string_view what, const std::string& path) {
  const int error = errno;
  const std::string message = absl::StrCat(what, " ", path, ": ", std::strerror(error));
  switch (error) {
    case ENOENT:
      return absl::NotFoundError(message);
    case ENOSPC:
    case EFBIG:
    case EDQUOT:
      return absl::ResourceExhaustedError(message);
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(message);
    default:
      return absl::InternalError(message);
  }
}

Hasher::Hasher() : state_(XXH3_createState()) { XXH3_64bits_reset(State(state_)); }
Hasher::Hasher(Hasher&& other) noexcept : state_(std::exchange(other.state_, nullptr)) {}
Hasher::~Hasher() {
  if (state_ != nullptr) XXH3_freeState(State(state_));
}
void Hasher::Update(const void* data, size_t size) {
  XXH3_64bits_update_dispatch(State(state_), data, size);
}
uint64_t Hasher::Digest() const { return XXH3_64bits_digest(State(state_)); }
void Hasher::Reset() { XXH3_64bits_reset(State(state_)); }

uint64_t Xxh3(const void* data, size_t size) { return XXH3_64bits_dispatch(data, size); }

void SegmentHasher::Update(const void* data, size_t size) {
  const char* bytes = static_cast<const char*>(data);
  while (size > 0) {
    const size_t piece = std::min(size, kChecksumSegment - in_segment_);
    segment_.Update(bytes, piece);
    in_segment_ += piece;
    bytes += piece;
    size -= piece;
    if (in_segment_ == kChecksumSegment) {
      digests_.push_back(segment_.Digest());
      segment_.Reset();
      in_segment_ = 0;
    }
  }
}

uint64_t SegmentHasher::Digest() const {
  std::vector<uint64_t> digests = digests_;
  if (in_segment_ > 0) digests.push_back(segment_.Digest());
  return CombineSegments(digests);
}

uint64_t CombineSegments(const std::vector<uint64_t>& digests) {
  std::string bytes;
  for (uint64_t digest : digests) {
    for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((digest >> (8 * i)) & 0xff));
  }
  return Xxh3(bytes.data(), bytes.size());
}

void OutputFile::FreeBlock::operator()(char* block) const { std::free(block); }

absl::StatusOr<OutputFile> OutputFile::Create(const std::string& path, Mode mode) {
  constexpr int kFlags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC;
  bool direct = mode == Mode::kDirectIfSupported;
  int fd = ::open(path.c_str(), direct ? kFlags | O_DIRECT : kFlags, 0644);
  if (fd < 0 && direct && errno == EINVAL) {  // the filesystem has no direct I/O
    direct = false;
    fd = ::open(path.c_str(), kFlags, 0644);
  }
  if (fd < 0) return ErrnoError("creating", path);
  void* block = nullptr;
  if (::posix_memalign(&block, kDirectAlignment, kWriteBlock) != 0) {
    ::close(fd);
    return absl::ResourceExhaustedError(absl::StrCat("no memory for the write buffer of ", path));
  }
  return OutputFile(path, fd, direct,
                    std::unique_ptr<char[], FreeBlock>(static_cast<char*>(block)));
}

OutputFile::OutputFile(std::string path, int fd, bool direct,
                       std::unique_ptr<char[], FreeBlock> block)
    : path_(std::move(path)), fd_(fd), direct_(direct), block_(std::move(block)) {}

OutputFile::OutputFile(OutputFile&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(std::exchange(other.fd_, -1)),
      direct_(other.direct_),
      block_(std::move(other.block_)),
      filled_(other.filled_),
      written_(other.written_),
      size_(other.size_),
      summary_(std::move(other.summary_)) {}

OutputFile::~OutputFile() {
  if (fd_ >= 0) ::close(fd_);
}

template <typename H>
absl::Status OutputFile::Append(const void* data, size_t size, H* hasher) {
  const char* bytes = static_cast<const char*>(data);
  while (size > 0) {
    const size_t piece = std::min({size, kCopyPiece, kWriteBlock - filled_});
    char* copy = block_.get() + filled_;
    std::memcpy(copy, bytes, piece);
    if (hasher != nullptr) hasher->Update(copy, piece);
    filled_ += piece;
    size_ += piece;
    bytes += piece;
    size -= piece;
    if (filled_ == kWriteBlock) KEEL_RETURN_IF_ERROR(WriteBlock(kWriteBlock));
  }
  return absl::OkStatus();
}

absl::Status OutputFile::WriteBlock(size_t length) {
  size_t done = 0;
  while (done < length) {
    const ssize_t n =
        ::pwrite(fd_, block_.get() + done, length - done, static_cast<off_t>(written_ + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("writing", path_);
    }
    if (n == 0) {
      errno = ENOSPC;  // a write that makes no progress: the disk has no room
      return ErrnoError("writing", path_);
    }
    done += static_cast<size_t>(n);
  }
  written_ += length;
  filled_ = 0;
  return absl::OkStatus();
}

absl::Status OutputFile::Write(const void* data, size_t size) {
  return Append(data, size, &summary_);
}

absl::StatusOr<uint64_t> OutputFile::WriteChunk(const void* data, size_t size) {
  SegmentHasher chunk;
  KEEL_RETURN_IF_ERROR(Append(data, size, &chunk));
  const uint64_t checksum = chunk.Digest();
  char bytes[8];
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((checksum >> (8 * i)) & 0xff);
  summary_.Update(bytes, sizeof(bytes));
  return checksum;
}

absl::Status OutputFile::PadTo(uint64_t alignment) {
  static const char kZeros[4096] = {};
  uint64_t padding = (alignment - size_ % alignment) % alignment;
  while (padding > 0) {
    const size_t piece = std::min<uint64_t>(padding, sizeof(kZeros));
    KEEL_RETURN_IF_ERROR(Write(kZeros, piece));
    padding -= piece;
  }
  return absl::OkStatus();
}

absl::Status OutputFile::Close() {
  if (filled_ > 0) {
    // Direct I/O writes whole aligned blocks: the last one goes out padded with zeros, and
    // the file is cut back to its size.
    const size_t length =
        direct_ ? (filled_ + kDirectAlignment - 1) / kDirectAlignment * kDirectAlignment : filled_;
    std::memset(block_.get() + filled_, 0, length - filled_);
    KEEL_RETURN_IF_ERROR(WriteBlock(length));
    if (direct_ && ::ftruncate(fd_, static_cast<off_t>(size_)) != 0) {
      return ErrnoError("truncating", path_);
    }
  }
  if (::fsync(fd_) != 0) return ErrnoError("fsync of", path_);
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) return ErrnoError("closing", path_);
  return absl::OkStatus();
}

absl::Status PreadAll(int fd, const std::string& path, void* out, size_t size, uint64_t offset,
                      Hasher* hasher) {
  char* bytes = static_cast<char*>(out);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd, bytes + done, std::min(size - done, kReadBlock), offset + done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("reading", path);
    }
    if (n == 0) {
      return absl::DataLossError(absl::StrCat(path, " is truncated: wanted ", size,
                                              " bytes at offset ", offset, ", the file ends after ",
                                              done));
    }
    if (hasher != nullptr) hasher->Update(bytes + done, static_cast<size_t>(n));
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> PreadChunk(int fd, const std::string& path, void* out, size_t size,
                                    uint64_t offset) {
  const int64_t segments = static_cast<int64_t>((size + kChecksumSegment - 1) / kChecksumSegment);
  std::vector<uint64_t> digests(segments);
  std::vector<absl::Status> statuses(segments);
  // Reading from the page cache and hashing are both bound by one core's memory copy speed,
  // so segments go to one thread per core.
  const int64_t threads =
      std::min<int64_t>(segments, std::max(1u, std::thread::hardware_concurrency()));
  auto work = [&](int64_t first) {
    for (int64_t s = first; s < segments; s += threads) {
      const size_t start = static_cast<size_t>(s) * kChecksumSegment;
      const size_t length = std::min(kChecksumSegment, size - start);
      Hasher hasher;
      statuses[s] =
          PreadAll(fd, path, static_cast<char*>(out) + start, length, offset + start, &hasher);
      digests[s] = hasher.Digest();
    }
  };
  std::vector<std::thread> helpers;
  for (int64_t t = 1; t < threads; ++t) helpers.emplace_back(work, t);
  work(0);
  for (std::thread& helper : helpers) helper.join();
  for (const absl::Status& status : statuses) KEEL_RETURN_IF_ERROR(status);
  return CombineSegments(digests);
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("opening", path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    absl::Status status = ErrnoError("stat of", path);
    ::close(fd);
    return status;
  }
  std::string contents(static_cast<size_t>(st.st_size), '\0');
  absl::Status status = PreadAll(fd, path, contents.data(), contents.size(), 0);
  ::close(fd);
  KEEL_RETURN_IF_ERROR(status);
  return contents;
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents) {
  const std::string temporary = absl::StrCat(path, ".tmp");
  KEEL_ASSIGN_OR_RETURN(OutputFile file, OutputFile::Create(temporary));
  KEEL_RETURN_IF_ERROR(file.Write(contents.data(), contents.size()));
  KEEL_RETURN_IF_ERROR(file.Close());
  return RenameDurably(temporary, path);
}

absl::Status FsyncPath(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("opening", path);
  const int result = ::fsync(fd);
  absl::Status status = result == 0 ? absl::OkStatus() : ErrnoError("fsync of", path);
  ::close(fd);
  return status;
}

absl::Status RenameDurably(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    return ErrnoError(absl::StrCat("renaming ", from, " to"), to);
  }
  return FsyncPath(ParentDirectory(to));
}

absl::Status MakeDirectory(const std::string& path) {
  if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) return ErrnoError("creating", path);
  return absl::OkStatus();
}

absl::Status RemoveTree(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    return errno == ENOENT ? absl::OkStatus() : ErrnoError("stat of", path);
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

absl::StatusOr<std::vector<std::string>> ListDirectory(const std::string& path) {
  DIR* dir = ::opendir(path.c_str());
  if (dir == nullptr) return ErrnoError("listing", path);
  std::vector<std::string> names;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(dir);
  return names;
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

}  // namespace keel::checkpoint::internal
