// How the command-line tools that read a training config (train, data) take it from their
// arguments: --set overrides taken out of argv, the config file (default: the runfiles'
// tools/recipe/default.textproto), and every path in it as the user typed it (cli::UserPath).
//
//   std::vector<std::string> overrides = TakeOverrides(argc, argv);
//   absl::ParseCommandLine(argc, argv);
//   KEEL_ASSIGN_OR_RETURN(TrainConfig config,
//                         LoadToolConfig(argv[0], absl::GetFlag(FLAGS_config), overrides));
#ifndef KEEL_TOOLS_RECIPE_TOOL_CONFIG_H_
#define KEEL_TOOLS_RECIPE_TOOL_CONFIG_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/recipe/config.pb.h"

namespace keel::tools::recipe {

// Splits "--set X" / "--set=X" out of argv (values may hold commas, which absl's list flags
// would split).
std::vector<std::string> TakeOverrides(int& argc, char** argv);

// LoadTrainConfig of `config_flag` over the default textproto in argv0's runfiles (empty: the
// default textproto alone: a partial file sets only what it names) and `overrides`, with
// run_dir, data.prefix, the prefixes of data.paths, data.index_mapping_dir
// and model.pretrained_path resolved against the user's directory. Errors: kNotFound without
// runfiles; LoadTrainConfig's.
[[nodiscard]] absl::StatusOr<TrainConfig> LoadToolConfig(const char* argv0,
                                                         const std::string& config_flag,
                                                         const std::vector<std::string>& overrides);

}  // namespace keel::tools::recipe

#endif  // KEEL_TOOLS_RECIPE_TOOL_CONFIG_H_
