#include "tools/recipe/tokenized_corpus.h"

#include <algorithm>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string_view>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "base/json.h"
#include "base/status.h"
#include "base/utf8.h"
#include "tools/recipe/internal/spm_tokenizer.h"

namespace keel::tools::recipe {
namespace {

using internal::SpmTokenizer;

// Lines read, then parsed and encoded on all threads, at a time (text files: whole files).
constexpr size_t kBatchLines = 16384;

using Sentences = std::vector<std::string>;

// A line of an input: its text, file (an index into the inputs) and line number.
struct Line {
  std::string text;
  size_t file = 0;
  int64_t number = 0;
};

// A batch of lines. Text files come whole, each one document whose lines are its sentences;
// each JSONL line is one document (blank lines are skipped).
struct Batch {
  std::vector<Line> lines;
  // Text files: those whose lines are in `lines`, in order (an empty file has none).
  std::vector<size_t> files;
};

std::string Where(const std::string& file, int64_t line) { return absl::StrCat(file, ":", line); }

// Runs fn(i) for i in [0, n) on `threads` threads; the error of the smallest failing i.
absl::Status ParallelFor(int threads, size_t n, const std::function<absl::Status(size_t)>& fn) {
  std::vector<std::pair<size_t, absl::Status>> failures(threads, {n, absl::OkStatus()});
  auto work = [&](int t) {
    for (size_t i = t; i < n; i += threads) {
      if (absl::Status status = fn(i); !status.ok()) {
        failures[t] = {i, std::move(status)};
        return;
      }
    }
  };
  std::vector<std::thread> helpers;
  for (int t = 1; t < threads; ++t) helpers.emplace_back(work, t);
  work(0);
  for (std::thread& helper : helpers) helper.join();
  return std::min_element(failures.begin(), failures.end(),
                          [](const auto& a, const auto& b) { return a.first < b.first; })
      ->second;
}

// The sentences of `key` in a JSONL record: its string, or its list of strings.
absl::StatusOr<Sentences> SentencesOf(const base::Json& record, const std::string& key,
                                      const std::string& where) {
  const auto it = record.find(key);
  if (it == record.end()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": no key \"", key, "\""));
  }
  if (it->is_string()) return Sentences{it->get<std::string>()};
  Sentences sentences;
  if (it->is_array()) {
    for (const base::Json& sentence : *it) {
      if (!sentence.is_string()) break;
      sentences.push_back(sentence.get<std::string>());
    }
    if (sentences.size() == it->size()) return sentences;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(where, ": \"", key, "\" is neither a string nor a list of strings"));
}

// A JSONL line's sentences for each key.
absl::StatusOr<std::vector<Sentences>> ParseRecord(const std::string& line,
                                                   const std::vector<std::string>& keys,
                                                   const std::string& where) {
  absl::StatusOr<base::Json> record = base::ParseJson(line);
  if (!record.ok() || !record->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": not a JSON object",
                     record.ok() ? "" : absl::StrCat(" (", record.status().message(), ")")));
  }
  std::vector<Sentences> document;
  for (const std::string& key : keys) {
    KEEL_ASSIGN_OR_RETURN(Sentences sentences, SentencesOf(*record, key, where));
    document.push_back(std::move(sentences));
  }
  return document;
}

// Reads the inputs a batch at a time.
class LineReader {
 public:
  LineReader(const std::vector<std::string>& files, bool whole_files)
      : files_(files), whole_files_(whole_files) {}

  // About kBatchLines lines (whole files with whole_files); none at the end.
  absl::StatusOr<Batch> Next() {
    Batch batch;
    while (batch.lines.size() < kBatchLines || (whole_files_ && in_.is_open())) {
      if (!in_.is_open() || in_.peek() == std::char_traits<char>::eof()) {
        if (in_.is_open()) in_.close();
        if (next_file_ == files_.size() || (whole_files_ && batch.lines.size() >= kBatchLines)) {
          break;
        }
        KEEL_RETURN_IF_ERROR(Open(next_file_++));
        if (whole_files_) batch.files.push_back(file_);
        continue;
      }
      Line line{"", file_, ++number_};
      std::getline(in_, line.text);
      if (whole_files_ || line.text.find_first_not_of(" \t\r") != std::string::npos) {
        batch.lines.push_back(std::move(line));
      }
    }
    return batch;
  }

 private:
  absl::Status Open(size_t file) {
    in_.open(files_[file], std::ios::binary);
    if (!in_) return base::ErrnoError("reading", files_[file]);
    file_ = file;
    number_ = 0;
    return absl::OkStatus();
  }

  const std::vector<std::string>& files_;
  const bool whole_files_;
  size_t next_file_ = 0;
  std::ifstream in_;
  size_t file_ = 0;
  int64_t number_ = 0;
};

