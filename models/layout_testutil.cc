#include "models/layout_testutil.h"

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/registry.h"
#include "parallel/layout.h"
#include "parallel/tensor_parallel/mappings.h"
#include "testing/ranks.h"
#include "testing/status_matchers.h"
#include "torch/utils.h"

namespace keel::models::testing {
namespace {

constexpr int64_t kSeed = 5;

// This rank's block of `whole` (all of it without a layout).
at::Tensor Slice(const at::Tensor& whole,
                 const std::map<std::string, parallel::TensorLayout>& layouts,
                 const std::string& name, at::IntArrayRef shape) {
  auto it = layouts.find(name);
  return it == layouts.end() ? whole : parallel::BlockOf(whole, it->second, shape);
}

struct Batch {
  at::Tensor tokens, labels;
};

Batch MakeBatch(const ModelOptions& options) {
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(/*seed_in=*/3);
  Batch batch;
  batch.tokens = at::randint(options.vocab_size, {2, 10}, generator, at::kLong);
  batch.labels = batch.tokens.roll(-1, 1);
  return batch;
}

// Builds the model of `groups` from the seed (the ranks are threads sharing the default
// generator).
std::shared_ptr<LanguageModel> Build(const ModelOptions& options, const ModelGroups& groups) {
  static std::mutex generator;
  std::lock_guard<std::mutex> lock(generator);
  torch::manual_seed(kSeed);
  return BuildLanguageModel(options, groups);
}

}  // namespace

void ExpectTwoTensorParallelRanksComputeTheOneRankModel(const ModelOptions& options,
                                                        bool sequence_parallel) {
  // One thread for LibTorch's kernels: the wheel's threaded sgemm rounds differently from call
  // to call, which would blur the layout's own rounding.
  at::set_num_threads(1);
  const Batch batch = MakeBatch(options);
  const std::shared_ptr<LanguageModel> whole = Build(options, {});
  const at::Tensor whole_losses = whole->TokenLosses(batch.tokens, batch.labels);
  whole_losses.sum().backward();
  const auto expected = whole->named_parameters();
  std::vector<std::vector<std::string>> differing(2);
  KEEL_ASSERT_OK(keel::testing::RunOnRanks(2, [&](keel::testing::Rank& r) -> absl::Status {
    ModelGroups groups{r.group.get()};
    groups.sequence_parallel = sequence_parallel;
    const std::shared_ptr<LanguageModel> model = Build(options, groups);
    const std::map<std::string, parallel::TensorLayout> layouts = model->Layouts();
    if (layouts.empty()) differing[r.rank].push_back("no parameter is split");
    const at::Tensor hidden = model->StageForward(batch.tokens, at::Tensor(), nullptr);
    const int64_t seq = batch.tokens.size(1) / (sequence_parallel ? 2 : 1);
    if (hidden.size(1) != seq || hidden.sizes() != model->ActivationShape(batch.tokens.sizes())) {
      differing[r.rank].push_back(absl::StrCat("hidden states of ", hidden.size(1), " positions"));
    }
    const at::Tensor losses = model->HeadLosses(hidden, batch.labels);
    losses.sum().backward();
    const std::vector<std::string> summed = model->SequenceParallelParameters();
    if (summed.empty() == sequence_parallel) {
      differing[r.rank].push_back(absl::StrCat(summed.size(), " sequence-parallel parameters"));
    }
    auto parameters = model->named_parameters();
    for (const std::string& name : summed) {
      at::Tensor grad = parameters[name].grad();
      parallel::AllReduceInPlace(grad, r.group.get());
    }
    if (!at::allclose(losses, whole_losses, /*rtol=*/1e-6, /*atol=*/0)) {
      differing[r.rank].push_back("losses");
    }
    for (const auto& item : model->named_parameters()) {
      const at::IntArrayRef shape = item.value().sizes();
      if (!at::equal(item.value(), Slice(expected[item.key()], layouts, item.key(), shape))) {
        differing[r.rank].push_back(item.key() + " (weights)");
      }
      const at::Tensor want = Slice(expected[item.key()].grad(), layouts, item.key(), shape);
      const double scale = want.abs().max().item<double>();
      if ((item.value().grad() - want).abs().max().item<double>() > 1e-5 * scale + 1e-7) {
        differing[r.rank].push_back(absl::StrCat(
            item.key(), " (gradient: ", (item.value().grad() - want).abs().max().item<double>(),
            " apart, of ", want.abs().max().item<double>(), ")"));
      }
    }
    return absl::OkStatus();
  }));
  EXPECT_THAT(differing[0], ::testing::IsEmpty());
  EXPECT_THAT(differing[1], ::testing::IsEmpty());
}

void ExpectTwoPipelineStagesComputeTheOneRankModel(const ModelOptions& options) {
  const Batch batch = MakeBatch(options);
  const std::shared_ptr<LanguageModel> whole = Build(options, {});
  std::vector<std::shared_ptr<LanguageModel>> stages(2);
  KEEL_ASSERT_OK(keel::testing::RunOnRanks(2, [&](keel::testing::Rank& r) -> absl::Status {
    stages[r.rank] = Build(options, ModelGroups{nullptr, r.group.get()});
    return absl::OkStatus();
  }));
  EXPECT_TRUE(stages[0]->first_stage() && !stages[0]->last_stage());
  EXPECT_TRUE(!stages[1]->first_stage() && stages[1]->last_stage());
  const auto expected = whole->named_parameters();
  for (int stage = 0; stage < 2; ++stage) {
    for (const auto& item : stages[stage]->named_parameters()) {
      EXPECT_TRUE(at::equal(item.value(), expected[item.key()])) << item.key();
    }
  }
  const at::Tensor hidden = stages[0]->StageForward(batch.tokens, at::Tensor(), nullptr);
  const at::Tensor losses =
      stages[1]->HeadLosses(stages[1]->StageForward(batch.tokens, hidden, nullptr), batch.labels);
  EXPECT_TRUE(at::equal(losses, whole->TokenLosses(batch.tokens, batch.labels)));
}

}  // namespace keel::models::testing
