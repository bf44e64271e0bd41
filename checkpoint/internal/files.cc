#include "checkpoint/internal/files.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
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
  KEEL_ASSIGN_OR_RETURN(base::UniqueFd fd, base::CreateFileExclusively(path));
  // Direct I/O where the filesystem has it (EINVAL where not).
  const bool direct = mode == Mode::kDirectIfSupported &&
                      ::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) | O_DIRECT) == 0;
  void* block = nullptr;
  if (::posix_memalign(&block, kDirectAlignment, kWriteBlock) != 0) {
    return absl::ResourceExhaustedError(absl::StrCat("no memory for the write buffer of ", path));
  }
  return OutputFile(path, std::move(fd), direct,
                    std::unique_ptr<char[], FreeBlock>(static_cast<char*>(block)));
}

OutputFile::OutputFile(std::string path, base::UniqueFd fd, bool direct,
                       std::unique_ptr<char[], FreeBlock> block)
    : path_(std::move(path)), fd_(std::move(fd)), direct_(direct), block_(std::move(block)) {}

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
  // The file position stays at written_: every block goes out at the end.
  KEEL_RETURN_IF_ERROR(base::WriteAll(fd_.get(), absl::string_view(block_.get(), length), path_));
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
    if (direct_ && ::ftruncate(fd_.get(), static_cast<off_t>(size_)) != 0) {
      return base::ErrnoError("truncating", path_);
    }
  }
  if (::fsync(fd_.get()) != 0) return base::ErrnoError("fsync of", path_);
  return fd_.Close(path_);
}

absl::Status PreadHashed(int fd, const std::string& path, void* out, size_t size, uint64_t offset,
                         Hasher& hasher) {
  char* bytes = static_cast<char*>(out);
  for (size_t done = 0; done < size; done += kReadBlock) {
    const size_t length = std::min(size - done, kReadBlock);
    KEEL_RETURN_IF_ERROR(base::PreadAll(fd, path, bytes + done, length, offset + done));
    hasher.Update(bytes + done, length);
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
          PreadHashed(fd, path, static_cast<char*>(out) + start, length, offset + start, hasher);
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

}  // namespace keel::checkpoint::internal