// A batch split into documents, each dataset's part of a document a range of `sentences`.
struct Parsed {
  std::vector<std::string_view> sentences;
  // documents[d][k]: the sentences [first, second) of dataset k in document d.
  std::vector<std::vector<std::pair<size_t, size_t>>> documents;
  // JSONL: the parsed records the sentences point into.
  std::vector<std::vector<Sentences>> records;
};

// Checks every line's UTF-8 and parses JSONL records, on all threads.
absl::StatusOr<Parsed> ParseBatch(const Batch& batch, const std::vector<std::string>& inputs,
                                  const std::vector<std::string>& keys, int threads) {
  Parsed parsed;
  parsed.records.resize(keys.empty() ? 0 : batch.lines.size());
  KEEL_RETURN_IF_ERROR(ParallelFor(threads, batch.lines.size(), [&](size_t i) -> absl::Status {
    const Line& line = batch.lines[i];
    const std::string where = Where(inputs[line.file], line.number);
    if (const std::optional<size_t> bad = base::FirstInvalidUtf8(line.text)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": invalid UTF-8 at byte ", *bad + 1, " of the line"));
    }
    if (keys.empty()) return absl::OkStatus();
    KEEL_ASSIGN_OR_RETURN(parsed.records[i], ParseRecord(line.text, keys, where));
    return absl::OkStatus();
  }));
  if (keys.empty()) {
    size_t i = 0;
    for (size_t file : batch.files) {
      const size_t first = i;
      for (; i < batch.lines.size() && batch.lines[i].file == file; ++i) {
        parsed.sentences.push_back(batch.lines[i].text);
      }
      parsed.documents.push_back({{first, i}});
    }
    return parsed;
  }
  for (const std::vector<Sentences>& record : parsed.records) {
    parsed.documents.emplace_back();
    for (const Sentences& sentences : record) {
      const size_t first = parsed.sentences.size();
      parsed.sentences.insert(parsed.sentences.end(), sentences.begin(), sentences.end());
      parsed.documents.back().emplace_back(first, parsed.sentences.size());
    }
  }
  return parsed;
}

// Every sentence's ids, encoded on all threads.
absl::StatusOr<std::vector<std::vector<int64_t>>> EncodeSentences(
    const SpmTokenizer& tokenizer, const std::vector<std::string_view>& sentences, int threads) {
  std::vector<std::vector<int64_t>> ids(sentences.size());
  KEEL_RETURN_IF_ERROR(ParallelFor(threads, sentences.size(), [&](size_t i) -> absl::Status {
    std::string error;
    if (!tokenizer.Encode(sentences[i], ids[i], error)) {
      return absl::InternalError(absl::StrCat("SentencePiece failed to encode: ", error));
    }
    return absl::OkStatus();
  }));
  return ids;
}

// One dataset being written under temporary names.
struct Output {
  TokenizedDataset stats;
  std::string temp;
  std::optional<sampling::IndexedDatasetWriter> writer;
  // The final names Commit has put in place so far.
  std::vector<std::string> placed;
};

// Renames each output's files into place: .bin, then .tokenizer.json, then .idx (a reader
// opens the .idx first).
absl::Status Commit(std::vector<Output>& outputs, const TokenizerInfo& info) {
  for (Output& output : outputs) KEEL_RETURN_IF_ERROR(output.writer->Finalize());
  for (Output& output : outputs) {
    const std::string& prefix = output.stats.prefix;
    KEEL_RETURN_IF_ERROR(base::RenameDurably(output.temp + ".bin", prefix + ".bin"));
    output.placed.push_back(prefix + ".bin");
    KEEL_RETURN_IF_ERROR(WriteTokenizerInfo(prefix, info));
    output.placed.push_back(TokenizerInfoPath(prefix));
    KEEL_RETURN_IF_ERROR(base::RenameDurably(output.temp + ".idx", prefix + ".idx"));
    output.placed.push_back(prefix + ".idx");
  }
  return absl::OkStatus();
}

// Removes what a failed build wrote: its temporary files and the final names it placed.
void RemoveOutputs(const std::vector<Output>& outputs) {
  for (const Output& output : outputs) {
    std::vector<std::string> paths = output.placed;
    paths.push_back(output.temp + ".bin");
    paths.push_back(output.temp + ".idx");
    for (const std::string& path : paths) {
      if (base::PathExists(path)) base::RemoveTree(path).IgnoreError();
    }
  }
}

