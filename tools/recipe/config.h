// The trainer's configuration: tools/recipe/config.proto read from protobuf text format, with
// `--set section.field=value` overrides, and copied into the Keel options structs by field
// name (each struct's VisitFields list), so no option is parsed twice.
//
//   KEEL_ASSIGN_OR_RETURN(TrainConfig config, LoadTrainConfig("tools/recipe/default.textproto",
//                                                             {"model.num_layers=2"}));
//   keel::scheduling::StepSchedulerOptions options;
//   KEEL_RETURN_IF_ERROR(CopyFields(config.step_scheduler(), options));
#ifndef KEEL_TOOLS_RECIPE_CONFIG_H_
#define KEEL_TOOLS_RECIPE_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "tools/recipe/config.pb.h"

namespace keel::tools::recipe {

// Parses `path` (text format) over `base` (a field the file sets replaces base's, a list
// included; what it leaves out keeps base's value) and applies `overrides`
// ("section.field=value", in order). Errors: kNotFound for a missing file; kInvalidArgument
// naming the file, line and column of a syntax error or unknown field, or the override and the
// fields its section has.
[[nodiscard]] absl::StatusOr<TrainConfig> LoadTrainConfig(const std::string& path,
                                                          const std::vector<std::string>& overrides,
                                                          const TrainConfig& base = TrainConfig());

// Applies one "section.field=value" (nested messages by dots; repeated fields take a
// comma-separated list). Errors: kInvalidArgument as LoadTrainConfig.
[[nodiscard]] absl::Status ApplyOverride(const std::string& assignment, TrainConfig& config);

namespace internal {

// Copies set fields of a message into an options struct by name (see CopyFields).
class FieldCopier {
 public:
  FieldCopier(const google::protobuf::Message& section, std::vector<std::string> derived)
      : section_(section), derived_(std::move(derived)) {}

  void operator()(const char* name, int64_t& out) { Scalar(name, CppType::CPPTYPE_INT64, out); }
  void operator()(const char* name, double& out) { Scalar(name, CppType::CPPTYPE_DOUBLE, out); }
  void operator()(const char* name, bool& out) { Scalar(name, CppType::CPPTYPE_BOOL, out); }
  void operator()(const char* name, std::string& out) {
    Scalar(name, CppType::CPPTYPE_STRING, out);
  }
  template <typename E, std::enable_if_t<std::is_enum_v<E>, int> = 0>
  void operator()(const char* name, E& out) {
    if (Derived(name)) return;
    std::string text;
    if (!Scalar(name, CppType::CPPTYPE_STRING, text)) return;
    std::string error;
    if (!AbslParseFlag(text, &out, &error)) Fail(name, error);
  }
  template <typename T>
  void operator()(const char* name, std::optional<T>& out) {
    if (Derived(name)) return;
    T value = out.value_or(T{});
    if (Present(name)) {
      (*this)(name, value);
      out = value;
    }
  }
  void operator()(const char* name, std::vector<std::string>& out);

  const absl::Status& status() const { return status_; }

 private:
  using CppType = google::protobuf::FieldDescriptor::CppType;

  // The field `name`, checked to be of `type`; nullptr (and an error) if the schema lacks it.
  const google::protobuf::FieldDescriptor* Find(const char* name, CppType type);
  bool Present(const char* name);
  bool Derived(const char* name) const;
  template <typename T>
  bool Scalar(const char* name, CppType type, T& out);
  void Fail(const char* name, const std::string& error);

  const google::protobuf::Message& section_;
  std::vector<std::string> derived_;
  absl::Status status_;
};

}  // namespace internal

// Copies every field of `options` that `section` sets, by name; unset fields keep their
// defaults (the reference's). `derived` names the fields the caller sets from elsewhere, which
// the schema leaves out. Errors: kInvalidArgument naming "<section>.<field>" for a bad enum
// spelling; kInternal when the schema lacks another field of `options` or types differ.
template <typename O>
[[nodiscard]] absl::Status CopyFields(const google::protobuf::Message& section, O& options,
                                      std::vector<std::string> derived = {}) {
  internal::FieldCopier copier(section, std::move(derived));
  VisitFields(options, copier);
  return copier.status();
}

}  // namespace keel::tools::recipe

#endif  // KEEL_TOOLS_RECIPE_CONFIG_H_
