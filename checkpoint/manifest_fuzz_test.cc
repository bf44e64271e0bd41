// Fuzzes the manifest parser (internal::DecodeManifest). An input's first byte picks the mode:
// even, the rest is a whole manifest file; odd, the rest is a manifest body that the harness
// frames with a correct length and checksum, so mutations reach the protobuf parser and the
// structural checks behind the checksum. The parser must return kDataLoss or
// kFailedPrecondition, or a manifest whose every promise holds; a broken promise traps.
//
// Built by Bazel with gcc, this file is a test that runs the entry point over a generated
// corpus (encoded manifests, their truncations, byte mutations, random bytes). To fuzz with
// libFuzzer (Debian: clang, libclang-rt-14-dev), from the repository root, after
// `bazel build //checkpoint:manifest_cc_proto`:
//
//   clang++ -std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined -DKEEL_LIBFUZZER -I.
//       -Ibazel-bin checkpoint/manifest_fuzz_test.cc checkpoint/internal/manifest_io.cc
//       checkpoint/internal/files.cc checkpoint/internal/dtype.cc
//       bazel-bin/checkpoint/manifest.pb.cc -lprotobuf -lxxhash -lc10 -labsl_statusor
//       -labsl_status -labsl_strings -labsl_int128 -labsl_throw_delegate
//       -labsl_raw_logging_internal -labsl_str_format_internal -labsl_cord -labsl_cordz_info
//       -labsl_cord_internal -o /tmp/manifest_fuzzer
//   mkdir -p /tmp/manifest_corpus && /tmp/manifest_fuzzer -max_total_time=60 /tmp/manifest_corpus
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "c10/core/ScalarType.h"
#include "checkpoint/internal/dtype.h"
#include "checkpoint/internal/files.h"
#include "checkpoint/internal/manifest_io.h"
#include "checkpoint/manifest.pb.h"

namespace keel::checkpoint {
namespace {

void Require(bool promise) {
  if (!promise) __builtin_trap();
}

// Every promise of a manifest that DecodeManifest accepted.
void CheckManifest(const Manifest& manifest) {
  Require(manifest.format_version() >= 1 && manifest.format_version() <= internal::kFormatVersion);
  std::set<std::string> names;
  for (const FileEntry& file : manifest.files()) {
    Require(!file.name().empty() && file.name().find('/') == std::string::npos);
    Require(names.insert(file.name()).second);
  }
  names.clear();
  for (const TensorEntry& tensor : manifest.tensors()) {
    Require(names.insert(tensor.name()).second);
    absl::StatusOr<at::ScalarType> dtype = internal::ParseDtype(tensor.dtype());
    Require(dtype.ok());
    const uint64_t item = c10::elementSize(*dtype);
    int64_t volume = 1;
    for (int64_t dim : tensor.shape()) {
      Require(dim >= 0);
      volume *= dim;
    }
    int64_t covered = 0;
    for (const Chunk& chunk : tensor.chunks()) {
      Require(chunk.offsets_size() == tensor.shape_size());
      Require(chunk.lengths_size() == tensor.shape_size());
      int64_t chunk_volume = 1;
      for (int d = 0; d < tensor.shape_size(); ++d) {
        Require(chunk.offsets(d) >= 0 && chunk.lengths(d) >= 0);
        Require(chunk.offsets(d) + chunk.lengths(d) <= tensor.shape(d));
        chunk_volume *= chunk.lengths(d);
      }
      Require(static_cast<uint64_t>(chunk_volume) * item == chunk.byte_length());
      Require(chunk.file() < static_cast<uint32_t>(manifest.files_size()));
      const uint64_t file_size = manifest.files(chunk.file()).size();
      Require(chunk.byte_offset() <= file_size &&
              chunk.byte_length() <= file_size - chunk.byte_offset());
      covered += chunk_volume;
    }
    Require(covered == volume);
  }
  Require(manifest.world_size() >= 1);
  names.clear();
  for (const ObjectEntry& object : manifest.objects()) {
    Require(names.insert(object.name()).second);
    if (object.rank_values().empty()) continue;
    Require(manifest.format_version() >= internal::kPerRankValuesVersion);
    Require(!object.has_value() && object.rank_values_size() == manifest.world_size());
    for (int r = 0; r < object.rank_values_size(); ++r) Require(object.rank_values(r).rank() == r);
  }
}

std::string Frame(absl::string_view body) {
  std::string bytes = "KEELMFST";
  auto put = [&](uint64_t v) {
    for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  };
  put(body.size());
  put(internal::Xxh3(body.data(), body.size()));
  bytes.append(body.data(), body.size());
  return bytes;
}

}  // namespace
}  // namespace keel::checkpoint

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const absl::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  const std::string file = (data[0] & 1) ? keel::checkpoint::Frame(rest) : std::string(rest);
  absl::StatusOr<keel::checkpoint::Manifest> manifest =
      keel::checkpoint::internal::DecodeManifest(file, "fuzz/manifest.pb");
  if (manifest.ok()) {
    keel::checkpoint::CheckManifest(*manifest);
  } else if (manifest.status().code() != absl::StatusCode::kDataLoss &&
             manifest.status().code() != absl::StatusCode::kFailedPrecondition) {
    __builtin_trap();
  }
  return 0;
}

