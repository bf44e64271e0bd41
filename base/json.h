// Keel's one JSON type (nlohmann's insertion-ordered JSON) and the typed reading and writing
// that golden files, the parity tool and configs share. Non-finite doubles are the strings
// "nan", "inf" and "-inf", as in the golden files.
//
//   KEEL_ASSIGN_OR_RETURN(keel::base::Json cases, keel::base::ReadJsonFile(path));
//   ParamSchedulerOptions options;
//   KEEL_RETURN_IF_ERROR(keel::base::ReadJsonFields(cases["inputs"], options));
//   keel::base::Json out = keel::base::WriteJsonFields(options);
#ifndef KEEL_BASE_JSON_H_
#define KEEL_BASE_JSON_H_

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/quote.h"
#include "nlohmann/json.hpp"

namespace keel::base {

using Json = nlohmann::ordered_json;

// Arrays and objects nest at most this deep in what ParseJson accepts (Python's json stops near
// its recursion limit, 1000, too); deeper text would overflow the stack of whatever walks it.
inline constexpr int kMaxJsonDepth = 1000;

// Parses JSON text. Errors: kInvalidArgument naming the byte offset of a syntax error, a number
// beyond a double's range ("1e400"; Python would read inf) or nesting deeper than kMaxJsonDepth.
[[nodiscard]] absl::StatusOr<Json> ParseJson(absl::string_view text);

// Reads and parses a JSON file. Errors: base::ErrnoCode's (kNotFound for a missing file) if it
// cannot be read; kInvalidArgument (with the path) if it is not JSON.
[[nodiscard]] absl::StatusOr<Json> ReadJsonFile(const std::string& path);

// Writes `json` to `path`, indented by 1, with a trailing newline. Errors: base::ErrnoCode's
// when the file cannot be written.
[[nodiscard]] absl::Status WriteJsonFile(const std::string& path, const Json& json);

// A double as JSON: a number, or "nan" / "inf" / "-inf".
Json DoubleToJson(double value);

// Typed reads of one JSON value; `what` names it in errors (kInvalidArgument), e.g.
// "inputs.max_lr". Doubles accept any number and the non-finite strings; integers accept
// integral numbers in int64_t's range only.
[[nodiscard]] absl::Status FromJson(const Json& json, absl::string_view what, double& out);
[[nodiscard]] absl::Status FromJson(const Json& json, absl::string_view what, int64_t& out);
[[nodiscard]] absl::Status FromJson(const Json& json, absl::string_view what, bool& out);
[[nodiscard]] absl::Status FromJson(const Json& json, absl::string_view what, std::string& out);

// An enum read from its spelling with the AbslParseFlag overload found next to the enum.
template <typename E, std::enable_if_t<std::is_enum_v<E>, int> = 0>
[[nodiscard]] absl::Status FromJson(const Json& json, absl::string_view what, E& out) {
  std::string text;
  if (absl::Status status = FromJson(json, what, text); !status.ok()) return status;
  std::string error;
  if (!AbslParseFlag(text, &out, &error)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", error));
  }
  return absl::OkStatus();
}

template <typename T>
[[nodiscard]] absl::Status FromJson(const Json& json, absl::string_view what,
                                    std::optional<T>& out);

// A JSON array, element by element ("<what>[i]" in errors).
template <typename T>
[[nodiscard]] absl::Status FromJson(const Json& json, absl::string_view what, std::vector<T>& out) {
  if (!json.is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " must be an array, got ", Excerpt(json)));
  }
  out.assign(json.size(), T{});
  for (size_t i = 0; i < json.size(); ++i) {
    absl::Status status = FromJson(json[i], absl::StrCat(what, "[", i, "]"), out[i]);
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

// JSON null is nullopt; anything else is read as T.
template <typename T>
[[nodiscard]] absl::Status FromJson(const Json& json, absl::string_view what,
                                    std::optional<T>& out) {
  if (json.is_null()) {
    out.reset();
    return absl::OkStatus();
  }
  T value{};
  if (absl::Status status = FromJson(json, what, value); !status.ok()) return status;
  out = std::move(value);
  return absl::OkStatus();
}

inline Json ToJson(double value) { return DoubleToJson(value); }
inline Json ToJson(int64_t value) { return value; }
inline Json ToJson(bool value) { return value; }
inline Json ToJson(const std::string& value) { return value; }
template <typename E, std::enable_if_t<std::is_enum_v<E>, int> = 0>
Json ToJson(E value) {
  return AbslUnparseFlag(value);
}
template <typename T>
Json ToJson(const std::optional<T>& value);
template <typename T>
Json ToJson(const std::vector<T>& values) {
  Json json = Json::array();
  for (const T& value : values) json.push_back(ToJson(value));
  return json;
}
template <typename T>
Json ToJson(const std::optional<T>& value) {
  return value.has_value() ? ToJson(*value) : Json(nullptr);
}

// Reads every field that `VisitFields(o, visitor)` names from the JSON object `json`.
// Absent keys keep their current values; keys that name no field are ignored (callers that
// must reject them check the key set). Errors: kInvalidArgument naming "<prefix><field>".
template <typename O>
[[nodiscard]] absl::Status ReadJsonFields(const Json& json, O& o, absl::string_view prefix = "") {
  if (!json.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, " must be a JSON object"));
  }
  absl::Status status;
  VisitFields(o, [&](absl::string_view name, auto& field) {
    if (!status.ok()) return;
    auto it = json.find(std::string(name));
    if (it == json.end()) return;
    status = FromJson(*it, absl::StrCat(prefix, name), field);
  });
  return status;
}

// Writes every field that `VisitFields(o, visitor)` names, in declaration order.
template <typename O>
Json WriteJsonFields(const O& o) {
  Json json = Json::object();
  VisitFields(o, [&](absl::string_view name, const auto& field) {
    json[std::string(name)] = ToJson(field);
  });
  return json;
}

}  // namespace keel::base

#endif  // KEEL_BASE_JSON_H_
