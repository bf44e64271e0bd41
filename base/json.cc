#include "base/json.h"

#include <cmath>
#include <limits>

#include "base/files.h"
#include "base/quote.h"
#include "base/status.h"

namespace keel::base {

absl::StatusOr<Json> ParseJson(absl::string_view text) {
  // Containers deeper than the limit are dropped as they open (so the parse stays linear and
  // nothing deep is built), then the whole text is refused.
  bool too_deep = false;
  const auto keep = [&too_deep](int depth, Json::parse_event_t event, Json& /*value*/) {
    const bool opens =
        event == Json::parse_event_t::object_start || event == Json::parse_event_t::array_start;
    if (opens && depth >= kMaxJsonDepth) too_deep = true;
    return !too_deep;
  };
  // nlohmann reports syntax errors (parse_error) and numbers out of range (out_of_range) only
  // as exceptions; they stop here.
  try {
    Json json = Json::parse(text.begin(), text.end(), keep);
    if (too_deep) {
      return absl::InvalidArgumentError(absl::StrCat(
          "invalid JSON: arrays and objects nest deeper than ", kMaxJsonDepth, " levels"));
    }
    return json;
  } catch (const Json::exception& error) {
    return absl::InvalidArgumentError(absl::StrCat("invalid JSON: ", error.what()));
  }
}

absl::StatusOr<Json> ReadJsonFile(const std::string& path) {
  KEEL_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  absl::StatusOr<Json> json = ParseJson(text);
  if (!json.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", json.status().message()));
  }
  return json;
}

absl::Status WriteJsonFile(const std::string& path, const Json& json) {
  return WriteFile(path, absl::StrCat(json.dump(1), "\n"));
}

Json DoubleToJson(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  return value;
}

absl::Status FromJson(const Json& json, absl::string_view what, double& out) {
  if (json.is_number()) {
    out = json.get<double>();
    return absl::OkStatus();
  }
  if (json.is_string()) {
    const std::string& text = json.get_ref<const std::string&>();
    if (text == "nan")
      out = std::numeric_limits<double>::quiet_NaN();
    else if (text == "inf")
      out = std::numeric_limits<double>::infinity();
    else if (text == "-inf")
      out = -std::numeric_limits<double>::infinity();
    else
      return absl::InvalidArgumentError(
          absl::StrCat(what, " must be a number, got \"", text, "\""));
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(what, " must be a number, got ", Excerpt(json)));
}

absl::Status FromJson(const Json& json, absl::string_view what, int64_t& out) {
  if (json.is_number_unsigned() &&
      json.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is ", json.get<uint64_t>(), ", past the largest integer, 2^63 - 1"));
  }
  if (json.is_number_integer()) {
    out = json.get<int64_t>();
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(what, " must be an integer, got ", Excerpt(json)));
}

absl::Status FromJson(const Json& json, absl::string_view what, bool& out) {
  if (json.is_boolean()) {
    out = json.get<bool>();
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat(what, " must be true or false, got ", Excerpt(json)));
}

absl::Status FromJson(const Json& json, absl::string_view what, std::string& out) {
  if (json.is_string()) {
    out = json.get<std::string>();
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(what, " must be a string, got ", Excerpt(json)));
}

}  // namespace keel::base