#ifndef KEEL_LIBFUZZER
#include <random>

#include "gtest/gtest.h"

namespace keel::checkpoint {
namespace {

// A valid manifest: a sharded F32 [4, 6] in two chunks, a replicated scalar, values saved
// once and values per rank.
Manifest ValidManifest() {
  Manifest manifest;
  manifest.set_format_version(2);
  manifest.set_keel_version("0.1.0");
  manifest.set_step(7);
  manifest.set_world_size(2);
  manifest.set_shard_format(ShardFormat::KEEL);
  for (int rank = 0; rank < 2; ++rank) {
    FileEntry* file = manifest.add_files();
    file->set_name(rank == 0 ? "__0.keel" : "__1.keel");
    file->set_size(8192);
    file->set_rank(rank);
  }
  TensorEntry* w = manifest.add_tensors();
  w->set_name("model/w");
  w->set_dtype("F32");
  w->add_shape(4);
  w->add_shape(6);
  for (int rank = 0; rank < 2; ++rank) {
    Chunk* chunk = w->add_chunks();
    chunk->add_offsets(2 * rank);
    chunk->add_offsets(0);
    chunk->add_lengths(2);
    chunk->add_lengths(6);
    chunk->set_file(rank);
    chunk->set_byte_length(48);
    chunk->set_xxh3(42);
  }
  TensorEntry* s = manifest.add_tensors();
  s->set_name("model/s");
  s->set_dtype("I64");
  Chunk* chunk = s->add_chunks();
  chunk->set_file(1);
  chunk->set_byte_offset(4096);
  chunk->set_byte_length(8);
  ObjectEntry* object = manifest.add_objects();
  object->set_name("model");
  internal::JsonToValue(base::Json{{"lr", 0.5}, {"ids", {1, 2}}}, *object->mutable_value());
  ObjectEntry* optim = manifest.add_objects();
  optim->set_name("optim");
  for (int rank = 0; rank < 2; ++rank) {
    RankValue* entry = optim->add_rank_values();
    entry->set_rank(rank);
    internal::JsonToValue(base::Json{{"params", {rank}}}, *entry->mutable_value());
  }
  return manifest;
}

int RunInput(char mode, const std::string& bytes) {
  const std::string input = std::string(1, mode) + bytes;
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
  const std::string file = (mode & 1) ? Frame(bytes) : bytes;
  return internal::DecodeManifest(file, "fuzz/manifest.pb").ok() ? 1 : 0;
}

TEST(ManifestFuzzTest, SurvivesTheCorpus) {
  std::string body;
  ValidManifest().SerializeToString(&body);
  const std::string file = internal::EncodeManifest(ValidManifest());
  int accepted = RunInput(0, file) + RunInput(1, body);
  int total = 2;
  std::mt19937_64 random(7);
  for (size_t size = 0; size < file.size(); ++size, ++total)
    accepted += RunInput(0, file.substr(0, size));
  for (size_t size = 0; size < body.size(); ++size, ++total)
    accepted += RunInput(1, body.substr(0, size));
  for (size_t at = 0; at < body.size(); ++at) {
    for (uint8_t value : {0x00, 0x01, 0x02, 0x08, 0x10, 0x7f, 0x80, 0xff}) {
      std::string mutated = body;
      mutated[at] = static_cast<char>(value);
      accepted += RunInput(1, mutated);
      mutated[at] = static_cast<char>(body[at] ^ value);
      accepted += RunInput(1, mutated);
      total += 2;
    }
  }
  for (int i = 0; i < 2000; ++i, ++total) {
    std::string noise(random() % 120, '\0');
    for (char& c : noise) c = static_cast<char>(random());
    accepted += RunInput(static_cast<char>(random()), noise);
  }
  // Both outcomes are reached; every accepted manifest passed CheckManifest.
  EXPECT_GT(accepted, 50);
  EXPECT_GT(total - accepted, 1000);
}

}  // namespace
}  // namespace keel::checkpoint
#endif  // KEEL_LIBFUZZER
