#include "tools/recipe/corpus.h"

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/files.h"
#include "base/status.h"
#include "sampling/indexed_dataset_writer.h"

namespace keel::tools::recipe {
namespace {

constexpr char kCommonLicensesDir[] = "/usr/share/common-licenses";
// The versioned texts of base-files; the unversioned names (GPL, LGPL, GFDL) are symlinks.
constexpr const char* kCommonLicenses[] = {
    "Apache-2.0", "Artistic", "BSD",    "CC0-1.0",  "GFDL-1.2", "GFDL-1.3", "GPL-1",
    "GPL-2",      "GPL-3",    "LGPL-2", "LGPL-2.1", "LGPL-3",   "MPL-1.1",  "MPL-2.0",
};

// Every input is a file that exists and is not a directory, checked before the output is
// touched.
[[nodiscard]] absl::Status CheckInput(const std::string& path) {
  if (!base::PathExists(path)) {
    return base::ErrnoStatus(ENOENT, "text file", path);
  }
  if (base::IsDirectory(path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("text file ", path, " is a directory; pass the files in it"));
  }
  return absl::OkStatus();
}

[[nodiscard]] absl::StatusOr<std::string> ReadTextFile(const std::string& path) {
  absl::StatusOr<std::string> read = base::ReadFile(path);
  KEEL_RETURN_IF_ERROR(base::Annotate(read.status(), "text file"));
  std::string bytes = *std::move(read);
  if (const size_t nul = bytes.find('\0'); nul != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "text file ", path, " holds byte 0 at offset ", nul,
        "; byte 0 is the end-of-document token, so inputs must be text without NUL bytes"));
  }
  return bytes;
}

bool IsBlank(absl::string_view line) {
  return line.find_first_not_of(" \t\r\f\v") == absl::string_view::npos;
}

// Paragraph lengths in bytes: each paragraph runs up to the first line that is not blank after
// one or more blank lines. They add up to text.size().
std::vector<size_t> ParagraphLengths(absl::string_view text) {
  std::vector<size_t> lengths;
  size_t start = 0;  // of the current paragraph
  bool has_text = false;
  bool previous_blank = false;
  size_t line_start = 0;
  while (line_start < text.size()) {
    const size_t newline = text.find('\n', line_start);
    const size_t line_end = newline == absl::string_view::npos ? text.size() : newline + 1;
    absl::string_view line = text.substr(line_start, line_end - line_start);
    if (!line.empty() && line.back() == '\n') line.remove_suffix(1);
    const bool blank = IsBlank(line);
    if (!blank && previous_blank && has_text) {
      lengths.push_back(line_start - start);
      start = line_start;
    }
    if (!blank) has_text = true;
    previous_blank = blank;
    line_start = line_end;
  }
  if (start < text.size()) lengths.push_back(text.size() - start);
  return lengths;
}

[[nodiscard]] absl::Status AddDocument(absl::string_view text,
                                       sampling::IndexedDatasetWriter& writer, CorpusStats& stats) {
  const std::vector<size_t> lengths = ParagraphLengths(text);
  std::vector<int64_t> tokens;
  size_t offset = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    tokens.clear();
    for (const char byte : text.substr(offset, lengths[i])) {
      tokens.push_back(static_cast<unsigned char>(byte));
    }
    if (i + 1 == lengths.size()) tokens.push_back(kByteEodToken);
    KEEL_RETURN_IF_ERROR(writer.AddItem(tokens));
    offset += lengths[i];
    stats.tokens += static_cast<int64_t>(tokens.size());
  }
  writer.EndDocument();
  stats.sequences += static_cast<int64_t>(lengths.size());
  ++stats.documents;
  return absl::OkStatus();
}

[[nodiscard]] absl::StatusOr<CorpusStats> WriteCorpus(const std::vector<std::string>& text_files,
                                                      const std::string& output_prefix) {
  KEEL_ASSIGN_OR_RETURN(sampling::IndexedDatasetWriter writer,
                        sampling::IndexedDatasetWriter::Create(output_prefix, kByteTokenDtype));
  CorpusStats stats;
  for (const std::string& path : text_files) {
    KEEL_ASSIGN_OR_RETURN(const std::string text, ReadTextFile(path));
    KEEL_RETURN_IF_ERROR(AddDocument(text, writer, stats));
  }
  KEEL_RETURN_IF_ERROR(writer.Finalize());
  return stats;
}

}  // namespace

TokenizerInfo ByteTokenizerInfo() {
  return {.tokenizer_model = "bytes",
          .vocab_size = kByteVocabSize,
          .eos_id = kByteEodToken,
          .append_eod = true,
          .tokenizer_type = TokenizerType::kBytes};
}

absl::StatusOr<CorpusStats> BuildByteCorpus(const std::vector<std::string>& text_files,
                                            const std::string& output_prefix) {
  if (text_files.empty()) {
    return absl::InvalidArgumentError("text_files is empty; at least one text file is needed");
  }
  if (output_prefix.empty()) {
    return absl::InvalidArgumentError(
        "output_prefix is empty; it must name the <prefix>.bin and <prefix>.idx to write");
  }
  for (const std::string& path : text_files) KEEL_RETURN_IF_ERROR(CheckInput(path));
  absl::StatusOr<CorpusStats> stats = WriteCorpus(text_files, output_prefix);
  if (stats.ok()) {
    if (absl::Status written = WriteTokenizerInfo(output_prefix, ByteTokenizerInfo());
        !written.ok()) {
      stats = written;
    }
  }
  if (!stats.ok()) {
    base::RemoveTree(output_prefix + ".bin").IgnoreError();
    base::RemoveTree(output_prefix + ".idx").IgnoreError();
    base::RemoveTree(TokenizerInfoPath(output_prefix)).IgnoreError();
    return base::Annotate(stats.status(), absl::StrCat("building byte corpus ", output_prefix));
  }
  return stats;
}

std::vector<std::string> DefaultCorpusFiles() {
  std::vector<std::string> files;
  for (const char* name : kCommonLicenses) {
    std::error_code error;
    const std::filesystem::path path = std::filesystem::path(kCommonLicensesDir) / name;
    if (!std::filesystem::is_regular_file(path, error)) continue;
    std::filesystem::path resolved = std::filesystem::canonical(path, error);
    if (error) continue;
    files.push_back(resolved.string());
  }
  std::sort(files.begin(), files.end());
  files.erase(std::unique(files.begin(), files.end()), files.end());
  return files;
}

}  // namespace keel::tools::recipe
