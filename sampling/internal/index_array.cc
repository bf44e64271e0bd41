#include "sampling/internal/index_array.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/files.h"
#include "base/status.h"
#include "sampling/internal/mapped_file.h"

namespace keel::sampling::internal {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicSize = 6;

int64_t ItemSize(IndexDtype dtype) {
  switch (dtype) {
    case IndexDtype::kInt16:
      return 2;
    case IndexDtype::kInt32:
    case IndexDtype::kUint32:
      return 4;
    case IndexDtype::kInt64:
      return 8;
  }
  return 8;
}

int64_t Elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// A writable shared mapping of a file, unmapped on destruction.
struct SharedMapping {
  void* address = nullptr;
  size_t size = 0;
  ~SharedMapping() {
    if (address != nullptr) ::munmap(address, size);
  }
};

// The value of `key` in the header dict ("'descr': '<i4', ..."), up to the next ", '" or "}".
absl::StatusOr<std::string> HeaderValue(absl::string_view header, absl::string_view key,
                                        const std::string& path) {
  const std::string quoted = absl::StrCat("'", key, "':");
  const size_t at = header.find(quoted);
  if (at == absl::string_view::npos) {
    return absl::DataLossError(absl::StrCat(path, ": the .npy header has no ", quoted));
  }
  absl::string_view rest = absl::StripLeadingAsciiWhitespace(header.substr(at + quoted.size()));
  const size_t end = absl::StartsWith(rest, "(") ? rest.find(')') : rest.find_first_of(",}");
  if (end == absl::string_view::npos) {
    return absl::DataLossError(absl::StrCat(path, ": the .npy header's ", quoted, " never ends"));
  }
  return std::string(rest.substr(0, absl::StartsWith(rest, "(") ? end + 1 : end));
}

absl::StatusOr<std::vector<int64_t>> ParseShape(absl::string_view text, const std::string& path) {
  std::vector<int64_t> shape;
  if (!absl::ConsumePrefix(&text, "(") || !absl::ConsumeSuffix(&text, ")")) {
    return absl::DataLossError(absl::StrCat(path, ": bad .npy shape ", text));
  }
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    int64_t d;
    if (!absl::SimpleAtoi(part, &d) || d < 0) {
      return absl::DataLossError(absl::StrCat(path, ": bad .npy shape (", text, ")"));
    }
    shape.push_back(d);
  }
  if (shape.empty() || shape.size() > 2) {
    return absl::DataLossError(
        absl::StrCat(path, ": a .npy of ", shape.size(), " dimensions is not an index array"));
  }
  return shape;
}

}  // namespace

absl::string_view NpyDescr(IndexDtype dtype) {
  switch (dtype) {
    case IndexDtype::kInt16:
      return "<i2";
    case IndexDtype::kInt32:
      return "<i4";
    case IndexDtype::kUint32:
      return "<u4";
    case IndexDtype::kInt64:
      return "<i8";
  }
  return "";
}

std::string NpyHeader(IndexDtype dtype, const std::vector<int64_t>& shape) {
  const std::string shape_repr = shape.size() == 1
                                     ? absl::StrCat("(", shape[0], ",)")
                                     : absl::StrCat("(", absl::StrJoin(shape, ", "), ")");
  std::string dict = absl::StrCat("{'descr': '", NpyDescr(dtype),
                                  "', 'fortran_order': False, 'shape': ", shape_repr, ", }");
  // numpy leaves room for the first dimension to grow to 21 digits.
  dict.append(21 - absl::StrCat(shape[0]).size(), ' ');
  const size_t unpadded = kMagicSize + 2 + 2 + dict.size() + 1;
  dict.append(64 - unpadded % 64, ' ');
  dict += '\n';
  std::string header(kMagic, kMagicSize);
  header += '\x01';
  header += '\x00';
  header += static_cast<char>(dict.size() & 0xff);
  header += static_cast<char>(dict.size() >> 8);
  return header + dict;
}

IndexArray IndexArray::InMemory(IndexDtype dtype, std::vector<int64_t> shape) {
  const size_t bytes = static_cast<size_t>(Elements(shape) * ItemSize(dtype));
  std::shared_ptr<uint8_t> memory(new uint8_t[bytes > 0 ? bytes : 1](),
                                  std::default_delete<uint8_t[]>());
  uint8_t* data = memory.get();
  return IndexArray(dtype, std::move(shape), std::move(memory), data, "");
}

