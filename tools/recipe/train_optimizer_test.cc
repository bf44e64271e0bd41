// The run's two optimizer paths on 2 ranks (threads over Gloo): the sharded one steps the
// weights the unsharded one does, to the bit without clipping, and both save the same
// checkpoint: the same keys, values and global shapes.
#include "tools/recipe/train_optimizer.h"

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/state_dict.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/ranks.h"
#include "testing/status_matchers.h"
#include "tools/recipe/gpt.h"

namespace keel::tools::recipe {
namespace {

using ::keel::testing::Rank;
using ::keel::testing::RunOnRanks;
using ::testing::HasSubstr;

TrainOptions Options(bool sharded) {
  TrainOptions options;
  options.model.vocab_size = 32;
  options.model.hidden_size = 16;
  options.model.num_layers = 1;
  options.model.num_attention_heads = 2;
  options.model.ffn_hidden_size = 32;
  options.model.max_sequence_length = 8;
  options.optimizer.lr = 0.01;
  options.distributed.use_distributed_optimizer = sharded;
  return options;
}

struct Saved {
  std::vector<at::Tensor> weights;
  // Each checkpoint key's global shape, and the values.
  std::map<std::string, std::vector<int64_t>> shapes;
  std::string values;
  std::string description;
};

// Three steps of one mode on rank r's batch; the weights and the optimizer's checkpoint.
absl::StatusOr<Saved> Train(bool sharded, Rank& r) {
  const TrainOptions options = Options(sharded);
  static std::mutex mu;  // ranks are threads: each Gpt is built under the seed alone
  std::unique_ptr<Gpt> model;
  {
    std::lock_guard<std::mutex> lock(mu);
    torch::manual_seed(3);
    model = std::make_unique<Gpt>(options.model);
  }
  KEEL_ASSIGN_OR_RETURN(auto optimizer, TrainOptimizer::Create(options, **model, r.group.get()));
  const at::Tensor tokens = at::arange(16, at::kLong).add(r.rank * 5).remainder(32).view({2, 8});
  for (int step = 0; step < 3; ++step) {
    optimizer->PrepareForFinalBackward();
    (*model)->forward(tokens).pow(2).mean().backward();
    KEEL_RETURN_IF_ERROR(optimizer->Wait());
    KEEL_RETURN_IF_ERROR(optimizer->ClipGradNorm(1e9).status());
    KEEL_RETURN_IF_ERROR(optimizer->Step());
  }
  Saved saved;
  for (const at::Tensor& p : (*model)->parameters()) saved.weights.push_back(p.detach().clone());
  KEEL_ASSIGN_OR_RETURN(checkpoint::OptimizerState state, optimizer->CheckpointState(nullptr));
  KEEL_ASSIGN_OR_RETURN(checkpoint::State dict, state.StateDict());
  for (const auto& [key, ref] : dict.tensors) {
    saved.shapes[key] = ref.layout ? ref.layout->global_shape : ref.tensor.sizes().vec();
  }
  saved.values = dict.values.dump();
  saved.description = optimizer->Describe();
  return saved;
}

TEST(TrainOptimizerTest, ShardedAndUnshardedStepAndSaveAlike) {
  std::vector<Saved> whole(2), sharded(2);
  KEEL_ASSERT_OK(RunOnRanks(2, [&](Rank& r) -> absl::Status {
    KEEL_ASSIGN_OR_RETURN(whole[r.rank], Train(false, r));
    KEEL_ASSIGN_OR_RETURN(sharded[r.rank], Train(true, r));
    return absl::OkStatus();
  }));
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE(absl::StrCat("rank ", rank));
    ASSERT_EQ(sharded[rank].weights.size(), whole[rank].weights.size());
    for (size_t i = 0; i < whole[rank].weights.size(); ++i) {
      EXPECT_TRUE(at::equal(sharded[rank].weights[i], whole[0].weights[i])) << "weight " << i;
    }
    EXPECT_EQ(sharded[rank].shapes, whole[rank].shapes);
    EXPECT_EQ(sharded[rank].values, whole[rank].values);
    EXPECT_EQ(whole[rank].description, "AdamW");
    EXPECT_THAT(sharded[rank].description, HasSubstr("AdamW sharded over the data-parallel"));
  }
  EXPECT_FALSE(whole[0].shapes.empty());
}

}  // namespace
}  // namespace keel::tools::recipe
