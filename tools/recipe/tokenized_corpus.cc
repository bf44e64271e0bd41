#include "tools/recipe/tokenized_corpus.h"

#include <algorithm>
#include <filesystem>
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
#include "base/quote.h"
#include "base/status.h"
#include "base/utf8.h"
#include "tools/recipe/internal/spm_tokenizer.h"

namespace keel::tools::recipe {
namespace {

using internal::SpmTokenizer;

// Lines read, then parsed and encoded on all threads, at a time.
constexpr size_t kBatchLines = 16384;

using Sentences = std::vector<std::string>;

// A line of an input: its text, file (an index into the inputs) and line number.
struct Line {
  std::string text;
  size_t file = 0;
  int64_t number = 0;
};

// A batch of lines. Each JSONL line is one document (blank lines are skipped); a text file is
// one document whose lines are its sentences, and may span batches.
struct Batch {
  std::vector<Line> lines;
  // Where input files ended: after lines[0, end) for each `end`, in order (an empty file
  // adds an end too).
  std::vector<size_t> ends;
};

std::string Where(const std::string& file, int64_t line) { return absl::StrCat(file, ":", line); }

// The most encoding threads a run starts: far more than any machine's cores, fewer than a
// process may start.
constexpr int kMaxThreads = 1024;

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
  if (!record.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", record.status().message()));
  }
  if (!record->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": not a JSON object"));
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
  LineReader(const std::vector<std::string>& files, bool skip_blank_lines)
      : files_(files), skip_blank_lines_(skip_blank_lines) {}

  // Up to kBatchLines lines; no lines and no ends at the end.
  absl::StatusOr<Batch> Next() {
    Batch batch;
    while (batch.lines.size() < kBatchLines) {
      if (!in_.is_open()) {
        if (next_file_ == files_.size()) break;
        KEEL_RETURN_IF_ERROR(Open(next_file_++));
      }
      if (in_.peek() == std::char_traits<char>::eof()) {
        if (in_.bad()) return base::ErrnoError("reading", files_[file_]);
        in_.close();
        batch.ends.push_back(batch.lines.size());
        continue;
      }
      Line line{"", file_, ++number_};
      std::getline(in_, line.text);
      if (!skip_blank_lines_ || line.text.find_first_not_of(" \t\r") != std::string::npos) {
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
  const bool skip_blank_lines_;
  size_t next_file_ = 0;
  std::ifstream in_;
  size_t file_ = 0;
  int64_t number_ = 0;
};

// Consecutive sentences of one document (a whole document, or a text file's lines in a batch).
struct Part {
  // ranges[k]: the sentences [first, second) of dataset k.
  std::vector<std::pair<size_t, size_t>> ranges;
  // Whether the document ends with this part.
  bool ends_document = true;
};

// A batch split into parts of documents.
struct Parsed {
  std::vector<std::string_view> sentences;
  std::vector<Part> parts;
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
    for (const Line& line : batch.lines) parsed.sentences.push_back(line.text);
    size_t first = 0;
    for (size_t end : batch.ends) {
      parsed.parts.push_back({{{first, end}}, /*ends_document=*/true});
      first = end;
    }
    if (first < batch.lines.size()) {
      parsed.parts.push_back({{{first, batch.lines.size()}}, /*ends_document=*/false});
    }
    return parsed;
  }
  for (const std::vector<Sentences>& record : parsed.records) {
    Part& part = parsed.parts.emplace_back();
    for (const Sentences& sentences : record) {
      const size_t first = parsed.sentences.size();
      parsed.sentences.insert(parsed.sentences.end(), sentences.begin(), sentences.end());
      part.ranges.emplace_back(first, parsed.sentences.size());
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
  // The open document's last sequence with ids, held back until it is known whether the
  // document ends with it (and takes the EOD).
  std::vector<int64_t> last;
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
  for (size_t i = 0; i < options.json_keys.size(); ++i) {
    const std::string& key = options.json_keys[i];
    if (key.empty()) return absl::InvalidArgumentError("--json_keys holds an empty key");
    // Each key writes a dataset of its own name: a second would write the first's files.
    if (std::find(options.json_keys.begin(), options.json_keys.begin() + i, key) !=
        options.json_keys.begin() + i) {
      return absl::InvalidArgumentError(
          absl::StrCat("--json_keys lists ", base::Quote(key), " twice; allowed: each key once"));
    }
  }
  if (options.threads < 0 || options.threads > kMaxThreads) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--workers (", options.threads, ") must be in [0, ", kMaxThreads, "] (0: one per core)"));
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

// Holds `ids` back as the open document's last sequence (empty: none, at the document's end)
// and writes the sequence it replaces, if any.
absl::Status HoldBack(std::vector<int64_t> ids, Output& output) {
  output.last.swap(ids);
  if (ids.empty()) return absl::OkStatus();
  ++output.stats.sequences;
  output.stats.tokens += static_cast<int64_t>(ids.size());
  return output.writer->AddItem(ids);
}

// Megatron's Encoder.encode, for one dataset: a sequence per sentence with ids, the EOS id after
// the last (append_eod); `ids[range]` are the sentences of the open document in this part.
absl::Status WritePart(const std::vector<std::vector<int64_t>>& ids,
                       std::pair<size_t, size_t> range, bool ends_document,
                       std::optional<int64_t> eod, Output& output) {
  for (size_t i = range.first; i < range.second; ++i) {
    if (!ids[i].empty()) KEEL_RETURN_IF_ERROR(HoldBack(ids[i], output));
  }
  if (!ends_document) return absl::OkStatus();
  if (eod.has_value() && !output.last.empty()) output.last.push_back(*eod);
  KEEL_RETURN_IF_ERROR(HoldBack({}, output));
  output.writer->EndDocument();
  ++output.stats.documents;
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
  LineReader reader(inputs, /*skip_blank_lines=*/!options.json_keys.empty());
  while (true) {
    KEEL_ASSIGN_OR_RETURN(const Batch batch, reader.Next());
    if (batch.lines.empty() && batch.ends.empty()) return absl::OkStatus();
    KEEL_ASSIGN_OR_RETURN(const Parsed parsed,
                          ParseBatch(batch, inputs, options.json_keys, threads));
    KEEL_ASSIGN_OR_RETURN(const auto ids, EncodeSentences(tokenizer, parsed.sentences, threads));
    for (const Part& part : parsed.parts) {
      for (size_t k = 0; k < outputs.size(); ++k) {
        KEEL_RETURN_IF_ERROR(WritePart(ids, part.ranges[k], part.ends_document, eod, outputs[k]));
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
  // Absolute, so that the trainer finds the model to compare wherever it runs from.
  corpus.info = {std::filesystem::absolute(options.tokenizer_model).string(),
                 tokenizer->vocab_size(), tokenizer->eos_id(), options.append_eod,
                 TokenizerType::kSentencePiece};
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
