#include "checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <unordered_set>

#include "ATen/ops/empty.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/files.h"
#include "base/quote.h"
#include "base/status.h"
#include "base/torch_status.h"
#include "base/utf8.h"
#include "checkpoint/internal/dtype.h"
#include "checkpoint/internal/files.h"
#include "nlohmann/json.hpp"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors stores little-endian bytes, which Keel copies as they are in memory");

namespace keel::checkpoint {
namespace {

// nlohmann's std::map JSON, not base::Json: its ordered map finds keys by linear search, which
// a header with many tensors would make quadratic.
using Json = nlohmann::json;

using base::Excerpt;
using base::Quote;
using base::ShapeString;

constexpr uint64_t kInt64Max = std::numeric_limits<int64_t>::max();

absl::Status Corrupt(absl::string_view message) {
  return absl::DataLossError(absl::StrCat("safetensors header: ", message));
}

std::string DtypeString(at::ScalarType dtype) {
  absl::StatusOr<std::string> name = internal::DtypeName(dtype);
  return name.ok() ? *name : c10::toString(dtype);
}

bool IsUtf8(absl::string_view text) { return !base::FirstInvalidUtf8(text).has_value(); }

// The byte size of a C-order tensor of non-negative `shape`, or nullopt if LibTorch could not
// allocate it: the product of the dims with 0 counted as 1 (the largest stride) must fit
// int64_t, and so must the byte size.
std::optional<uint64_t> ByteSize(const std::vector<int64_t>& shape, at::ScalarType dtype) {
  uint64_t bound = 1;
  uint64_t numel = 1;
  for (const int64_t dim : shape) {
    const uint64_t factor = static_cast<uint64_t>(std::max<int64_t>(dim, 1));
    if (__builtin_mul_overflow(bound, factor, &bound) || bound > kInt64Max) return std::nullopt;
    numel *= static_cast<uint64_t>(dim);  // numel <= bound
  }
  uint64_t bytes;
  if (__builtin_mul_overflow(numel, c10::elementSize(dtype), &bytes) || bytes > kInt64Max) {
    return std::nullopt;
  }
  return bytes;
}

std::string TooLarge(absl::string_view name, const std::vector<int64_t>& shape,
                     at::ScalarType dtype) {
  return absl::StrCat("tensor ", Quote(name), " has shape ", ShapeString(shape), " of ",
                      DtypeString(dtype),
                      ", too large for LibTorch (the product of the dims, 0 counted as 1, or "
                      "the byte size exceeds 2^63 - 1)");
}

// A JSON integer >= 0 ("-0" included, as serde reads it into usize).
std::optional<uint64_t> NonNegativeInteger(const Json& value) {
  if (value.is_number_unsigned()) return value.get<uint64_t>();
  if (value.is_number_integer() && value.get<int64_t>() == 0) return 0;
  return std::nullopt;
}

absl::StatusOr<SafetensorsEntry> ParseEntry(const std::string& name, const Json& value) {
  static constexpr const char* kFields[] = {"dtype", "shape", "data_offsets"};
  if (!value.is_object()) {
    return Corrupt(absl::StrCat("tensor ", Quote(name),
                                " must be an object with dtype, shape and data_offsets, got ",
                                Excerpt(value)));
  }
  for (const auto& item : value.items()) {
    if (std::find(std::begin(kFields), std::end(kFields), item.key()) == std::end(kFields)) {
      return Corrupt(absl::StrCat("tensor ", Quote(name), " has an unknown field ",
                                  Quote(item.key()), "; allowed: dtype, shape, data_offsets"));
    }
  }
  for (const char* field : kFields) {
    if (!value.contains(field)) {
      return Corrupt(absl::StrCat("tensor ", Quote(name), " has no \"", field, "\""));
    }
  }
  SafetensorsEntry entry;
  entry.name = name;

  const Json& dtype = value["dtype"];
  if (!dtype.is_string()) {
    return Corrupt(absl::StrCat("tensor ", Quote(name), " has dtype ", Excerpt(dtype),
                                ", not a string such as \"F32\""));
  }
  absl::StatusOr<at::ScalarType> parsed = internal::ParseDtype(dtype.get_ref<const std::string&>());
  if (!parsed.ok()) {
    return Corrupt(absl::StrCat("tensor ", Quote(name), ": ", parsed.status().message()));
  }
  entry.dtype = *parsed;

  const Json& shape = value["shape"];
  if (!shape.is_array()) {
    return Corrupt(absl::StrCat("tensor ", Quote(name), " has shape ", Excerpt(shape),
                                ", not an array of non-negative integers"));
  }
  for (const Json& dim : shape) {
    const std::optional<uint64_t> size = NonNegativeInteger(dim);
    if (!size.has_value()) {
      return Corrupt(absl::StrCat("tensor ", Quote(name), " has shape ", Excerpt(shape),
                                  "; dims must be non-negative integers, got ", Excerpt(dim)));
    }
    if (*size > kInt64Max) {
      return Corrupt(absl::StrCat("tensor ", Quote(name), " has shape ", Excerpt(shape),
                                  " with dim ", *size, " > 2^63 - 1, too large for LibTorch"));
    }
    entry.shape.push_back(static_cast<int64_t>(*size));
  }

  const Json& offsets = value["data_offsets"];
  std::optional<uint64_t> begin;
  std::optional<uint64_t> end;
  if (offsets.is_array() && offsets.size() == 2) {
    begin = NonNegativeInteger(offsets[0]);
    end = NonNegativeInteger(offsets[1]);
  }
  if (!begin.has_value() || !end.has_value()) {
    return Corrupt(absl::StrCat("tensor ", Quote(name), " has data_offsets ", Excerpt(offsets),
                                "; expected [BEGIN, END], two non-negative integers"));
  }
  if (*begin > *end) {
    return Corrupt(absl::StrCat("tensor ", Quote(name), " has data_offsets [", *begin, ", ", *end,
                                "] with END < BEGIN"));
  }
  entry.begin = *begin;
  entry.end = *end;

  const std::optional<uint64_t> bytes = ByteSize(entry.shape, entry.dtype);
  if (!bytes.has_value()) return Corrupt(TooLarge(name, entry.shape, entry.dtype));
  if (entry.end - entry.begin != *bytes) {
    return Corrupt(absl::StrCat("tensor ", Quote(name), " has data_offsets [", entry.begin, ", ",
                                entry.end, "] but shape ", ShapeString(entry.shape), " of ",
                                DtypeString(entry.dtype), " needs ", *bytes, " bytes"));
  }
  return entry;
}

absl::Status ParseMetadata(const Json& value, std::map<std::string, std::string>& metadata) {
  if (!value.is_object()) {
    return Corrupt(absl::StrCat("__metadata__ must be an object of strings, got ", Excerpt(value)));
  }
  for (const auto& item : value.items()) {
    if (!item.value().is_string()) {
      return Corrupt(absl::StrCat("__metadata__ value of ", Quote(item.key()),
                                  " must be a string, got ", Excerpt(item.value())));
    }
    metadata[item.key()] = item.value().get<std::string>();
  }
  return absl::OkStatus();
}

// Receives the header's JSON events without exceptions. The top-level object is never built:
// each of its values (a tensor entry or "__metadata__") is built on its own, then checked and
// converted when it closes, so memory stays proportional to the entries. A duplicate key at
// any level, or nesting deeper than the format's {"name": {"shape": [...]}}, stops the parse
// (nlohmann's DOM would keep the last of duplicate keys).
class HeaderParser final : public nlohmann::json_sax<Json> {
 public:
  bool null() override { return Value(nullptr); }
  bool boolean(bool value) override { return Value(value); }
  bool number_integer(number_integer_t value) override { return Value(value); }
  bool number_unsigned(number_unsigned_t value) override { return Value(value); }
  bool number_float(number_float_t value, const string_t& /*text*/) override {
    return Value(value);
  }
  bool string(string_t& value) override { return Value(std::move(value)); }
  bool binary(binary_t& /*value*/) override { return Fail("binary values are not JSON"); }
  bool start_object(std::size_t /*size*/) override { return Open(Json::object()); }
  bool start_array(std::size_t /*size*/) override { return Open(Json::array()); }
  bool end_object() override { return Close(); }
  bool end_array() override { return Close(); }

