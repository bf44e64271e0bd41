// Megatron's tools/preprocess_data.py with a SentencePiece model: text files or JSONL encoded
// into Megatron indexed datasets, the documents encoded on every core.
//
//   TokenizeOptions options;
//   options.tokenizer_model = "spm.model";
//   options.json_keys = {"text"};
//   options.append_eod = true;
//   KEEL_ASSIGN_OR_RETURN(TokenizedCorpus corpus,
//                         BuildTokenizedCorpus({"a.jsonl"}, "data/web", options));
//   // data/web_text_document.{bin,idx,tokenizer.json}
#ifndef KEEL_TOOLS_RECIPE_TOKENIZED_CORPUS_H_
#define KEEL_TOOLS_RECIPE_TOKENIZED_CORPUS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "sampling/indexed_dataset_writer.h"
#include "tools/recipe/tokenizer_info.h"

namespace keel::tools::recipe {

struct TokenizeOptions {
  // The SentencePiece model (--tokenizer-model). Required.
  std::string tokenizer_model;
  // --json_keys: the inputs are JSONL, one document per line, and each key's text (a string,
  // or a list of strings, each a sentence) makes a dataset "<prefix>_<key>_document". Empty:
  // the inputs are text files, each a document whose lines are its sentences, into "<prefix>".
  // Default: empty.
  std::vector<std::string> json_keys;
  // --append_eod: the model's EOS id ends every non-empty document. Default: false.
  bool append_eod = false;
  // Threads that encode, at most 1024; 0 for one per core. Default: 0.
  int threads = 0;
};

// One dataset written.
struct TokenizedDataset {
  std::string prefix;
  int64_t documents = 0;
  int64_t sequences = 0;
  int64_t tokens = 0;
};

struct TokenizedCorpus {
  std::vector<TokenizedDataset> datasets;
  // Recorded beside each dataset (TokenizerInfoPath).
  TokenizerInfo info;
  // DType.optimal_dtype of the vocabulary: uint16 below 65500 pieces, else int32.
  sampling::TokenDtype dtype = sampling::TokenDtype::kUint16;
};

// Encodes `inputs` in order, each sentence exactly as SentencePiece's Encode (and spm_encode,
// line by line) gives it; a sentence with no ids adds no sequence, as in Megatron. Lines are
// read, checked and encoded 16384 at a time, so memory does not grow with a file. Writes each
// dataset's .bin, .idx and .tokenizer.json (creating the prefix's directory) under temporary
// names and renames them at the end;
// on an error nothing is left under the output names.
// Errors: kInvalidArgument for no inputs, an empty prefix or key, threads outside [0, 1024], a
// model that cannot be loaded (naming it) or has no EOS id with append_eod; kNotFound for a
// missing input;
// kInvalidArgument naming "<file>:<line>" for invalid UTF-8, a JSONL line that is not a JSON
// object, lacks a key, or whose key is neither a string nor a list of strings; write errors.
[[nodiscard]] absl::StatusOr<TokenizedCorpus> BuildTokenizedCorpus(
    const std::vector<std::string>& inputs, const std::string& output_prefix,
    const TokenizeOptions& options);

}  // namespace keel::tools::recipe

#endif  // KEEL_TOOLS_RECIPE_TOKENIZED_CORPUS_H_
