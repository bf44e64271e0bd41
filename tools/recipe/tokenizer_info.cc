#include "tools/recipe/tokenizer_info.h"

#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "base/json.h"
#include "base/status.h"

namespace keel::tools::recipe {

std::string TokenizerInfoPath(const std::string& prefix) { return prefix + ".tokenizer.json"; }

absl::Status WriteTokenizerInfo(const std::string& prefix, const TokenizerInfo& info) {
  const base::Json json = {{"tokenizer_model", info.tokenizer_model},
                           {"vocab_size", info.vocab_size},
                           {"eos_id", info.eos_id},
                           {"append_eod", info.append_eod}};
  return base::WriteFileAtomically(TokenizerInfoPath(prefix), json.dump(1) + "\n");
}

absl::StatusOr<std::optional<TokenizerInfo>> ReadTokenizerInfo(const std::string& prefix) {
  const std::string path = TokenizerInfoPath(prefix);
  if (!base::PathExists(path)) return std::nullopt;
  absl::StatusOr<base::Json> json = base::ReadJsonFile(path);
  if (!json.ok()) return absl::DataLossError(json.status().message());
  TokenizerInfo info;
  try {
    info.tokenizer_model = json->at("tokenizer_model").get<std::string>();
    info.vocab_size = json->at("vocab_size").get<int64_t>();
    info.eos_id = json->at("eos_id").get<int64_t>();
    info.append_eod = json->at("append_eod").get<bool>();
  } catch (const base::Json::exception& e) {
    return absl::DataLossError(absl::StrCat(path, ": not a tokenizer record: ", e.what()));
  }
  if (info.vocab_size <= 0) {
    return absl::DataLossError(
        absl::StrCat(path, ": vocab_size (", info.vocab_size, ") must be > 0"));
  }
  return info;
}

absl::Status CheckModelCoversVocabulary(int64_t model_vocab_size, const std::string& prefix) {
  KEEL_ASSIGN_OR_RETURN(std::optional<TokenizerInfo> info, ReadTokenizerInfo(prefix));
  if (!info.has_value() || info->vocab_size <= model_vocab_size) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "model.vocab_size (", model_vocab_size, ") is smaller than the vocabulary of ", prefix, " (",
      info->vocab_size, " pieces of ", info->tokenizer_model, ", recorded in ",
      TokenizerInfoPath(prefix), "): set model.vocab_size to at least ", info->vocab_size));
}

}  // namespace keel::tools::recipe
