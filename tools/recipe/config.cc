#include "tools/recipe/config.h"

#include <algorithm>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/files.h"
#include "base/quote.h"
#include "base/status.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"

namespace keel::tools::recipe {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

// Collects the text-format parser's errors with their positions.
class Errors : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    // The message may quote the file's bytes (a token the parser did not expect).
    lines_.push_back(
        absl::StrCat("line ", line + 1, ", column ", column + 1, ": ", base::Printable(message)));
  }
  std::string ToString() const { return absl::StrJoin(lines_, "; "); }

 private:
  std::vector<std::string> lines_;
};

std::string FieldNames(const Descriptor& descriptor) {
  std::vector<std::string> names;
  for (int i = 0; i < descriptor.field_count(); ++i) names.push_back(descriptor.field(i)->name());
  return absl::StrJoin(names, ", ");
}

// `value` in text format for `field`: strings and enums may be written without quotes.
std::string Quoted(const FieldDescriptor& field, absl::string_view value) {
  if (field.cpp_type() != FieldDescriptor::CPPTYPE_STRING ||
      (value.size() >= 2 && value.front() == '"' && value.back() == '"')) {
    return std::string(value);
  }
  std::string quoted = "\"";
  for (char c : value) {
    if (c == '"' || c == '\\') quoted.push_back('\\');
    quoted.push_back(c);
  }
  return quoted + "\"";
}

}  // namespace

absl::Status ApplyOverride(const std::string& assignment, TrainConfig& config) {
  const size_t equals = assignment.find('=');
  if (equals == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("--set \"", assignment, "\" must be section.field=value"));
  }
  const std::string path = assignment.substr(0, equals);
  const std::string value = assignment.substr(equals + 1);
  Message* message = &config;
  const FieldDescriptor* field = nullptr;
  const std::vector<std::string> parts = absl::StrSplit(path, '.');
  for (size_t i = 0; i < parts.size(); ++i) {
    const Descriptor& descriptor = *message->GetDescriptor();
    field = descriptor.FindFieldByName(parts[i]);
    if (field == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("--set ", assignment, ": no field \"", parts[i], "\" in ",
                       i == 0 ? "the config" : absl::StrCat("section ", parts[i - 1]),
                       "; fields: ", FieldNames(descriptor)));
    }
    const bool last = i + 1 == parts.size();
    if (!last) {
      if (field->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE || field->is_repeated()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--set ", assignment, ": ", parts[i], " is not a section"));
      }
      message = message->GetReflection()->MutableMessage(message, field);
    } else if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--set ", assignment, ": ", parts[i],
          " is a section; set one of its fields: ", FieldNames(*field->message_type())));
    }
  }
  std::vector<std::string> values = {value};
  if (field->is_repeated()) {
    message->GetReflection()->ClearField(message, field);
    values = absl::StrSplit(value, ',', absl::SkipEmpty());
  }
  for (const std::string& item : values) {
    if (!google::protobuf::TextFormat::ParseFieldValueFromString(Quoted(*field, item), field,
                                                                 message)) {
      return absl::InvalidArgumentError(absl::StrCat("--set ", assignment, ": \"", item,
                                                     "\" is not a valid ", field->type_name(),
                                                     " for ", path));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<TrainConfig> LoadTrainConfig(const std::string& path,
                                            const std::vector<std::string>& overrides,
                                            const TrainConfig& base) {
  absl::StatusOr<std::string> text = base::ReadFile(path);
  KEEL_RETURN_IF_ERROR(base::Annotate(text.status(), "reading the config"));
  TrainConfig file;
  google::protobuf::TextFormat::Parser parser;
  Errors errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(*text, &file)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", errors.ToString()));
  }
  TrainConfig config = base;
  // The file's list replaces the base's (MergeFrom would append to it).
  if (file.step_scheduler().preemption_signal_size() > 0) {
    config.mutable_step_scheduler()->clear_preemption_signal();
  }
  config.MergeFrom(file);
  for (const std::string& assignment : overrides) {
    KEEL_RETURN_IF_ERROR(ApplyOverride(assignment, config));
  }
  return config;
}

namespace internal {

bool FieldCopier::Derived(const char* name) const {
  return std::find(derived_.begin(), derived_.end(), name) != derived_.end();
}

const FieldDescriptor* FieldCopier::Find(const char* name, CppType type) {
  if (Derived(name)) return nullptr;
  const FieldDescriptor* field = section_.GetDescriptor()->FindFieldByName(name);
  if (field == nullptr || field->cpp_type() != type) {
    if (status_.ok()) {
      status_ = absl::InternalError(
          absl::StrCat("config schema: ", section_.GetDescriptor()->full_name(), " has no ",
                       FieldDescriptor::CppTypeName(type), " field \"", name, "\""));
    }
    return nullptr;
  }
  return field;
}

bool FieldCopier::Present(const char* name) {
  const FieldDescriptor* field = section_.GetDescriptor()->FindFieldByName(name);
  if (field == nullptr) {
    if (status_.ok()) {
      status_ =
          absl::InternalError(absl::StrCat("config schema: ", section_.GetDescriptor()->full_name(),
                                           " has no field \"", name, "\""));
    }
    return false;
  }
  const auto& reflection = *section_.GetReflection();
  return field->is_repeated() ? reflection.FieldSize(section_, field) > 0
                              : reflection.HasField(section_, field);
}

template <typename T>
bool FieldCopier::Scalar(const char* name, CppType type, T& out) {
  const FieldDescriptor* field = Find(name, type);
  if (field == nullptr || field->is_repeated()) return false;
  const auto& reflection = *section_.GetReflection();
  if (!reflection.HasField(section_, field)) return false;
  if constexpr (std::is_same_v<T, int64_t>) {
    out = reflection.GetInt64(section_, field);
  } else if constexpr (std::is_same_v<T, double>) {
    out = reflection.GetDouble(section_, field);
  } else if constexpr (std::is_same_v<T, bool>) {
    out = reflection.GetBool(section_, field);
  } else {
    out = reflection.GetString(section_, field);
  }
  return true;
}

template bool FieldCopier::Scalar(const char*, CppType, int64_t&);
template bool FieldCopier::Scalar(const char*, CppType, double&);
template bool FieldCopier::Scalar(const char*, CppType, bool&);
template bool FieldCopier::Scalar(const char*, CppType, std::string&);

void FieldCopier::operator()(const char* name, std::vector<std::string>& out) {
  if (Derived(name)) return;
  const FieldDescriptor* field = Find(name, CppType::CPPTYPE_STRING);
  if (field == nullptr || !field->is_repeated()) return;
  const auto& reflection = *section_.GetReflection();
  if (reflection.FieldSize(section_, field) == 0) return;  // unset: the default stays
  out.clear();
  for (int i = 0; i < reflection.FieldSize(section_, field); ++i) {
    out.push_back(reflection.GetRepeatedString(section_, field, i));
  }
}

void FieldCopier::Fail(const char* name, const std::string& error) {
  if (!status_.ok()) return;
  // The section's name in the config ("lr_scheduler"), else its message name.
  std::string section = section_.GetDescriptor()->name();
  const Descriptor& config = *TrainConfig::descriptor();
  for (int i = 0; i < config.field_count(); ++i) {
    if (config.field(i)->message_type() == section_.GetDescriptor())
      section = config.field(i)->name();
  }
  status_ = absl::InvalidArgumentError(absl::StrCat(section, ".", name, ": ", error));
}

}  // namespace internal
}  // namespace keel::tools::recipe
