// Looks at the data a training config gives with data.paths (Megatron's GPT datasets):
//
//   bazel run //tools:data -- summary [--config=FILE] [--set section.field=value]...
//   bazel run //tools:data -- samples --config=FILE [--set ...] --split=train --first=I --count=N
//
// summary prints the plan, builds nothing: each split's size and, per dataset, its weight,
// samples drawn, epochs and documents. samples builds (or loads) the index caches as the run
// would and prints one JSON line per sample, {"index", "dataset", "dataset_sample",
// "tokens"}, in the order training consumes them (one rank's sampler; the "single" sampler
// consumes them in this order on any number of ranks; validation in order): dataset_sample
// is the sample of that dataset's stream, tokens the window of sequence_length + 1 tokens
// (-1 pads past the end of a split's documents). Exit status (tools/cli/exit_code.h): 0;
// 1 when the data cannot be read; 2 for bad usage or a bad configuration.
#include <algorithm>
#include <cstdint>
#include <iostream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/json.h"
#include "base/status.h"
#include "sampling/gpt_dataset_config.h"
#include "sampling/megatron_sampler.h"
#include "tools/cli/exit_code.h"
#include "tools/cli/flags.h"
#include "tools/recipe/config.pb.h"
#include "tools/recipe/megatron_data.h"
#include "tools/recipe/options.h"
#include "tools/recipe/runtime.h"
#include "tools/recipe/tool_config.h"

ABSL_FLAG(std::string, config, "",
          "Config in protobuf text format (tools/recipe/config.proto); default: "
          "tools/recipe/default.textproto.");
ABSL_FLAG(keel::sampling::Split, split, keel::sampling::Split::kTrain,
          "samples: \"train\" or \"valid\".");
ABSL_FLAG(int64_t, first, 0, "samples: the first sample, in the order training consumes them.");
ABSL_FLAG(int64_t, count, 10, "samples: how many.");

namespace keel::tools {
namespace {

constexpr char kUsage[] = R"(Looks at the data of a training config's data.paths.

Usage: data summary|samples [--config=FILE] [--set section.field=value]... [flags]

  summary   each split's size; per dataset its weight, samples drawn, epochs (builds nothing)
  samples   JSON lines {"index", "dataset", "dataset_sample", "tokens"} of --split, samples
            --first to --first + --count - 1 in the order training consumes them)";

// The training split's positions in the order one rank's sampler yields them, up to `end`.
absl::StatusOr<std::vector<int64_t>> TrainingOrder(const recipe::TrainOptions& options,
                                                   int64_t size, int64_t end) {
  KEEL_ASSIGN_OR_RETURN(std::unique_ptr<sampling::MegatronSampler> sampler,
                        sampling::CreateMegatronSampler(options.sampler, size, 0, 1));
  std::vector<int64_t> order;
  for (auto it = sampler->begin(); it != sampler->end() && static_cast<int64_t>(order.size()) < end;
       ++it) {
    for (int64_t position : *it) {
      if (position >= 0) order.push_back(position);
    }
  }
  return order;
}

absl::Status PrintSamples(const recipe::TrainOptions& options) {
  const int64_t first = absl::GetFlag(FLAGS_first), count = absl::GetFlag(FLAGS_count);
  const bool validation = absl::GetFlag(FLAGS_split) == sampling::Split::kValid;
  if (absl::GetFlag(FLAGS_split) == sampling::Split::kTest || first < 0 || count < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--split=", AbslUnparseFlag(absl::GetFlag(FLAGS_split)), " --first=", first,
        " --count=", count, ": allowed are --split=train or valid, --first and --count >= 0"));
  }
  recipe::TrainRuntime runtime;
  runtime.log = &std::cerr;
  KEEL_ASSIGN_OR_RETURN(std::unique_ptr<recipe::MegatronData> data,
                        recipe::MegatronData::Open(options, runtime, /*plan_only=*/false));
  const int64_t size = validation ? data->val_size() : data->train_size();
  // first + count, where it does not pass int64's end (--count "all the rest").
  const int64_t end = count > std::numeric_limits<int64_t>::max() - first
                          ? std::numeric_limits<int64_t>::max()
                          : first + count;
  std::vector<int64_t> order;
  if (!validation) {
    KEEL_ASSIGN_OR_RETURN(order, TrainingOrder(options, size, end));
  }
  const int64_t available = validation ? size : static_cast<int64_t>(order.size());
  const std::string split = AbslUnparseFlag(absl::GetFlag(FLAGS_split));
  if (count > 0 && available == 0) {
    return absl::InvalidArgumentError(absl::StrCat("--split=", split, " is empty: data.split \"",
                                                   options.data.megatron.split,
                                                   "\" gives it no samples"));
  }
  if (count > 0 && first >= available) {
    return absl::InvalidArgumentError(
        absl::StrCat("--first=", first, " is past the end: the ", split, " split gives ", available,
                     " samples", validation ? "" : " in the order training consumes them",
                     "; allowed: --first below ", available));
  }
  std::vector<int64_t> tokens;
  for (int64_t i = first; i < std::min(end, available); ++i) {
    const int64_t position = validation ? i : order[i];
    KEEL_ASSIGN_OR_RETURN(recipe::SampleSource source, data->Window(position, validation, tokens));
    std::cout << base::Json{{"index", i},
                            {"dataset", source.dataset},
                            {"dataset_sample", source.dataset_sample},
                            {"tokens", tokens}}
                     .dump()
              << "\n";
  }
  return absl::OkStatus();
}

absl::Status Main(int argc, char** argv) {
  std::vector<std::string> overrides = recipe::TakeOverrides(argc, argv);
  absl::SetProgramUsageMessage(kUsage);
  std::vector<char*> args = cli::ParseFlags(argc, argv);
  const std::string command = args.size() == 2 ? args[1] : "";
  if (command != "summary" && command != "samples") {
    return absl::InvalidArgumentError(absl::StrCat("expected one command\n\n", kUsage));
  }
  KEEL_ASSIGN_OR_RETURN(recipe::TrainConfig config,
                        recipe::LoadToolConfig(argv[0], absl::GetFlag(FLAGS_config), overrides));
  KEEL_ASSIGN_OR_RETURN(recipe::TrainOptions options, recipe::ReadOptions(config));
  if (options.data.megatron.paths.empty()) {
    return absl::InvalidArgumentError(
        "data.paths is empty: the data tool reads Megatron's GPT datasets of data.paths");
  }
  if (command == "samples") return PrintSamples(options);
  recipe::TrainRuntime runtime;
  KEEL_ASSIGN_OR_RETURN(std::unique_ptr<recipe::MegatronData> data,
                        recipe::MegatronData::Open(options, runtime, /*plan_only=*/true));
  data->Describe(std::cout);
  return absl::OkStatus();
}

}  // namespace
}  // namespace keel::tools

int main(int argc, char** argv) {
  return keel::tools::cli::Exit("data", keel::tools::Main(argc, argv));
}
