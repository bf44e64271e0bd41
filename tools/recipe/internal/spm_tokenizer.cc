#include "tools/recipe/internal/spm_tokenizer.h"

#include <utility>

#include "sentencepiece_processor.h"

namespace keel::tools::recipe::internal {

class SpmTokenizer::Impl {
 public:
  sentencepiece::SentencePieceProcessor processor;
};

SpmTokenizer::SpmTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SpmTokenizer::~SpmTokenizer() = default;

std::unique_ptr<SpmTokenizer> SpmTokenizer::Load(const std::string& path, std::string& error) {
  auto impl = std::make_unique<Impl>();
  const sentencepiece::util::Status status = impl->processor.Load(path);
  if (!status.ok()) {
    error = status.ToString();
    return nullptr;
  }
  return std::unique_ptr<SpmTokenizer>(new SpmTokenizer(std::move(impl)));
}

bool SpmTokenizer::Encode(std::string_view text, std::vector<int64_t>& ids,
                          std::string& error) const {
  std::vector<int> encoded;
  const sentencepiece::util::Status status = impl_->processor.Encode(text, &encoded);
  if (!status.ok()) {
    error = status.ToString();
    return false;
  }
  ids.insert(ids.end(), encoded.begin(), encoded.end());
  return true;
}

int64_t SpmTokenizer::vocab_size() const { return impl_->processor.GetPieceSize(); }
int64_t SpmTokenizer::eos_id() const { return impl_->processor.eos_id(); }

}  // namespace keel::tools::recipe::internal
