#include "models/model_options.h"

#include "base/enum.h"

namespace keel::models {
namespace {

constexpr base::EnumSpelling<ModelFamily> kFamilies[] = {{ModelFamily::kGpt, "gpt"},
                                                         {ModelFamily::kLlama, "llama"},
                                                         {ModelFamily::kQwen2, "qwen2"},
                                                         {ModelFamily::kQwen3, "qwen3"},
                                                         {ModelFamily::kMistral, "mistral"}};

}  // namespace

bool AbslParseFlag(absl::string_view text, ModelFamily* out, std::string* error) {
  return base::ParseEnum(kFamilies, text, out, error);
}

std::string AbslUnparseFlag(ModelFamily family) {
  return std::string(base::EnumName(kFamilies, family));
}

int64_t PaddedVocabSize(const ModelOptions& options, int64_t tp_size) {
  const int64_t multiple = options.make_vocab_size_divisible_by * tp_size;
  return (options.vocab_size + multiple - 1) / multiple * multiple;
}

int64_t CrossEntropyChunkLen(const ModelOptions& options) {
  if (options.cross_entropy_chunk_len.has_value()) return *options.cross_entropy_chunk_len;
  return PaddedVocabSize(options, 1) >= kChunkedVocabSize ? kDefaultCrossEntropyChunkLen : 0;
}

int64_t HeadDim(const ModelOptions& options) {
  return options.kv_channels > 0 ? options.kv_channels
                                 : options.hidden_size / options.num_attention_heads;
}

int64_t KvHeads(const ModelOptions& options) {
  return options.num_query_groups > 0 ? options.num_query_groups : options.num_attention_heads;
}

}  // namespace keel::models
