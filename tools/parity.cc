// Runs Keel on the inputs of golden-format case files and writes the cases back with an
// `actual` object beside each `expected`, in the same shape, without comparing them. It
// lets a user check Keel against traces from their own Python runs.
//
//   bazel run //tools:parity                                   # every component, vendored cases
//   bazel run //tools:parity -- --component=param_scheduler --cases=my.json --out=out.json
//
// A case whose inputs Keel refuses gets `actual: {"error": "<message>"}`. The tool runs on the
// CPU kernels the golden files were recorded with (ATEN_CPU_CAPABILITY=avx2, MKL_CBWR=AVX2; see
// testdata/golden/README.md), re-executing itself with them set when they are not.
#include <stdio.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/files.h"
#include "base/json.h"
#include "base/status.h"
#include "gradients/grad_utils_cases.h"
#include "optim/param_scheduler_cases.h"
#include "parallel/mesh_cases.h"
#include "sampling/gpt_dataset_cases.h"
#include "sampling/samplers_cases.h"
#include "scheduling/step_scheduler_cases.h"
#include "tools/cli/exit_code.h"
#include "tools/cli/flags.h"
#include "tools/cli/user_path.h"
#include "tools/cpp/runfiles/runfiles.h"

ABSL_FLAG(std::string, component, "all",
          "Component whose cases to run: gpt_dataset, grad_utils, mesh, param_scheduler, samplers, "
          "step_scheduler, or all.");
ABSL_FLAG(
    std::string, cases, "",
    "Case file in the golden format; default: the vendored testdata/golden/<component>.json.");
ABSL_FLAG(
    std::string, out, "",
    "Output file (a folder for --component=all, one <component>.json each); default: stdout.");

namespace keel::tools {
namespace {

using base::Json;
using bazel::tools::cpp::runfiles::Runfiles;

struct Component {
  const char* name;
  absl::StatusOr<Json> (*run)(const Json& inputs);
};

constexpr Component kComponents[] = {
    {"gpt_dataset", &sampling::RunGptDatasetCase},
    {"grad_utils", &gradients::RunGradUtilsCase},
    {"mesh", &parallel::RunMeshCase},
    {"param_scheduler", &optim::RunParamSchedulerCase},
    {"samplers", &sampling::RunSamplersCase},
    {"step_scheduler", &scheduling::RunStepSchedulerCase},
};

// The case file with `actual` inserted after each case's `expected`.
absl::StatusOr<Json> RunCases(const Component& component, const std::string& cases_path) {
  KEEL_ASSIGN_OR_RETURN(Json file, base::ReadJsonFile(cases_path));
  if (!file.is_object() || !file.contains("cases") || !file["cases"].is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(cases_path, ": no \"cases\" array"));
  }
  int refused = 0;
  for (Json& c : file["cases"]) {
    absl::StatusOr<Json> actual = component.run(c.value("inputs", Json::object()));
    if (!actual.ok()) {
      ++refused;
      actual = Json{{"error", std::string(actual.status().message())}};
    }
    Json with_actual = Json::object();
    for (auto& [key, value] : c.items()) {
      with_actual[key] = std::move(value);
      if (key == "expected") with_actual["actual"] = *actual;
    }
    if (!with_actual.contains("actual")) with_actual["actual"] = *std::move(actual);
    c = std::move(with_actual);
  }
  std::cerr << component.name << ": " << file["cases"].size() << " cases from " << cases_path
            << ", " << refused << " refused by Keel\n";
  return file;
}

// What testdata/golden/README.md says the cases were recorded on: ATen's AVX2 kernels (float
// reductions sum in the order of their vector width) and MKL's AVX2 code path (its float64 sqrt
// rounds otherwise on wider instruction sets).
constexpr std::pair<const char*, const char*> kRecordingKernels[] = {
    {"ATEN_CPU_CAPABILITY", "avx2"}, {"MKL_CBWR", "AVX2"}};

// Sets kRecordingKernels and re-executes this program when one was missing or different, so
// that LibTorch and MKL read them before their first kernel. Returns only when both were set
// already, or when the re-execution failed (then kernels stay the machine's).
void RunOnRecordingKernels(char** argv) {
  bool set = true;
  for (const auto& [name, value] : kRecordingKernels) {
    const char* current = std::getenv(name);
    if (current != nullptr && std::strcmp(current, value) == 0) continue;
    ::setenv(name, value, /*overwrite=*/1);
    set = false;
  }
  if (set) return;
  ::execv("/proc/self/exe", argv);
  ::perror("parity: re-executing with ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2");
}

absl::Status Main(const std::string& argv0) {
  const std::string selected = absl::GetFlag(FLAGS_component);
  std::vector<const Component*> components;
  for (const Component& component : kComponents) {
    if (selected == "all" || selected == component.name) components.push_back(&component);
  }
  if (components.empty()) {
    std::vector<std::string> names = {"all"};
    for (const Component& component : kComponents) names.push_back(component.name);
    return absl::InvalidArgumentError(
        absl::StrCat("--component=", selected, " is not one of ", absl::StrJoin(names, ", ")));
  }
  const std::string cases = absl::GetFlag(FLAGS_cases);
  if (!cases.empty() && components.size() != 1) {
    return absl::InvalidArgumentError("--cases needs a single --component");
  }

  std::string error;
  std::unique_ptr<Runfiles> runfiles(Runfiles::Create(argv0, &error));
  const std::string out = cli::UserPath(absl::GetFlag(FLAGS_out));
  if (!out.empty() && components.size() > 1) {
    KEEL_RETURN_IF_ERROR(base::MakeDirectories(out));
  }
  Json all = Json::object();
  for (const Component* component : components) {
    std::string path = cli::UserPath(cases);
    if (path.empty()) {
      if (runfiles == nullptr) return absl::NotFoundError(absl::StrCat("runfiles: ", error));
      path = runfiles->Rlocation(absl::StrCat("keel/testdata/golden/", component->name, ".json"));
    }
    KEEL_ASSIGN_OR_RETURN(Json result, RunCases(*component, path));
    if (out.empty()) {
      all[component->name] = std::move(result);
    } else {
      const std::string file =
          components.size() == 1 ? out : absl::StrCat(out, "/", component->name, ".json");
      KEEL_RETURN_IF_ERROR(base::WriteJsonFile(file, result));
    }
  }
  if (out.empty()) {
    std::cout << (components.size() == 1 ? all.begin().value() : all).dump(1) << "\n";
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace keel::tools

int main(int argc, char** argv) {
  keel::tools::RunOnRecordingKernels(argv);
  absl::SetProgramUsageMessage(
      "Runs Keel on golden-format cases and writes them back with `actual` beside `expected`.");
  keel::tools::cli::ParseFlags(argc, argv);
  return keel::tools::cli::Exit("parity", keel::tools::Main(argv[0]));
}
