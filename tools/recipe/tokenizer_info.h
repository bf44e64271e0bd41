// What tools:preprocess --tokenizer_model records beside each dataset it writes,
// "<prefix>.tokenizer.json", for the trainer: the vocabulary the token ids come from.
#ifndef KEEL_TOOLS_RECIPE_TOKENIZER_INFO_H_
#define KEEL_TOOLS_RECIPE_TOKENIZER_INFO_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace keel::tools::recipe {

struct TokenizerInfo {
  // The SentencePiece model the dataset was encoded with.
  std::string tokenizer_model;
  // Its pieces: every token id is below this.
  int64_t vocab_size = 0;
  // Its end-of-sentence id (-1 if it has none), appended to each document with append_eod.
  int64_t eos_id = -1;
  bool append_eod = false;
};

// "<prefix>.tokenizer.json".
std::string TokenizerInfoPath(const std::string& prefix);

// Writes `info` to TokenizerInfoPath(prefix) (to a temporary file, then renamed).
// Errors: base::ErrnoCode's, naming the file.
[[nodiscard]] absl::Status WriteTokenizerInfo(const std::string& prefix, const TokenizerInfo& info);

// The info of the dataset at `prefix`, or nullopt when it has none (a byte-level or
// Megatron-written dataset). Errors: kDataLoss naming the file when it is not such a record.
[[nodiscard]] absl::StatusOr<std::optional<TokenizerInfo>> ReadTokenizerInfo(
    const std::string& prefix);

// A dataset that tools:preprocess encoded with a SentencePiece model records its vocabulary:
// the model's embedding (model.vocab_size rows) must cover it. Errors: kInvalidArgument naming
// both sizes; ReadTokenizerInfo's.
[[nodiscard]] absl::Status CheckModelCoversVocabulary(int64_t model_vocab_size,
                                                      const std::string& prefix);

}  // namespace keel::tools::recipe

#endif  // KEEL_TOOLS_RECIPE_TOKENIZER_INFO_H_
