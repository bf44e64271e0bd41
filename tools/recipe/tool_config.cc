#include "tools/recipe/tool_config.h"

#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/status.h"
#include "tools/cli/user_path.h"
#include "tools/cpp/runfiles/runfiles.h"
#include "tools/recipe/config.h"

namespace keel::tools::recipe {
namespace {

using bazel::tools::cpp::runfiles::Runfiles;

// tools/recipe/default.textproto in argv0's runfiles.
absl::StatusOr<std::string> DefaultConfigPath(const char* argv0) {
  std::string error;
  std::unique_ptr<Runfiles> runfiles(Runfiles::Create(argv0, &error));
  if (runfiles == nullptr) return absl::NotFoundError(absl::StrCat("runfiles: ", error));
  return runfiles->Rlocation("keel/tools/recipe/default.textproto");
}

// data.paths with its prefixes resolved; the weights (items before a prefix in a weighted
// list: every other one) are left as they are.
std::string UserPaths(const std::string& paths) {
  std::vector<std::string> items =
      absl::StrSplit(paths, absl::ByAnyChar(" \t\n"), absl::SkipEmpty());
  bool weighted = items.size() % 2 == 0;
  for (size_t i = 0; weighted && i < items.size(); i += 2) {
    double weight;
    weighted = absl::SimpleAtod(items[i], &weight);
  }
  for (size_t i = weighted ? 1 : 0; i < items.size(); i += weighted ? 2 : 1) {
    items[i] = cli::UserPath(items[i]);
  }
  return absl::StrJoin(items, " ");
}

}  // namespace

std::vector<std::string> TakeOverrides(int& argc, char** argv) {
  std::vector<std::string> overrides;
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--set" && i + 1 < argc) {
      overrides.push_back(argv[++i]);
    } else if (absl::StartsWith(arg, "--set=")) {
      overrides.push_back(arg.substr(6));
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  return overrides;
}

absl::StatusOr<TrainConfig> LoadToolConfig(const char* argv0, const std::string& config_flag,
                                           const std::vector<std::string>& overrides) {
  KEEL_ASSIGN_OR_RETURN(const std::string defaults, DefaultConfigPath(argv0));
  // A user's file overlays the defaults: what it leaves out keeps the default run's value.
  TrainConfig base;
  if (!config_flag.empty()) {
    KEEL_ASSIGN_OR_RETURN(base, LoadTrainConfig(defaults, {}));
  }
  KEEL_ASSIGN_OR_RETURN(TrainConfig config,
                        LoadTrainConfig(config_flag.empty() ? defaults : cli::UserPath(config_flag),
                                        overrides, base));
  config.set_run_dir(cli::UserPath(config.run_dir()));
  DataConfig& data = *config.mutable_data();
  if (!data.prefix().empty()) data.set_prefix(cli::UserPath(data.prefix()));
  if (!data.paths().empty()) data.set_paths(UserPaths(data.paths()));
  if (data.has_index_mapping_dir()) {
    data.set_index_mapping_dir(cli::UserPath(data.index_mapping_dir()));
  }
  if (!config.model().pretrained_path().empty()) {
    config.mutable_model()->set_pretrained_path(cli::UserPath(config.model().pretrained_path()));
  }
  return config;
}

}  // namespace keel::tools::recipe