  bool key(string_t& key) override {
    if (depth_ == 1) {
      if (!names_.insert(key).second) return Fail(absl::StrCat("duplicate key ", Quote(key)));
      name_ = key;
      return true;
    }
    Json& object = *stack_.back();
    if (object.contains(key)) {
      return Fail(absl::StrCat(Quote(name_), " has a duplicate key ", Quote(key)));
    }
    pending_ = &object[key];
    return true;
  }

  bool parse_error(std::size_t /*position*/, const std::string& /*last_token*/,
                   const Json::exception& error) override {
    return Fail(absl::StrCat("not valid JSON: ", error.what()));
  }

  // The first error, or OK.
  const absl::Status& status() const { return status_; }
  SafetensorsHeader& header() { return header_; }

 private:
  bool Fail(absl::string_view message) {
    if (status_.ok()) status_ = Corrupt(message);
    return false;
  }

  // Adds `value` to the open container at depth >= 2 and returns where it now lives.
  Json* Place(Json value) {
    Json& parent = *stack_.back();
    if (parent.is_array()) {
      parent.push_back(std::move(value));
      return &parent.back();
    }
    *pending_ = std::move(value);
    return pending_;
  }

  bool Value(Json value) {
    if (depth_ == 0) return Fail("the header is not a JSON object");
    if (depth_ == 1) return Finish(std::move(value));
    Place(std::move(value));
    return true;
  }

