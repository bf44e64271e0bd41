// A token dataset that a user names (a configuration field or a flag), opened so that a
// missing one is an error naming the field, and checked against the model it feeds through the
// tokenizer record beside it (tokenizer_info.h).
#ifndef KEEL_TOOLS_RECIPE_NAMED_DATASET_H_
#define KEEL_TOOLS_RECIPE_NAMED_DATASET_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "sampling/indexed_dataset.h"

namespace keel::tools::recipe {

// sampling::IndexedDataset::Open(prefix); a missing dataset is kInvalidArgument:
// "<field> names "<prefix>", which is not an indexed dataset: <why>". Other errors: Open's.
[[nodiscard]] absl::StatusOr<sampling::IndexedDataset> OpenNamedDataset(absl::string_view field,
                                                                        const std::string& prefix);

// The model a dataset feeds: its embedding's rows, and the Hugging Face directory its
// vocabulary comes from (model.pretrained_path, or tools:eval's --model; empty: none).
struct ModelVocabulary {
  int64_t vocab_size = 0;
  std::string pretrained_path;
};

// Checks the record beside the dataset at `prefix` (none: nothing to check) against `model`:
// the model's embedding covers the recorded vocabulary, and a Hugging Face model is fed ids of
// its own tokenizer (the record names that directory or one whose tokenizer.json is the same
// bytes, or a SentencePiece file equal to its tokenizer.model), never bytes or another
// tokenizer's. What cannot be compared passes: a directory without tokenizer files (a model
// Keel trained from scratch and exported), a recorded file that is not on this machine.
// Errors: kInvalidArgument naming both tokenizers or sizes and the way to make matching data;
// ReadTokenizerInfo's.
[[nodiscard]] absl::Status CheckDataFitsModel(const std::string& prefix,
                                              const ModelVocabulary& model);

}  // namespace keel::tools::recipe

#endif  // KEEL_TOOLS_RECIPE_NAMED_DATASET_H_
