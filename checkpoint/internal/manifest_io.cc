#include "checkpoint/internal/manifest_io.h"

#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "checkpoint/internal/dtype.h"
#include "checkpoint/internal/files.h"

namespace keel::checkpoint::internal {
namespace {

constexpr char kMagic[8] = {'K', 'E', 'E', 'L', 'M', 'F', 'S', 'T'};
constexpr size_t kHeaderSize = 24;

void PutU64(std::string& out, uint64_t value) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

uint64_t GetU64(const char* in) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | static_cast<uint8_t>(in[i]);
  return value;
}

std::string Shape(const google::protobuf::RepeatedField<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Chunk geometry, sizes and file ranges of one tensor.
absl::Status CheckTensor(const Manifest& manifest, const TensorEntry& tensor,
                         const std::string& path) {
  const std::string where = absl::StrCat(path, ": tensor \"", tensor.name(), "\"");
  auto dtype = ParseDtype(tensor.dtype());
  if (!dtype.ok()) return absl::DataLossError(absl::StrCat(where, ": ", dtype.status().message()));
  // Sizes stay below 2^62 bytes, so no sum or product below overflows.
  const int64_t item = static_cast<int64_t>(c10::elementSize(*dtype));
  int64_t volume = 1;
  for (int64_t dim : tensor.shape()) {
    if (dim < 0 || (dim > 0 && volume > ((int64_t{1} << 62) / item) / dim)) {
      return absl::DataLossError(absl::StrCat(where, " has shape ", Shape(tensor.shape())));
    }
    volume *= dim;
  }
  int64_t covered = 0;
  for (const Chunk& chunk : tensor.chunks()) {
    if (chunk.offsets_size() != tensor.shape_size() ||
        chunk.lengths_size() != tensor.shape_size()) {
      return absl::DataLossError(absl::StrCat(where, ": a chunk's offsets ", Shape(chunk.offsets()),
                                              " or lengths ", Shape(chunk.lengths()),
                                              " do not match shape ", Shape(tensor.shape())));
    }
    int64_t chunk_volume = 1;
    for (int d = 0; d < tensor.shape_size(); ++d) {
      if (chunk.offsets(d) < 0 || chunk.lengths(d) < 0 || chunk.lengths(d) > tensor.shape(d) ||
          chunk.offsets(d) > tensor.shape(d) - chunk.lengths(d)) {
        return absl::DataLossError(
            absl::StrCat(where, ": chunk at offsets ", Shape(chunk.offsets()), " with lengths ",
                         Shape(chunk.lengths()), " lies outside shape ", Shape(tensor.shape())));
      }
      chunk_volume *= chunk.lengths(d);
    }
    if (static_cast<uint64_t>(chunk_volume * item) != chunk.byte_length()) {
      return absl::DataLossError(absl::StrCat(
          where, ": chunk at offsets ", Shape(chunk.offsets()), " has ", chunk.byte_length(),
          " bytes, its lengths ", Shape(chunk.lengths()), " need ", chunk_volume * item));
    }
    if (chunk.file() >= static_cast<uint32_t>(manifest.files_size())) {
      return absl::DataLossError(
          absl::StrCat(where, ": chunk names file #", chunk.file(), " of ", manifest.files_size()));
    }
    const FileEntry& file = manifest.files(chunk.file());
    if (chunk.byte_offset() > file.size() ||
        chunk.byte_length() > file.size() - chunk.byte_offset()) {
      return absl::DataLossError(absl::StrCat(where, ": chunk bytes [", chunk.byte_offset(), ", ",
                                              chunk.byte_offset() + chunk.byte_length(),
                                              ") lie outside ", file.name(), " (", file.size(),
                                              " bytes)"));
    }
    covered += chunk_volume;
    if (covered > volume) break;
  }
  if (covered != volume) {
    return absl::DataLossError(
        absl::StrCat(where, ": its chunks hold ", covered, " of ", volume, " elements"));
  }
  return absl::OkStatus();
}

// Where an object's values are: once, or one entry per rank of world_size in rank order, only
// in a manifest whose version holds them.
absl::Status CheckObject(const Manifest& manifest, const ObjectEntry& object,
                         const std::string& path) {
  if (object.rank_values().empty()) return absl::OkStatus();
  const std::string where = absl::StrCat(path, ": object \"", object.name(), "\"");
  if (manifest.format_version() < kPerRankValuesVersion) {
    return absl::DataLossError(absl::StrCat(where, " has values per rank, which format version ",
                                            manifest.format_version(), " does not hold"));
  }
  if (object.has_value()) {
    return absl::DataLossError(absl::StrCat(where, " has values both once and per rank"));
  }
  if (object.rank_values_size() != manifest.world_size()) {
    return absl::DataLossError(absl::StrCat(where, " has the values of ", object.rank_values_size(),
                                            " ranks, the world size is ", manifest.world_size()));
  }
  for (int r = 0; r < object.rank_values_size(); ++r) {
    if (object.rank_values(r).rank() != r) {
      return absl::DataLossError(absl::StrCat(where, ": entry ", r,
                                              " of its per-rank values is rank ",
                                              object.rank_values(r).rank(), ", not ", r));
    }
  }
  return absl::OkStatus();
}

}  // namespace

uint32_t LowestFormatVersion(const Manifest& manifest) {
  for (const ObjectEntry& object : manifest.objects()) {
    if (!object.rank_values().empty()) return kPerRankValuesVersion;
  }
  return 1;
}

std::string EncodeManifest(const Manifest& manifest) {
  std::string body;
  manifest.SerializeToString(&body);
  std::string bytes(kMagic, sizeof(kMagic));
  PutU64(bytes, body.size());
  PutU64(bytes, Xxh3(body.data(), body.size()));
  return bytes + body;
}

absl::StatusOr<Manifest> DecodeManifest(absl::string_view bytes, const std::string& path) {
  if (bytes.size() < kHeaderSize || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return absl::DataLossError(absl::StrCat(path, " is not a Keel manifest (", bytes.size(),
                                            " bytes, no KEELMFST magic)"));
  }
  const uint64_t length = GetU64(bytes.data() + 8);
  const uint64_t checksum = GetU64(bytes.data() + 16);
  if (length != bytes.size() - kHeaderSize) {
    return absl::DataLossError(absl::StrCat(path, " is truncated or padded: its header says ",
                                            length, " body bytes, the file has ",
                                            bytes.size() - kHeaderSize));
  }
  const absl::string_view body = bytes.substr(kHeaderSize);
  if (const uint64_t actual = Xxh3(body.data(), body.size()); actual != checksum) {
    return absl::DataLossError(
        absl::StrCat(path, " fails its checksum (xxh3 ", actual, ", expected ", checksum, ")"));
  }
  Manifest manifest;
  if (!manifest.ParseFromArray(body.data(), static_cast<int>(body.size()))) {
    return absl::DataLossError(absl::StrCat(path, ": the manifest message does not parse"));
  }
  if (manifest.format_version() > kFormatVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " has format version ", manifest.format_version(), ", written by Keel ",
                     manifest.keel_version(), "; this Keel (", kKeelVersion,
                     ") reads versions up to ", kFormatVersion));
  }
  if (manifest.format_version() == 0) {
    return absl::DataLossError(absl::StrCat(path, " has no format version"));
  }
  if (manifest.world_size() < 1) {
    return absl::DataLossError(
        absl::StrCat(path, " has world size ", manifest.world_size(), "; it must be >= 1"));
  }
  std::set<std::string> names;
  for (const FileEntry& file : manifest.files()) {
    if (file.name().empty() || file.name().find('/') != std::string::npos ||
        !names.insert(file.name()).second) {
      return absl::DataLossError(
          absl::StrCat(path, ": bad or duplicate shard file name \"", file.name(), "\""));
    }
  }
  names.clear();
  for (const TensorEntry& tensor : manifest.tensors()) {
    if (!names.insert(tensor.name()).second) {
      return absl::DataLossError(
          absl::StrCat(path, ": tensor \"", tensor.name(), "\" appears twice"));
    }
    KEEL_RETURN_IF_ERROR(CheckTensor(manifest, tensor, path));
  }
  names.clear();
  for (const ObjectEntry& object : manifest.objects()) {
    if (!names.insert(object.name()).second) {
      return absl::DataLossError(
          absl::StrCat(path, ": object \"", object.name(), "\" appears twice"));
    }
    KEEL_RETURN_IF_ERROR(CheckObject(manifest, object, path));
  }
  return manifest;
}