absl::StatusOr<IndexArray> IndexArray::CreateNpy(const std::string& path, IndexDtype dtype,
                                                 std::vector<int64_t> shape) {
  const std::string header = NpyHeader(dtype, shape);
  const size_t size = header.size() + static_cast<size_t>(Elements(shape) * ItemSize(dtype));
  KEEL_ASSIGN_OR_RETURN(base::UniqueFd fd, base::OpenFile(path, O_RDWR | O_CREAT | O_TRUNC, 0644));
  if (::ftruncate(fd.get(), static_cast<off_t>(size)) != 0) {
    return base::ErrnoError("sizing", path);
  }
  auto mapping = std::make_shared<SharedMapping>();
  mapping->address = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (mapping->address == MAP_FAILED) {
    mapping->address = nullptr;
    return base::ErrnoError("mapping", path);
  }
  mapping->size = size;
  auto* bytes = static_cast<uint8_t*>(mapping->address);
  std::memcpy(bytes, header.data(), header.size());
  KEEL_RETURN_IF_ERROR(fd.Close(path));
  return IndexArray(dtype, std::move(shape), std::move(mapping), bytes + header.size(), path);
}

absl::StatusOr<IndexArray> IndexArray::OpenNpy(const std::string& path) {
  KEEL_ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> file, MappedFile::Open(path));
  absl::string_view bytes(reinterpret_cast<const char*>(file->bytes().data()),
                          file->bytes().size());
  const auto fail = [&](absl::string_view what) {
    return absl::DataLossError(absl::StrCat(path, ": not an index array saved by numpy: ", what));
  };
  if (bytes.size() < 10 || bytes.substr(0, kMagicSize) != absl::string_view(kMagic, kMagicSize)) {
    return fail("no .npy magic");
  }
  const int major = static_cast<uint8_t>(bytes[6]);
  const size_t length_size = major == 1 ? 2 : 4;
  if (major < 1 || major > 3 || bytes.size() < 8 + length_size) return fail("unknown version");
  size_t header_size = 0;
  for (size_t i = 0; i < length_size; ++i) {
    header_size |= size_t{static_cast<uint8_t>(bytes[8 + i])} << (8 * i);
  }
  const size_t data_offset = 8 + length_size + header_size;
  if (data_offset > bytes.size()) return fail("truncated header");
  const absl::string_view header = bytes.substr(8 + length_size, header_size);
  KEEL_ASSIGN_OR_RETURN(std::string descr, HeaderValue(header, "descr", path));
  KEEL_ASSIGN_OR_RETURN(std::string fortran, HeaderValue(header, "fortran_order", path));
  KEEL_ASSIGN_OR_RETURN(std::string shape_text, HeaderValue(header, "shape", path));
  std::optional<IndexDtype> found;
  for (IndexDtype d :
       {IndexDtype::kInt16, IndexDtype::kInt32, IndexDtype::kUint32, IndexDtype::kInt64}) {
    if (descr == absl::StrCat("'", NpyDescr(d), "'")) found = d;
  }
  if (!found.has_value()) return fail(absl::StrCat("dtype ", descr));
  if (fortran != "False") return fail("Fortran order");
  KEEL_ASSIGN_OR_RETURN(std::vector<int64_t> shape, ParseShape(shape_text, path));
  const size_t data_size = static_cast<size_t>(Elements(shape) * ItemSize(*found));
  if (bytes.size() - data_offset != data_size) {
    return fail(absl::StrCat(bytes.size() - data_offset, " data bytes for shape ", shape_text,
                             " of ", descr));
  }
  uint8_t* data = file->mutable_data() + data_offset;
  return IndexArray(*found, std::move(shape), std::const_pointer_cast<MappedFile>(file), data, "");
}

int64_t IndexArray::size() const { return Elements(shape_); }

int64_t IndexArray::Get(int64_t i) const {
  switch (dtype_) {
    case IndexDtype::kInt16:
      return data<int16_t>()[i];
    case IndexDtype::kInt32:
      return data<int32_t>()[i];
    case IndexDtype::kUint32:
      return data<uint32_t>()[i];
    case IndexDtype::kInt64:
      return data<int64_t>()[i];
  }
  return 0;
}

absl::Status IndexArray::Sync() const {
  if (path_.empty()) return absl::OkStatus();
  const auto* mapping = static_cast<const SharedMapping*>(storage_.get());
  if (::msync(mapping->address, mapping->size, MS_SYNC) != 0) {
    return base::ErrnoError("flushing", path_);
  }
  return absl::OkStatus();
}

}  // namespace keel::sampling::internal
