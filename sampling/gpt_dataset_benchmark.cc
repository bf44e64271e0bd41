// Builds (or loads) the GPT datasets of one configuration with Keel's BuildGptDatasets and
// reports, as JSON lines, each split's size and the build time; optionally the first samples
// of each split. tools/scripts/gpt_index_benchmark.py runs it beside Megatron-LM's own
// builder on the same data (time, peak memory, and each one reading the other's cache).
//
//   bazel run -c opt //sampling:gpt_dataset_benchmark -- --data_path="0.3 /d/a 0.7 /d/b"
//       --split=969,30,1 --sequence_length=64 --sizes=100000000,100000,0 --cache_dir=/tmp/c
#include <chrono>
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/json.h"
#include "base/status.h"
#include "sampling/gpt_dataset_builder.h"

ABSL_FLAG(std::string, data_path, "",
          "Megatron's --data-path: \"prefix ...\" or \"w prefix ...\".");
ABSL_FLAG(std::string, split, "969,30,1", "The split string.");
ABSL_FLAG(int64_t, sequence_length, 64, "Tokens per sample.");
ABSL_FLAG(int64_t, seed, 1234, "random_seed.");
ABSL_FLAG(std::string, sizes, "none,none,none", "Samples per split, \"none\" for one epoch.");
ABSL_FLAG(std::string, cache_dir, "", "path_to_cache.");
ABSL_FLAG(std::string, tokenizer_class, "KeelBenchmarkTokenizer",
          "The tokenizer's unique_identifiers {\"class\": ...} in the cache descriptions.");
ABSL_FLAG(bool, load_only, false, "Only load the caches (fail if one is missing).");
ABSL_FLAG(int64_t, samples, 0, "Print the first N samples of each split.");

namespace keel::sampling {
namespace {

absl::StatusOr<SplitSizes> ParseSizes(const std::string& text) {
  SplitSizes sizes;
  std::vector<std::string> parts = absl::StrSplit(text, ',');
  if (parts.size() != 3) return absl::InvalidArgumentError("--sizes needs 3 values");
  for (int i = 0; i < 3; ++i) {
    int64_t value;
    if (parts[i] == "none") continue;
    if (!absl::SimpleAtoi(parts[i], &value)) {
      return absl::InvalidArgumentError(absl::StrCat("--sizes: \"", parts[i], "\""));
    }
    sizes[i] = value;
  }
  return sizes;
}

absl::Status PrintSamples(const GptSplitView& view, Split split, int64_t count) {
  for (int64_t i = 0; i < std::min(count, view.size()); ++i) {
    KEEL_ASSIGN_OR_RETURN(GptSampleRef ref, view.Locate(i));
    const MegatronGptDataset& dataset = *view.datasets()[ref.dataset];
    std::vector<int64_t> window(dataset.window_size());
    KEEL_RETURN_IF_ERROR(dataset.Window(ref.dataset_sample, absl::MakeSpan(window)));
    std::cout << base::Json{{"split", AbslUnparseFlag(split)},
                            {"index", i},
                            {"dataset", ref.dataset},
                            {"dataset_sample", ref.dataset_sample},
                            {"tokens", window}}
                     .dump()
              << "\n";
  }
  return absl::OkStatus();
}

absl::Status Main() {
  GptDatasetConfig config;
  config.random_seed = absl::GetFlag(FLAGS_seed);
  config.sequence_length = absl::GetFlag(FLAGS_sequence_length);
  KEEL_ASSIGN_OR_RETURN(config.blend,
                        GetBlendFromList(absl::StrSplit(absl::GetFlag(FLAGS_data_path), ' ',
                                                        absl::SkipWhitespace())));
  config.split = absl::GetFlag(FLAGS_split);
  if (!absl::GetFlag(FLAGS_cache_dir).empty())
    config.path_to_cache = absl::GetFlag(FLAGS_cache_dir);
  config.tokenizer.unique_identifiers = {{"class", absl::GetFlag(FLAGS_tokenizer_class)}};
  config.reset_position_ids = config.reset_attention_mask = config.eod_mask_loss = false;
  KEEL_ASSIGN_OR_RETURN(SplitSizes sizes, ParseSizes(absl::GetFlag(FLAGS_sizes)));
  GptBuildOptions options;
  if (absl::GetFlag(FLAGS_load_only)) options.cache_mode = IndexCacheMode::kLoadOnly;
  const auto start = std::chrono::steady_clock::now();
  KEEL_ASSIGN_OR_RETURN(GptDatasetSplits splits, BuildGptDatasets(config, sizes, options));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << base::Json{{"build_seconds", seconds}}.dump() << "\n";
  for (Split split : kSplits) {
    const auto& dataset = splits[static_cast<int>(split)];
    if (!dataset.has_value()) continue;
    KEEL_ASSIGN_OR_RETURN(GptSplitView view, GptSplitView::Of(dataset));
    std::cout << base::Json{{"split", AbslUnparseFlag(split)}, {"len", view.size()}}.dump() << "\n";
    KEEL_RETURN_IF_ERROR(PrintSamples(view, split, absl::GetFlag(FLAGS_samples)));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace keel::sampling

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const absl::Status status = keel::sampling::Main();
  if (!status.ok()) {
    std::cerr << "gpt_dataset_benchmark: " << status << "\n";
    return 1;
  }
  return 0;
}
