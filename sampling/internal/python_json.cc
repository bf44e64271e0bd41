#include "sampling/internal/python_json.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace keel::sampling::internal {
namespace {

void AppendEscapedUnit(uint32_t unit, std::string& out) {
  absl::StrAppend(&out, absl::StrFormat("\\u%04x", unit));
}

// The code point of the UTF-8 character at text[i] and its length in bytes; {0, 0} when the
// bytes there are not a valid character.
std::pair<uint32_t, size_t> DecodeUtf8(const std::string& text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(text[k]); };
  const uint8_t lead = byte(i);
  size_t length = lead >= 0xf0 ? 4 : lead >= 0xe0 ? 3 : lead >= 0xc0 ? 2 : 0;
  if (length == 0 || lead >= 0xf8 || i + length > text.size()) return {0, 0};
  uint32_t code = lead & (0x7f >> length);
  for (size_t k = 1; k < length; ++k) {
    if ((byte(i + k) & 0xc0) != 0x80) return {0, 0};
    code = (code << 6) | (byte(i + k) & 0x3f);
  }
  const uint32_t smallest[] = {0, 0, 0x80, 0x800, 0x10000};
  if (code < smallest[length] || code > 0x10ffff || (code >= 0xd800 && code < 0xe000)) {
    return {0, 0};
  }
  return {code, length};
}

void AppendString(const std::string& text, std::string& out) {
  out += '"';
  for (size_t i = 0; i < text.size();) {
    const uint8_t c = static_cast<uint8_t>(text[i]);
    if (c < 0x80) {
      switch (c) {
        case '"':
          out += "\\\"";
          break;
        case '\\':
          out += "\\\\";
          break;
        case '\n':
          out += "\\n";
          break;
        case '\r':
          out += "\\r";
          break;
        case '\t':
          out += "\\t";
          break;
        case '\b':
          out += "\\b";
          break;
        case '\f':
          out += "\\f";
          break;
        default:
          if (c < 0x20) {
            AppendEscapedUnit(c, out);
          } else {
            out += static_cast<char>(c);
          }
      }
      ++i;
      continue;
    }
    const auto [code, length] = DecodeUtf8(text, i);
    if (length == 0) {  // surrogateescape
      AppendEscapedUnit(0xdc00 + c, out);
      ++i;
    } else if (code >= 0x10000) {
      AppendEscapedUnit(0xd800 + ((code - 0x10000) >> 10), out);
      AppendEscapedUnit(0xdc00 + ((code - 0x10000) & 0x3ff), out);
      i += length;
    } else {
      AppendEscapedUnit(code, out);
      i += length;
    }
  }
  out += '"';
}

void Append(const base::Json& value, int level, std::string& out) {
  const std::string inner(4 * (level + 1), ' ');
  const bool object = value.is_object();
  if (object || value.is_array()) {
    if (value.empty()) {
      out += object ? "{}" : "[]";
      return;
    }
    out += object ? "{\n" : "[\n";
    bool first = true;
    for (auto it = value.begin(); it != value.end(); ++it) {
      if (!first) out += ",\n";
      first = false;
      out += inner;
      if (object) {
        AppendString(it.key(), out);
        out += ": ";
      }
      Append(it.value(), level + 1, out);
    }
    out += "\n" + std::string(4 * level, ' ') + (object ? "}" : "]");
  } else if (value.is_string()) {
    AppendString(value.get<std::string>(), out);
  } else if (value.is_number_float()) {
    out += PythonFloatRepr(value.get<double>());
  } else {
    out += value.dump();  // integers, true, false, null
  }
}

}  // namespace

std::string PythonFloatRepr(double x) {
  if (std::isnan(x)) return "NaN";
  if (std::isinf(x)) return x > 0 ? "Infinity" : "-Infinity";
  // The shortest "%.*e" that reads back as x: its digits and decimal exponent.
  char buffer[40];
  for (int precision = 0; precision < 17; ++precision) {
    std::snprintf(buffer, sizeof(buffer), "%.*e", precision, x);
    if (std::strtod(buffer, nullptr) == x) break;
  }
  const std::string text = buffer;
  const size_t e = text.find('e');
  std::string digits;
  for (size_t i = 0; i < e; ++i) {
    if (text[i] >= '0' && text[i] <= '9') digits += text[i];
  }
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  int exponent = 0;
  if (!absl::SimpleAtoi(text.substr(e + 1), &exponent)) return text;
  const std::string sign = std::signbit(x) ? "-" : "";
  // The value is 0.<digits> x 10^point.
  const int point = exponent + 1;
  if (point <= -4 || point > 16) {
    std::string mantissa = digits.substr(0, 1);
    if (digits.size() > 1) mantissa += "." + digits.substr(1);
    return absl::StrCat(sign, mantissa,
                        absl::StrFormat("e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent)));
  }
  if (point <= 0) return absl::StrCat(sign, "0.", std::string(-point, '0'), digits);
  if (static_cast<size_t>(point) >= digits.size()) {
    return absl::StrCat(sign, digits, std::string(point - digits.size(), '0'), ".0");
  }
  return absl::StrCat(sign, digits.substr(0, point), ".", digits.substr(point));
}

std::string PythonJsonDumps(const base::Json& value) {
  std::string out;
  Append(value, 0, out);
  return out;
}

}  // namespace keel::sampling::internal