  bool Open(Json container) {
    if (depth_ == 0) {
      if (!container.is_object()) return Fail("the header is not a JSON object");
    } else if (depth_ == 1) {
      entry_ = std::move(container);
      stack_.assign(1, &entry_);
    } else if (depth_ == 2) {
      stack_.push_back(Place(std::move(container)));
    } else {
      return Fail(absl::StrCat(Quote(name_), " nests arrays or objects deeper than the format's ",
                               "{\"name\": {\"shape\": [...]}}"));
    }
    ++depth_;
    return true;
  }

  bool Close() {
    --depth_;
    if (depth_ == 0) return true;
    stack_.pop_back();
    if (depth_ == 1) return Finish(std::move(entry_));
    return true;
  }

  // Checks and converts the value of top-level key name_.
  bool Finish(Json value) {
    if (name_ == "__metadata__") {
      status_ = ParseMetadata(value, header_.metadata);
      return status_.ok();
    }
    absl::StatusOr<SafetensorsEntry> entry = ParseEntry(name_, value);
    if (!entry.ok()) {
      status_ = entry.status();
      return false;
    }
    header_.entries.push_back(*std::move(entry));
    return true;
  }

  absl::Status status_;
  SafetensorsHeader header_;
  int depth_ = 0;                          // containers open
  std::unordered_set<std::string> names_;  // top-level keys seen
  std::string name_;                       // the current top-level key
  Json entry_;                             // its value, while it is being built
  std::vector<Json*> stack_;               // open containers within entry_
  Json* pending_ = nullptr;                // the slot of the last key
};

// ---- I/O ------------------------------------------------------------------------------

// A file open for reading and its size.
struct InputFile {
  base::UniqueFd fd;
  uint64_t size = 0;
};

absl::StatusOr<InputFile> OpenInput(const std::string& path) {
  InputFile file;
  KEEL_ASSIGN_OR_RETURN(file.fd, base::OpenFile(path, O_RDONLY));
  struct stat info;
  if (::fstat(file.fd.get(), &info) != 0) return base::ErrnoError("examining", path);
  file.size = static_cast<uint64_t>(info.st_size);
  return file;
}

absl::StatusOr<SafetensorsHeader> ReadHeader(int fd, const std::string& path, uint64_t file_size) {
  // Reads 8 bytes, then the N they announce if N is plausible; the parser reports the rest.
  std::string prefix(std::min<uint64_t>(file_size, 8), '\0');
  KEEL_RETURN_IF_ERROR(base::PreadAll(fd, path, prefix.data(), prefix.size(), 0));
  if (prefix.size() == 8) {
    uint64_t n;
    std::memcpy(&n, prefix.data(), 8);
    if (n <= kMaxSafetensorsHeaderSize && n <= file_size - 8) {
      prefix.resize(8 + n);
      KEEL_RETURN_IF_ERROR(base::PreadAll(fd, path, prefix.data() + 8, n, 8));
    }
  }
  absl::StatusOr<SafetensorsHeader> header = ParseSafetensorsHeader(prefix, file_size);
  KEEL_RETURN_IF_ERROR(base::Annotate(header.status(), path));
  return header;
}

absl::Status WriteContents(internal::OutputFile& file, absl::string_view header,
                           const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                           const std::vector<SafetensorsEntry>& entries) {
  KEEL_RETURN_IF_ERROR(file.Write(header.data(), header.size()));
  for (size_t i = 0; i < tensors.size(); ++i) {
    const std::string& name = tensors[i].first;
    const at::Tensor& tensor = tensors[i].second;  // not a binding: lambdas capture it
    at::Tensor cpu;
    KEEL_RETURN_IF_ERROR(base::CallTorch(
        absl::StatusCode::kInternal,
        absl::StrCat("copying tensor ", Quote(name), " to contiguous CPU memory"), [&] {
          const at::Tensor dense = tensor.layout() == at::kStrided ? tensor : tensor.to_dense();
          cpu = dense.cpu().resolve_conj().resolve_neg().contiguous();
        }));
    const uint64_t size = entries[i].end - entries[i].begin;
    if (cpu.nbytes() != size) {
      return absl::InternalError(absl::StrCat("tensor ", Quote(name), " has ", cpu.nbytes(),
                                              " bytes on the CPU, not ", size));
    }
    if (size > 0) KEEL_RETURN_IF_ERROR(file.Write(cpu.data_ptr(), size));
  }
  return file.Close();
}

}  // namespace

absl::StatusOr<std::string> EncodeSafetensorsHeader(
    std::vector<SafetensorsEntry>& entries, const std::map<std::string, std::string>& metadata) {
  const auto json_string = [](const std::string& text) {
    return Json(text).dump(-1, ' ', /*ensure_ascii=*/false, Json::error_handler_t::replace);
  };
  std::string json = "{";
  if (!metadata.empty()) {
    json += "\"__metadata__\":{";
    for (const auto& [key, value] : metadata) {
      if (!IsUtf8(key) || !IsUtf8(value)) {
        return absl::InvalidArgumentError(absl::StrCat("safetensors __metadata__ key ", Quote(key),
                                                       " or its value is not valid UTF-8"));
      }
      absl::StrAppend(&json, json.back() == '{' ? "" : ",", json_string(key), ":",
                      json_string(value));
    }
    json += "}";
  }
  std::set<absl::string_view> names;
  std::vector<std::pair<uint64_t, uint64_t>> offsets;
  uint64_t offset = 0;
  for (const SafetensorsEntry& entry : entries) {
    const std::string& name = entry.name;
    if (name.empty() || name == "__metadata__" || !IsUtf8(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors tensor name ", Quote(name),
                       " is not allowed: names must be non-empty UTF-8 other than __metadata__"));
    }
    if (!names.insert(name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("duplicate safetensors tensor name ", Quote(name)));
    }
    absl::StatusOr<std::string> dtype = internal::DtypeName(entry.dtype);
    if (!dtype.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", Quote(name), ": ", dtype.status().message()));
    }
    for (const int64_t dim : entry.shape) {
      if (dim < 0) {
        return absl::InvalidArgumentError(absl::StrCat("tensor ", Quote(name), " has shape ",
                                                       ShapeString(entry.shape),
                                                       "; dims must be >= 0"));
      }
    }
    const std::optional<uint64_t> bytes = ByteSize(entry.shape, entry.dtype);
    if (!bytes.has_value())
      return absl::InvalidArgumentError(TooLarge(name, entry.shape, entry.dtype));
    const uint64_t end = offset + *bytes;  // both <= 2^63 - 1: no overflow
    if (end > kInt64Max) {
      return absl::InvalidArgumentError(
          absl::StrCat("the tensors up to ", Quote(name), " total ", end,
                       " bytes, more than a file can hold (2^63 - 1)"));
    }
    absl::StrAppend(&json, json.size() == 1 ? "" : ",", json_string(name), ":{\"dtype\":\"", *dtype,
                    "\",\"shape\":[", absl::StrJoin(entry.shape, ","), "],\"data_offsets\":[",
                    offset, ",", end, "]}");
    offsets.emplace_back(offset, end);
    offset = end;
  }
  json += "}";
  json.append((8 - json.size() % 8) % 8, ' ');
  if (json.size() > kMaxSafetensorsHeaderSize) {
    return absl::InvalidArgumentError(absl::StrCat("the safetensors header would be ", json.size(),
                                                   " bytes, more than readers accept (",
                                                   kMaxSafetensorsHeaderSize, ")"));
  }
  for (size_t i = 0; i < entries.size(); ++i) {
    std::tie(entries[i].begin, entries[i].end) = offsets[i];
  }
  const uint64_t n = json.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  return out + json;
}

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view bytes,
                                                         uint64_t file_size) {
  if (file_size < 8) {
    return Corrupt(
        absl::StrCat("the file has ", file_size, " bytes, fewer than the 8 of the header length"));
  }
  if (bytes.size() < 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("ParseSafetensorsHeader needs the first 8 bytes, got ", bytes.size()));
  }
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  if (n > kMaxSafetensorsHeaderSize) {
    return Corrupt(absl::StrCat("header length ", n, " exceeds the limit of ",
                                kMaxSafetensorsHeaderSize, " bytes"));
  }
  if (n > file_size - 8) {
    return Corrupt(absl::StrCat("header length ", n, " runs past the end of the file (8 + ", n,
                                " > ", file_size, " bytes)"));
  }
  if (bytes.size() - 8 < n) {
    return absl::InvalidArgumentError(absl::StrCat("ParseSafetensorsHeader needs the first ", 8 + n,
                                                   " bytes, got ", bytes.size()));
  }
  const absl::string_view text = bytes.substr(8, n);
  if (text.empty() || text[0] != '{') {
    return Corrupt(absl::StrCat("the header must start with '{', got ",
                                text.empty() ? std::string("an empty header")
                                             : absl::StrCat("byte 0x", absl::Hex(text[0] & 0xff))));
  }
  // nlohmann's lexer takes a NUL byte for the end of the input; JSON text never holds one.
  if (const size_t nul = text.find('\0'); nul != absl::string_view::npos) {
    return Corrupt(absl::StrCat("not valid JSON: a NUL byte at header offset ", nul));
  }
  HeaderParser parser;
  const bool parsed = Json::sax_parse(text.data(), text.data() + text.size(), &parser);
  KEEL_RETURN_IF_ERROR(parser.status());
  if (!parsed) return Corrupt("not valid JSON");
  SafetensorsHeader header = std::move(parser.header());
  header.data_start = 8 + n;

  std::vector<SafetensorsEntry>& entries = header.entries;
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  uint64_t covered = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const SafetensorsEntry& entry = entries[i];
    if (entry.begin != covered) {
      const std::string where = absl::StrCat("tensor ", Quote(entry.name), " has data_offsets [",
                                             entry.begin, ", ", entry.end, "]");
      if (i == 0) return Corrupt(absl::StrCat(where, "; the first tensor must begin at 0"));
      return Corrupt(
          absl::StrCat(where, entry.begin > covered ? ", leaving a hole after" : ", overlapping",
                       " tensor ", Quote(entries[i - 1].name), ", which ends at ", covered));
    }
    covered = entry.end;
  }
  const uint64_t buffer = file_size - header.data_start;
  if (covered != buffer) {
    return Corrupt(absl::StrCat("the tensors cover ", covered, " bytes but the data buffer has ",
                                buffer, " (", file_size, " bytes in the file, data from byte ",
                                header.data_start, ")"));
  }
  return header;
}

