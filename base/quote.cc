#include "base/quote.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace keel::base {
namespace {

constexpr size_t kMaxQuoted = 200;

}  // namespace

std::string Excerpt(const nlohmann::json& value) {
  std::string text =
      value.dump(-1, ' ', /*ensure_ascii=*/true, nlohmann::json::error_handler_t::replace);
  if (text.size() > kMaxQuoted) text = absl::StrCat(text.substr(0, kMaxQuoted), "...");
  return text;
}

std::string Quote(absl::string_view text) { return Excerpt(nlohmann::json(std::string(text))); }

std::string Printable(absl::string_view bytes) {
  std::string out;
  for (const char c : bytes) {
    const auto b = static_cast<unsigned char>(c);
    if (b >= 0x20 && b < 0x7f && c != '\\') {
      out.push_back(c);
    } else {
      absl::StrAppend(&out, "\\x", absl::Hex(b, absl::kZeroPad2));
    }
  }
  return out;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace keel::base
