#include "tools/recipe/tokenizer_info.h"

#include "absl/strings/str_cat.h"
#include "base/enum.h"
#include "base/files.h"
#include "base/json.h"
#include "base/status.h"

namespace keel::tools::recipe {
namespace {

constexpr base::EnumSpelling<TokenizerType> kTokenizerTypes[] = {
    {TokenizerType::kBytes, "bytes"},
    {TokenizerType::kSentencePiece, "sentencepiece"},
    {TokenizerType::kHuggingFace, "huggingface"}};

}  // namespace

std::string TokenizerInfoPath(const std::string& prefix) { return prefix + ".tokenizer.json"; }

absl::Status WriteTokenizerInfo(const std::string& prefix, const TokenizerInfo& info) {
  base::Json json = {{"tokenizer_model", info.tokenizer_model},
                     {"vocab_size", info.vocab_size},
                     {"eos_id", info.eos_id},
                     {"append_eod", info.append_eod}};
  if (info.tokenizer_type != TokenizerType::kUnknown) {
    json["tokenizer_type"] = std::string(base::EnumName(kTokenizerTypes, info.tokenizer_type));
  }
  return base::WriteFileAtomically(TokenizerInfoPath(prefix), json.dump(1) + "\n");
}

absl::StatusOr<std::optional<TokenizerInfo>> ReadTokenizerInfo(const std::string& prefix) {
  const std::string path = TokenizerInfoPath(prefix);
  if (!base::PathExists(path)) return std::nullopt;
  absl::StatusOr<base::Json> json = base::ReadJsonFile(path);
  if (!json.ok()) return absl::DataLossError(json.status().message());
  TokenizerInfo info;
  std::string type;
  try {
    info.tokenizer_model = json->at("tokenizer_model").get<std::string>();
    info.vocab_size = json->at("vocab_size").get<int64_t>();
    info.eos_id = json->at("eos_id").get<int64_t>();
    info.append_eod = json->at("append_eod").get<bool>();
    if (json->contains("tokenizer_type")) type = json->at("tokenizer_type").get<std::string>();
  } catch (const base::Json::exception& e) {
    return absl::DataLossError(absl::StrCat(path, ": not a tokenizer record: ", e.what()));
  }
  if (info.vocab_size <= 0) {
    return absl::DataLossError(
        absl::StrCat(path, ": vocab_size (", info.vocab_size, ") must be > 0"));
  }
  std::string error;
  if (!type.empty() && !base::ParseEnum(kTokenizerTypes, type, &info.tokenizer_type, &error)) {
    return absl::DataLossError(absl::StrCat(path, ": tokenizer_type ", error));
  }
  return info;
}

}  // namespace keel::tools::recipe
