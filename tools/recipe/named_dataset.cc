#include "tools/recipe/named_dataset.h"

#include <filesystem>
#include <optional>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "base/status.h"
#include "tools/recipe/tokenizer_info.h"

namespace keel::tools::recipe {
namespace {

// The files of a Hugging Face tokenizer, one of which every model directory on the Hub holds.
constexpr const char* kTokenizerFiles[] = {"tokenizer.json", "tokenizer.model",
                                           "tokenizer_config.json", "vocab.json"};

// Whether `a` and `b` hold the same bytes; nullopt when either cannot be read.
std::optional<bool> SameBytes(const std::string& a, const std::string& b) {
  absl::StatusOr<std::string> left = base::ReadFile(a);
  absl::StatusOr<std::string> right = base::ReadFile(b);
  if (!left.ok() || !right.ok()) return std::nullopt;
  return *left == *right;
}

bool SamePath(const std::string& a, const std::string& b) {
  std::error_code error;
  return std::filesystem::equivalent(a, b, error) && !error;
}

bool HoldsTokenizer(const std::string& directory) {
  for (const char* file : kTokenizerFiles) {
    if (base::PathExists(base::JoinPath(directory, file))) return true;
  }
  return false;
}

// Why the ids of `info` are not those of the Hugging Face tokenizer in `directory`, or "" when
// they are or cannot be compared here (a directory without a tokenizer: a model Keel trained
// from scratch and exported, on bytes or SentencePiece ids).
std::string TokenizerMismatch(const TokenizerInfo& info, const std::string& directory) {
  if (!HoldsTokenizer(directory)) return "";
  switch (info.tokenizer_type) {
    case TokenizerType::kBytes:
      return "byte values, not token ids";
    case TokenizerType::kHuggingFace: {
      if (SamePath(info.tokenizer_model, directory)) return "";
      const std::optional<bool> same =
          SameBytes(base::JoinPath(info.tokenizer_model, "tokenizer.json"),
                    base::JoinPath(directory, "tokenizer.json"));
      if (!same.has_value() || *same) return "";
      return absl::StrCat("ids of the tokenizer in ", info.tokenizer_model,
                          ", whose tokenizer.json differs from the model's");
    }
    case TokenizerType::kSentencePiece: {
      if (!base::PathExists(info.tokenizer_model)) return "";
      const std::string own = base::JoinPath(directory, "tokenizer.model");
      if (SameBytes(info.tokenizer_model, own).value_or(false)) return "";
      return absl::StrCat("ids of the SentencePiece model ", info.tokenizer_model, ", ",
                          base::PathExists(own) ? "which differs from the model's tokenizer.model"
                                                : "and the model has no tokenizer.model");
    }
    case TokenizerType::kUnknown:
      return "";
  }
  return "";
}

}  // namespace

absl::StatusOr<sampling::IndexedDataset> OpenNamedDataset(absl::string_view field,
                                                          const std::string& prefix) {
  absl::StatusOr<sampling::IndexedDataset> dataset = sampling::IndexedDataset::Open(prefix);
  if (!absl::IsNotFound(dataset.status())) return dataset;
  return absl::InvalidArgumentError(
      absl::StrCat(field, " names \"", prefix,
                   "\", which is not an indexed dataset: ", dataset.status().message()));
}

absl::Status CheckDataFitsModel(const std::string& prefix, const ModelVocabulary& model) {
  KEEL_ASSIGN_OR_RETURN(const std::optional<TokenizerInfo> info, ReadTokenizerInfo(prefix));
  if (!info.has_value()) return absl::OkStatus();
  const std::string recorded = absl::StrCat(info->vocab_size, " ids of ", info->tokenizer_model,
                                            ", recorded in ", TokenizerInfoPath(prefix));
  if (model.pretrained_path.empty()) {
    if (info->vocab_size <= model.vocab_size) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        "model.vocab_size (", model.vocab_size, ") is smaller than the vocabulary of ", prefix,
        " (", recorded, "): set model.vocab_size to at least ", info->vocab_size));
  }
  // A pretrained model's vocabulary is its config.json's: only other data can fix a mismatch.
  const std::string remedy = absl::StrCat(
      "; encode the text with the model's own tokenizer: "
      "tools/scripts/hf_tokenize.py --model=",
      model.pretrained_path);
  if (const std::string mismatch = TokenizerMismatch(*info, model.pretrained_path);
      !mismatch.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, " holds ", mismatch, " (", recorded,
                                                   "), not ids of the tokenizer of ",
                                                   model.pretrained_path, remedy));
  }
  if (info->vocab_size <= model.vocab_size) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "the vocabulary of ", prefix, " (", recorded, ") is larger than the model's (vocab_size ",
      model.vocab_size, " in ", base::JoinPath(model.pretrained_path, "config.json"), ")", remedy));
}

}  // namespace keel::tools::recipe
