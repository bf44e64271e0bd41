#include "base/json.h"

#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

namespace keel::base {

absl::StatusOr<Json> ParseJson(absl::string_view text) {
  // nlohmann reports syntax errors only as exceptions; they stop here.
  try {
    return Json::parse(text.begin(), text.end());
  } catch (const Json::parse_error& error) {
    return absl::InvalidArgumentError(absl::StrCat("invalid JSON: ", error.what()));
  }
}

absl::StatusOr<Json> ReadJsonFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open JSON file ", path));
  std::stringstream buffer;
  buffer << in.rdbuf();
  absl::StatusOr<Json> json = ParseJson(buffer.str());
  if (!json.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", json.status().message()));
  }
  return json;
}

absl::Status WriteJsonFile(const std::string& path, const Json& json) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << json.dump(1) << "\n";
  out.close();
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write JSON file ", path));
  return absl::OkStatus();
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
  return absl::InvalidArgumentError(absl::StrCat(what, " must be a number, got ", json.dump()));
}

absl::Status FromJson(const Json& json, absl::string_view what, int64_t& out) {
  if (json.is_number_integer()) {
    out = json.get<int64_t>();
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(what, " must be an integer, got ", json.dump()));
}

absl::Status FromJson(const Json& json, absl::string_view what, bool& out) {
  if (json.is_boolean()) {
    out = json.get<bool>();
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat(what, " must be true or false, got ", json.dump()));
}

absl::Status FromJson(const Json& json, absl::string_view what, std::string& out) {
  if (json.is_string()) {
    out = json.get<std::string>();
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(what, " must be a string, got ", json.dump()));
}

}  // namespace keel::base
