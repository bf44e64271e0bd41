// Byte-level corpora for the trainer: text files turned into a Megatron indexed dataset
// (<prefix>.bin/.idx) whose tokens are the files' bytes, as Megatron's
// tools/preprocess_data.py (Encoder.encode with --split-sentences and --append-eod) lays out a
// tokenized corpus, with a byte "tokenizer" and blank-line paragraphs as its sentences.
//
//   std::vector<std::string> files = keel::tools::recipe::DefaultCorpusFiles();
//   if (files.empty()) return absl::NotFoundError("no default corpus on this system");
//   KEEL_ASSIGN_OR_RETURN(keel::tools::recipe::CorpusStats stats,
//                         keel::tools::recipe::BuildByteCorpus(files, "data/licenses"));
//   // then keel::sampling::IndexedDataset::Open("data/licenses")
#ifndef KEEL_TOOLS_RECIPE_CORPUS_H_
#define KEEL_TOOLS_RECIPE_CORPUS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "sampling/indexed_dataset_writer.h"
#include "tools/recipe/tokenizer_info.h"

namespace keel::tools::recipe {

// Token ids are byte values, so the vocabulary is every byte.
inline constexpr int64_t kByteVocabSize = 256;
// End-of-document token, appended to every non-empty document: byte 0 (NUL), which text never
// holds (BuildByteCorpus rejects files that do).
inline constexpr int64_t kByteEodToken = 0;
// Megatron's DType.optimal_dtype(256): uint16 (it picks uint16 for any vocabulary below 65500,
// although 256 symbols would fit uint8); kept so that the files match what Megatron writes.
inline constexpr sampling::TokenDtype kByteTokenDtype = sampling::TokenDtype::kUint16;

// The tokenizer record (tokenizer_info.h) BuildByteCorpus writes beside its dataset.
[[nodiscard]] TokenizerInfo ByteTokenizerInfo();

// What BuildByteCorpus wrote.
struct CorpusStats {
  // Input files, one document each (an empty file is a document with no sequences).
  int64_t documents = 0;
  // Paragraphs over all documents.
  int64_t sequences = 0;
  // Bytes of all files plus one end-of-document token per non-empty file.
  int64_t tokens = 0;
};

// Writes <output_prefix>.bin, .idx and ByteTokenizerInfo's record (<output_prefix>.tokenizer.json):
// each file in `text_files`, in order, is one document,
// and each of its paragraphs is one sequence. A paragraph is a run of lines that are not blank
// together with the blank lines after it (blank: only spaces, \t, \r, \f or \v; blank lines at
// the start of a file belong to its first paragraph), so a document's sequences put back
// together are the file's bytes exactly; the last sequence also ends with kByteEodToken. As in
// Megatron, an empty file adds a document with no sequences and no end-of-document token.
// Errors: kInvalidArgument for no files, an empty output_prefix, a directory, or a file holding
// byte 0; kNotFound for a missing file; base::ErrnoCode's when a read or a write fails.
// Inputs are checked before the output is opened; an error after that removes what it wrote.
[[nodiscard]] absl::StatusOr<CorpusStats> BuildByteCorpus(
    const std::vector<std::string>& text_files, const std::string& output_prefix);

// The default corpus: the license texts that Debian's base-files package installs on every
// system in /usr/share/common-licenses (Apache-2.0, Artistic, BSD, CC0-1.0, GFDL-1.2/1.3,
// GPL-1/2/3, LGPL-2/2.1/3, MPL-1.1/2.0), as paths with symlinks resolved, without duplicates,
// sorted. Only regular files that exist are listed; the caller must handle an empty result.
std::vector<std::string> DefaultCorpusFiles();

}  // namespace keel::tools::recipe

#endif  // KEEL_TOOLS_RECIPE_CORPUS_H_
