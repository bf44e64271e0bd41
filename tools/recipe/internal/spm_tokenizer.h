// A SentencePiece model behind a header free of SentencePiece and Abseil: SentencePiece's
// header declares absl::string_view as std::string_view, which Debian's Abseil defines as a
// class of its own, so only spm_tokenizer.cc includes it.
#ifndef KEEL_TOOLS_RECIPE_INTERNAL_SPM_TOKENIZER_H_
#define KEEL_TOOLS_RECIPE_INTERNAL_SPM_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace keel::tools::recipe::internal {

class SpmTokenizer {
 public:
  // The model in `path`, or nullptr with the reason in `error`.
  static std::unique_ptr<SpmTokenizer> Load(const std::string& path, std::string& error);
  ~SpmTokenizer();

  // Appends the ids SentencePiece gives `text` (UTF-8) to `ids`; false with the reason in
  // `error` on failure. Safe to call from several threads at once.
  bool Encode(std::string_view text, std::vector<int64_t>& ids, std::string& error) const;

  // Pieces in the vocabulary (ids 0 to vocab_size - 1).
  int64_t vocab_size() const;
  // The end-of-sentence id, or -1 when the model has none.
  int64_t eos_id() const;

 private:
  class Impl;
  explicit SpmTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace keel::tools::recipe::internal

#endif  // KEEL_TOOLS_RECIPE_INTERNAL_SPM_TOKENIZER_H_
