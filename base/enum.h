// Spelling tables for string-valued options: one table per enum gives both directions,
// and the Abseil flag hooks (AbslParseFlag / AbslUnparseFlag) every reader uses.
//
//   enum class Color { kRed, kBlue };
//   inline constexpr keel::base::EnumSpelling<Color> kColorSpellings[] = {
//       {Color::kRed, "red"}, {Color::kBlue, "blue"}};
//   bool AbslParseFlag(absl::string_view text, Color* out, std::string* error) {
//     return keel::base::ParseEnum(kColorSpellings, text, out, error);
//   }
#ifndef KEEL_BASE_ENUM_H_
#define KEEL_BASE_ENUM_H_

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/quote.h"

namespace keel::base {

template <typename E>
struct EnumSpelling {
  E value;
  absl::string_view name;
};

// Sets `*out` to the value spelled exactly `text`. Otherwise returns false with `*error`
// quoting `text` (base::Quote: escaped, cut after 200 characters) and listing every accepted
// spelling.
template <typename E, size_t N>
bool ParseEnum(const EnumSpelling<E> (&table)[N], absl::string_view text, E* out,
               std::string* error) {
  for (const EnumSpelling<E>& entry : table) {
    if (entry.name == text) {
      *out = entry.value;
      return true;
    }
  }
  std::string allowed;
  for (const EnumSpelling<E>& entry : table) {
    absl::StrAppend(&allowed, allowed.empty() ? "" : ", ", "\"", entry.name, "\"");
  }
  *error = absl::StrCat(Quote(text), " is not one of ", allowed);
  return false;
}

// The spelling of `value`; every enumerator must appear in `table`.
template <typename E, size_t N>
absl::string_view EnumName(const EnumSpelling<E> (&table)[N], E value) {
  for (const EnumSpelling<E>& entry : table) {
    if (entry.value == value) return entry.name;
  }
  return "<unknown>";
}

}  // namespace keel::base

#endif  // KEEL_BASE_ENUM_H_