absl::Status CheckArguments(const std::vector<std::string>& inputs,
                            const std::string& output_prefix, const TokenizeOptions& options) {
  if (inputs.empty()) return absl::InvalidArgumentError("no input file given");
  if (output_prefix.empty()) return absl::InvalidArgumentError("the output prefix is empty");
  for (const std::string& key : options.json_keys) {
    if (key.empty()) return absl::InvalidArgumentError("--json_keys holds an empty key");
  }
  for (const std::string& input : inputs) {
    if (!base::PathExists(input)) {
      return absl::NotFoundError(absl::StrCat(input, ": no such input file"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<SpmTokenizer>> LoadTokenizer(const TokenizeOptions& options) {
  std::string error;
  std::unique_ptr<SpmTokenizer> tokenizer = SpmTokenizer::Load(options.tokenizer_model, error);
  if (tokenizer == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("--tokenizer_model ", options.tokenizer_model,
                                                   ": not a SentencePiece model (", error, ")"));
  }
  if (options.append_eod && tokenizer->eos_id() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--append_eod: the SentencePiece model ", options.tokenizer_model,
                     " has no EOS piece (eos_id ", tokenizer->eos_id(), ")"));
  }
  return tokenizer;
}

// Megatron's Encoder.encode for dataset k of a document: a sequence per sentence with ids, the
// EOS id after the last (append_eod); then written to output k.
absl::Status WriteDocument(const std::vector<std::vector<int64_t>>& ids,
                           std::pair<size_t, size_t> range, std::optional<int64_t> eod,
                           Output& output) {
  std::vector<int64_t> tokens;
  std::vector<int64_t> lengths;
  for (size_t i = range.first; i < range.second; ++i) {
    if (ids[i].empty()) continue;
    tokens.insert(tokens.end(), ids[i].begin(), ids[i].end());
    lengths.push_back(static_cast<int64_t>(ids[i].size()));
  }
  if (eod.has_value() && !tokens.empty()) {
    tokens.push_back(*eod);
    ++lengths.back();
  }
  KEEL_RETURN_IF_ERROR(output.writer->AddDocument(tokens, lengths));
  ++output.stats.documents;
  output.stats.sequences += static_cast<int64_t>(lengths.size());
  output.stats.tokens += static_cast<int64_t>(tokens.size());
  return absl::OkStatus();
}

// Reads, parses, encodes and writes every batch into `outputs`.
absl::Status Write(const SpmTokenizer& tokenizer, const std::vector<std::string>& inputs,
                   const TokenizeOptions& options, std::vector<Output>& outputs) {
  const std::optional<int64_t> eod =
      options.append_eod ? std::optional<int64_t>(tokenizer.eos_id()) : std::nullopt;
  const int threads = options.threads > 0
                          ? options.threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  LineReader reader(inputs, /*whole_files=*/options.json_keys.empty());
  while (true) {
    KEEL_ASSIGN_OR_RETURN(const Batch batch, reader.Next());
    if (batch.lines.empty() && batch.files.empty()) return absl::OkStatus();
    KEEL_ASSIGN_OR_RETURN(const Parsed parsed,
                          ParseBatch(batch, inputs, options.json_keys, threads));
    KEEL_ASSIGN_OR_RETURN(const auto ids, EncodeSentences(tokenizer, parsed.sentences, threads));
    for (const auto& document : parsed.documents) {
      for (size_t k = 0; k < outputs.size(); ++k) {
        KEEL_RETURN_IF_ERROR(WriteDocument(ids, document[k], eod, outputs[k]));
      }
    }
  }
}

}  // namespace

absl::StatusOr<TokenizedCorpus> BuildTokenizedCorpus(const std::vector<std::string>& inputs,
                                                     const std::string& output_prefix,
                                                     const TokenizeOptions& options) {
  KEEL_RETURN_IF_ERROR(CheckArguments(inputs, output_prefix, options));
  KEEL_ASSIGN_OR_RETURN(std::unique_ptr<SpmTokenizer> tokenizer, LoadTokenizer(options));
  TokenizedCorpus corpus;
  corpus.info = {options.tokenizer_model, tokenizer->vocab_size(), tokenizer->eos_id(),
                 options.append_eod};
  corpus.dtype = sampling::OptimalTokenDtype(tokenizer->vocab_size());
  std::vector<Output> outputs;
  for (const std::string& key : options.json_keys) {
    outputs.emplace_back().stats.prefix = absl::StrCat(output_prefix, "_", key, "_document");
  }
  if (options.json_keys.empty()) outputs.emplace_back().stats.prefix = output_prefix;
  absl::Status status = base::MakeDirectories(base::ParentDirectory(output_prefix));
  for (Output& output : outputs) {
    output.temp = output.stats.prefix + ".tmp";
    absl::StatusOr<sampling::IndexedDatasetWriter> writer =
        sampling::IndexedDatasetWriter::Create(output.temp, corpus.dtype);
    status.Update(writer.status());
    if (writer.ok()) output.writer.emplace(*std::move(writer));
  }
  if (status.ok()) status = Write(*tokenizer, inputs, options, outputs);
  if (status.ok()) status = Commit(outputs, corpus.info);
  if (!status.ok()) {
    RemoveOutputs(outputs);
    return status;
  }
  for (const Output& output : outputs) corpus.datasets.push_back(output.stats);
  return corpus;
}

}  // namespace keel::tools::recipe