absl::StatusOr<SafetensorsHeader> ReadSafetensorsHeader(const std::string& path) {
  KEEL_ASSIGN_OR_RETURN(InputFile file, OpenInput(path));
  return ReadHeader(file.fd.get(), path, file.size);
}

absl::Status WriteSafetensorsFile(const std::string& path,
                                  const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                  const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsEntry> entries;
  entries.reserve(tensors.size());
  for (const auto& [name, tensor] : tensors) {
    if (!tensor.defined()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", Quote(name), " is undefined"));
    }
    SafetensorsEntry entry;
    entry.name = name;
    entry.dtype = tensor.scalar_type();
    entry.shape = tensor.sizes().vec();
    entries.push_back(std::move(entry));
  }
  KEEL_ASSIGN_OR_RETURN(const std::string header, EncodeSafetensorsHeader(entries, metadata));

  const std::string temporary = absl::StrCat(path, ".tmp");
  KEEL_ASSIGN_OR_RETURN(internal::OutputFile file, internal::OutputFile::Create(temporary));
  absl::Status status = WriteContents(file, header, tensors, entries);
  if (status.ok()) status = base::RenameDurably(temporary, path);
  if (!status.ok()) base::RemoveTree(temporary).IgnoreError();
  return status;
}

namespace {

absl::Status CheckBoolBytes(const std::string& path, const SafetensorsEntry& entry,
                            const at::Tensor& tensor) {
  if (entry.dtype != at::kBool) return absl::OkStatus();
  const auto* bytes = static_cast<const unsigned char*>(tensor.data_ptr());
  for (int64_t i = 0; i < tensor.numel(); ++i) {
    if (bytes[i] > 1) {
      return absl::DataLossError(absl::StrCat(path, ": tensor ", Quote(entry.name),
                                              " (BOOL) has byte ", static_cast<int>(bytes[i]),
                                              " at element ", i, "; BOOL bytes must be 0 or 1"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<at::Tensor> Allocate(const std::string& path, const SafetensorsEntry& entry,
                                    const std::vector<int64_t>& shape) {
  at::Tensor tensor;
  KEEL_RETURN_IF_ERROR(
      base::CallTorch(absl::StatusCode::kResourceExhausted,
                      absl::StrCat(path, ": allocating tensor ", Quote(entry.name)),
                      [&] { tensor = at::empty(shape, at::TensorOptions().dtype(entry.dtype)); }));
  return tensor;
}

}  // namespace

absl::StatusOr<at::Tensor> ReadSafetensorsBlock(const std::string& path,
                                                const SafetensorsHeader& header,
                                                const SafetensorsEntry& entry,
                                                const std::vector<int64_t>& offsets,
                                                const std::vector<int64_t>& shape) {
  const size_t rank = entry.shape.size();
  bool inside = offsets.size() == rank && shape.size() == rank;
  for (size_t d = 0; inside && d < rank; ++d) {
    inside = offsets[d] >= 0 && shape[d] >= 0 && offsets[d] + shape[d] <= entry.shape[d];
  }
  if (!inside) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": the block at [", absl::StrJoin(offsets, ", "), "] of shape [",
                     absl::StrJoin(shape, ", "), "] is not inside tensor ", Quote(entry.name),
                     " of shape [", absl::StrJoin(entry.shape, ", "), "]"));
  }
  KEEL_ASSIGN_OR_RETURN(InputFile file, OpenInput(path));
  const uint64_t expected_size =
      header.entries.empty() ? header.data_start : header.data_start + header.entries.back().end;
  if (file.size != expected_size) {
    return absl::DataLossError(absl::StrCat(path, " is ", file.size,
                                            " bytes; the header read before makes it ",
                                            expected_size, ": the file changed"));
  }
  KEEL_ASSIGN_OR_RETURN(at::Tensor block, Allocate(path, entry, shape));
  if (block.numel() == 0) return block;
  // Dimensions after `split` are whole in the block: each index of the dimensions before it
  // is one run of contiguous bytes.
  size_t split = rank == 0 ? 0 : rank - 1;
  while (split > 0 && shape[split] == entry.shape[split]) --split;
  std::vector<int64_t> strides(rank, 1);  // the file's, in elements
  for (size_t d = rank; d-- > 1;) strides[d - 1] = strides[d] * entry.shape[d];
  const int64_t element = static_cast<int64_t>(c10::elementSize(entry.dtype));
  int64_t run = 1;
  for (size_t d = split; d < rank; ++d) run *= shape[d];
  const int64_t runs = block.numel() / run;
  auto* destination = static_cast<char*>(block.data_ptr());
  std::vector<int64_t> index(split, 0);  // within the block, dimensions before `split`
  for (int64_t r = 0; r < runs; ++r) {
    int64_t first = rank == 0 ? 0 : offsets[split] * strides[split];
    for (size_t d = 0; d < split; ++d) first += (offsets[d] + index[d]) * strides[d];
    KEEL_RETURN_IF_ERROR(base::PreadAll(file.fd.get(), path, destination + r * run * element,
                                        run * element,
                                        header.data_start + entry.begin + first * element));
    for (size_t d = split; d-- > 0;) {  // the next index, last dimension fastest
      if (++index[d] < shape[d]) break;
      index[d] = 0;
    }
  }
  KEEL_RETURN_IF_ERROR(CheckBoolBytes(path, entry, block));
  return block;
}

absl::StatusOr<std::vector<std::pair<std::string, at::Tensor>>> ReadSafetensorsFile(
    const std::string& path) {
  KEEL_ASSIGN_OR_RETURN(InputFile file, OpenInput(path));
  const int fd = file.fd.get();
  KEEL_ASSIGN_OR_RETURN(SafetensorsHeader header, ReadHeader(fd, path, file.size));
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  tensors.reserve(header.entries.size());
  for (const SafetensorsEntry& entry : header.entries) {
    KEEL_ASSIGN_OR_RETURN(at::Tensor tensor, Allocate(path, entry, entry.shape));
    const uint64_t size = entry.end - entry.begin;
    if (size > 0) {
      KEEL_RETURN_IF_ERROR(
          base::PreadAll(fd, path, tensor.data_ptr(), size, header.data_start + entry.begin));
    }
    KEEL_RETURN_IF_ERROR(CheckBoolBytes(path, entry, tensor));
    tensors.emplace_back(entry.name, std::move(tensor));
  }
  return tensors;
}

}  // namespace keel::checkpoint
