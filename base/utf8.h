// UTF-8 validation (RFC 3629): no overlong forms, UTF-16 surrogates or code points past
// U+10FFFF.
#ifndef KEEL_BASE_UTF8_H_
#define KEEL_BASE_UTF8_H_

#include <cstddef>
#include <optional>

#include "absl/strings/string_view.h"

namespace keel::base {

// The offset of the first byte of `text` that does not start a valid UTF-8 character (or
// starts one cut short by the end), or nullopt when all of `text` is valid UTF-8.
std::optional<size_t> FirstInvalidUtf8(absl::string_view text);

}  // namespace keel::base

#endif  // KEEL_BASE_UTF8_H_
