// Names, values and shapes from files, in error messages: as JSON text (quotes, escapes), ASCII
// only and cut after 200 characters, so that a hostile or broken file cannot flood or garble the
// terminal (a header of thousands of keys, newlines or escape codes in a name).
#ifndef KEEL_BASE_QUOTE_H_
#define KEEL_BASE_QUOTE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace keel::base {

// `value` as JSON text, ASCII only, cut after 200 characters ("..." then).
std::string Excerpt(const nlohmann::json& value);

// `text` as a JSON string, as Excerpt: "model.embed_tokens.weight" with its quotes.
std::string Quote(absl::string_view text);

// `bytes` as printable ASCII, every other byte and the backslash as \xNN: for text a message
// embeds as it is (a parser's message about a file's bytes, a magic number).
std::string Printable(absl::string_view bytes);

// A tensor's shape as messages print it: "[2, 3]".
std::string ShapeString(const std::vector<int64_t>& shape);

}  // namespace keel::base

#endif  // KEEL_BASE_QUOTE_H_