void JsonToValue(const base::Json& json, Value& value) {
  switch (json.type()) {
    case base::Json::value_t::null:
    case base::Json::value_t::discarded:
      value.set_null_value(true);
      break;
    case base::Json::value_t::boolean:
      value.set_bool_value(json.get<bool>());
      break;
    case base::Json::value_t::number_integer:
      value.set_int_value(json.get<int64_t>());
      break;
    case base::Json::value_t::number_unsigned:
      value.set_uint_value(json.get<uint64_t>());
      break;
    case base::Json::value_t::number_float:
      value.set_double_value(json.get<double>());
      break;
    case base::Json::value_t::string:
      value.set_string_value(json.get<std::string>());
      break;
    case base::Json::value_t::array:
    case base::Json::value_t::binary: {
      ListValue* list = value.mutable_list_value();
      for (const base::Json& item : json) JsonToValue(item, *list->add_values());
      break;
    }
    case base::Json::value_t::object: {
      MapValue* map = value.mutable_map_value();
      for (const auto& [key, item] : json.items()) {
        MapEntry* entry = map->add_entries();
        entry->set_key(key);
        JsonToValue(item, *entry->mutable_value());
      }
      break;
    }
  }
}

absl::StatusOr<base::Json> ValueToJson(const Value& value) {
  switch (value.kind_case()) {
    case Value::kNullValue:
      return base::Json(nullptr);
    case Value::kBoolValue:
      return base::Json(value.bool_value());
    case Value::kIntValue:
      return base::Json(value.int_value());
    case Value::kUintValue:
      return base::Json(value.uint_value());
    case Value::kDoubleValue:
      return base::Json(value.double_value());
    case Value::kStringValue:
      return base::Json(value.string_value());
    case Value::kListValue: {
      base::Json list = base::Json::array();
      for (const Value& item : value.list_value().values()) {
        KEEL_ASSIGN_OR_RETURN(base::Json json, ValueToJson(item));
        list.push_back(std::move(json));
      }
      return list;
    }
    case Value::kMapValue: {
      base::Json map = base::Json::object();
      for (const MapEntry& entry : value.map_value().entries()) {
        KEEL_ASSIGN_OR_RETURN(map[entry.key()], ValueToJson(entry.value()));
      }
      return map;
    }
    case Value::KIND_NOT_SET:
      break;
  }
  return absl::DataLossError("a manifest value has no kind");
}

}  // namespace keel::checkpoint::internal
