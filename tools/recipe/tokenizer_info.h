// What a dataset's writer records beside it, "<prefix>.tokenizer.json", for the trainer and
// tools:eval: the tokenizer its ids come from. tools:preprocess writes it for the byte corpora
// and for SentencePiece, tools/scripts/hf_tokenize.py for a Hugging Face tokenizer.
#ifndef KEEL_TOOLS_RECIPE_TOKENIZER_INFO_H_
#define KEEL_TOOLS_RECIPE_TOKENIZER_INFO_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace keel::tools::recipe {

// What made the ids: kUnknown for a record written before the type was recorded.
enum class TokenizerType { kUnknown, kBytes, kSentencePiece, kHuggingFace };

struct TokenizerInfo {
  // The tokenizer: "bytes", a SentencePiece model file or a Hugging Face model directory.
  std::string tokenizer_model;
  // Its vocabulary: every token id is below this.
  int64_t vocab_size = 0;
  // Its end-of-sentence id (-1 if it has none), appended to each document with append_eod.
  int64_t eos_id = -1;
  bool append_eod = false;
  TokenizerType tokenizer_type = TokenizerType::kUnknown;
};

// "<prefix>.tokenizer.json".
std::string TokenizerInfoPath(const std::string& prefix);

// Writes `info` to TokenizerInfoPath(prefix) (to a temporary file, then renamed).
// Errors: base::ErrnoCode's, naming the file.
[[nodiscard]] absl::Status WriteTokenizerInfo(const std::string& prefix, const TokenizerInfo& info);

// The info of the dataset at `prefix`, or nullopt when it has none (a dataset Megatron or an
// older Keel wrote). Errors: kDataLoss naming the file when it is not such a record.
[[nodiscard]] absl::StatusOr<std::optional<TokenizerInfo>> ReadTokenizerInfo(
    const std::string& prefix);

}  // namespace keel::tools::recipe

#endif  // KEEL_TOOLS_RECIPE_TOKENIZER_INFO_H_
