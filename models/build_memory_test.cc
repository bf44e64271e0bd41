// Building a model split over ranks costs each rank its part plus the largest parameter, not
// the whole model: two tensor-parallel ranks (processes over Gloo) build a Llama of 8 layers,
// 544 MiB of float32 weights. Each rank's peak resident memory (VmHWM, every tensor of 128 KiB
// or more in its own mapping, unmapped when freed) grows by at most its half of the weights
// plus the largest parameter (the one-rank draw of a layer's weight, 16 MiB) and 64 MiB for the
// rest (the group, LibTorch's first use, the rotary tables). Drawing the whole one-rank model
// on every rank, as Keel did before, grows each by its half and the whole: 845 MiB measured.
#include <malloc.h>

#include <cstdint>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "models/registry.h"
#include "parallel/mesh_layout.h"
#include "testing/ranks.h"
#include "testing/status_matchers.h"
#include "torch/utils.h"

namespace keel::models {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

// A /proc/self/status field in KiB ("VmRSS", "VmHWM"), as MiB.
double StatusMiB(const std::string& field) {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind(field + ":", 0) == 0) return std::stod(line.substr(field.size() + 1)) / 1024;
  }
  return 0;
}

ModelOptions EightLayers() {
  ModelOptions options;
  options.family = ModelFamily::kLlama;
  options.vocab_size = 4096;
  options.hidden_size = 1024;
  options.ffn_hidden_size = 4096;
  options.num_layers = 8;
  options.num_attention_heads = 8;
  options.untie_embeddings_and_output_weights = true;
  return options;
}

TEST(BuildMemoryTest, TensorParallelRanksBuildTheirPartAndTheLargestParameter) {
  at::set_num_threads(1);
  const ModelOptions options = EightLayers();
  parallel::ModelParallelOptions one_rank;
  const double whole_mib = CountStageParameters(options, one_rank, 0).dense * 4 / kMiB;
  const double largest_mib = options.hidden_size * options.ffn_hidden_size * 4 / kMiB;
  const std::vector<absl::Status> statuses = keel::testing::RunOnRankProcesses(
      2,
      [&](keel::testing::Rank& r) -> absl::Status {
        mallopt(M_MMAP_THRESHOLD, 128 * 1024);
        const double start_mib = StatusMiB("VmRSS");
        torch::manual_seed(1);
        ModelGroups groups;
        groups.tp = r.group.get();
        const std::shared_ptr<LanguageModel> model = BuildLanguageModel(options, groups);
        const double growth_mib = StatusMiB("VmHWM") - start_mib;
        int64_t bytes = 0;
        for (const at::Tensor& p : model->parameters()) bytes += p.nbytes();
        const double part_mib = bytes / kMiB;
        const double bound_mib = part_mib + largest_mib + 64;
        std::cout << "rank " << r.rank << ": peak grew " << growth_mib << " MiB building its "
                  << part_mib << " MiB of the " << whole_mib << " MiB model (bound " << bound_mib
                  << " MiB)" << std::endl;
        if (growth_mib > bound_mib) {
          return absl::FailedPreconditionError(absl::StrCat(
              "peak resident memory grew ", growth_mib, " MiB building ", part_mib,
              " MiB of weights; bound ", bound_mib, " MiB (whole model ", whole_mib, " MiB)"));
        }
        return absl::OkStatus();
      },
      std::chrono::minutes(2));
  for (const absl::Status& status : statuses) KEEL_EXPECT_OK(status);
}

}  // namespace
}  // namespace keel::models
