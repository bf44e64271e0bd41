#include "base/utf8.h"

#include <cstdint>

namespace keel::base {

std::optional<size_t> FirstInvalidUtf8(absl::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const unsigned char lead = static_cast<unsigned char>(text[i]);
    size_t length;
    uint32_t code;
    uint32_t smallest;
    if (lead < 0x80) {
      ++i;
      continue;
    } else if ((lead & 0xe0) == 0xc0) {
      length = 2, code = lead & 0x1f, smallest = 0x80;
    } else if ((lead & 0xf0) == 0xe0) {
      length = 3, code = lead & 0x0f, smallest = 0x800;
    } else if ((lead & 0xf8) == 0xf0) {
      length = 4, code = lead & 0x07, smallest = 0x10000;
    } else {
      return i;
    }
    if (text.size() - i < length) return i;
    for (size_t k = 1; k < length; ++k) {
      const unsigned char next = static_cast<unsigned char>(text[i + k]);
      if ((next & 0xc0) != 0x80) return i;
      code = (code << 6) | (next & 0x3f);
    }
    if (code < smallest || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff)) return i;
    i += length;
  }
  return std::nullopt;
}

}  // namespace keel::base
