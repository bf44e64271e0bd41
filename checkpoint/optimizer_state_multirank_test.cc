// A DistributedOptimizer's state in checkpoints, over real c10d Gloo groups (ranks on
// threads): saved sharded on N ranks, it loads sharded on M ranks and unsharded on one, and an
// unsharded checkpoint loads sharded; after each load every state tensor and step is the
// saved one, bit for bit.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "base/torch_compat.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/optimizer_state.h"
#include "gmock/gmock.h"
#include "gradients/parameters.h"
#include "gtest/gtest.h"
#include "optim/data_parallel_optimizer.h"
#include "optim/distributed_optimizer.h"
#include "testing/files.h"
#include "testing/ranks.h"
#include "testing/status_matchers.h"
#include "torch/csrc/distributed/c10d/ProcessGroup.hpp"
#include "torch/nn/module.h"
#include "torch/optim/adagrad.h"
#include "torch/optim/adam.h"
#include "torch/optim/adamw.h"
#include "torch/optim/rmsprop.h"
#include "torch/optim/sgd.h"

namespace keel::checkpoint {
namespace {

using ::keel::gradients::ParamShard;
using ::keel::optim::DistributedOptimizer;
using ::keel::testing::NewTempDir;
using ::keel::testing::Rank;
using ::keel::testing::RunOnRanks;

// An embedding of 9 rows and a layer: shards of 1 to 9 rows, none on some of 4 ranks.
class Net : public torch::nn::Module {
 public:
  Net() {
    embed_ = register_parameter("embed", at::arange(36, at::kFloat).mul(0.3).sin().view({9, 4}));
    w_ = register_parameter("w", at::arange(12, at::kFloat).mul(0.7).cos().view({3, 4}));
    b_ = register_parameter("b", at::zeros({3}));
  }
  at::Tensor Loss(int64_t first) const {
    const at::Tensor tokens = at::arange(first, first + 4, at::kLong).remainder(9);
    return embed_.index_select(0, tokens).matmul(w_.t()).add(b_).tanh().pow(2).mean();
  }

 private:
  at::Tensor embed_, w_, b_;
};

torch::optim::AdamWOptions Options() {
  return torch::optim::AdamWOptions(0.0123).weight_decay(0.1);
}

std::unique_ptr<DistributedOptimizer> ShardedAdamW(Net& net, c10d::ProcessGroup& group) {
  auto optimizer =
      DistributedOptimizer::Create(net, group, [](const std::vector<ParamShard>& shards) {
        std::vector<at::Tensor> tensors;
        for (const ParamShard& shard : shards) tensors.push_back(shard.tensor);
        return std::make_unique<torch::optim::AdamW>(tensors, Options().lr(0.5));
      });
  EXPECT_THAT(optimizer.status(), keel::testing::IsOk());
  return optimizer.ok() ? *std::move(optimizer) : nullptr;
}

// Every parameter's AdamW state, whole: "<name>/exp_avg", "<name>/exp_avg_sq", and the step
// and learning rate as tensors "<name>/step", "lr".
using WholeState = std::map<std::string, at::Tensor>;

const torch::optim::AdamWParamState& StateOf(torch::optim::Optimizer& optimizer,
                                             const at::Tensor& tensor) {
  return static_cast<const torch::optim::AdamWParamState&>(
      *optimizer.state().at(base::OptimizerStateKeyOf(tensor)));
}

// From a sharded optimizer: each rank writes its rows into zeros, and a sum over the group
// adds exact zeros elsewhere.
WholeState Gather(DistributedOptimizer& sharded, c10d::ProcessGroup& group) {
  WholeState whole;
  for (const ParamShard& shard : sharded.shards()) {
    const auto& state = StateOf(sharded.optimizer(), shard.tensor);
    for (const auto& [key, part] :
         {std::pair{"exp_avg", state.exp_avg()}, std::pair{"exp_avg_sq", state.exp_avg_sq()}}) {
      std::vector<at::Tensor> tensor = {at::zeros(shard.layout.global_shape)};
      tensor[0].narrow(0, shard.row_begin, part.size(0)).copy_(part);
      group.allreduce(tensor)->wait();
      whole[absl::StrCat(shard.name, "/", key)] = tensor[0];
    }
    whole[shard.name + "/step"] = at::scalar_tensor(state.step(), at::kLong);
  }
  whole["lr"] = at::scalar_tensor(sharded.optimizer().param_groups()[0].options().get_lr());
  return whole;
}

WholeState OfWhole(torch::optim::AdamW& adamw, Net& net) {
  WholeState whole;
  for (const auto& item : net.named_parameters()) {
    const auto& state = StateOf(adamw, item.value());
    whole[item.key() + "/exp_avg"] = state.exp_avg().clone();
    whole[item.key() + "/exp_avg_sq"] = state.exp_avg_sq().clone();
    whole[item.key() + "/step"] = at::scalar_tensor(state.step(), at::kLong);
  }
  whole["lr"] = at::scalar_tensor(adamw.param_groups()[0].options().get_lr());
  return whole;
}

void ExpectSame(const WholeState& actual, const WholeState& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (const auto& [key, tensor] : expected) {
    EXPECT_TRUE(at::equal(actual.at(key), tensor)) << key;
  }
}

CheckpointerOptions In(const std::string& dir) {
  CheckpointerOptions options;
  options.checkpoint_dir = dir;
  return options;
}

// Three sharded AdamW steps on `world` ranks (lr 0.0123 from the last), saved at step 3.
WholeState TrainShardedAndSave(int world, const std::string& dir) {
  WholeState saved;
  KEEL_EXPECT_OK(RunOnRanks(world, [&](Rank& r) -> absl::Status {
    Net net;
    std::unique_ptr<DistributedOptimizer> sharded = ShardedAdamW(net, *r.group);
    for (int step = 0; step < 3; ++step) {
      net.Loss((step * world + r.rank) * 4).backward();
      KEEL_RETURN_IF_ERROR(sharded->Wait());
      KEEL_RETURN_IF_ERROR(sharded->Step());
      sharded->ZeroGrad();
    }
    sharded->optimizer().param_groups()[0].options().set_lr(0.0123);
    KEEL_ASSIGN_OR_RETURN(OptimizerState state, OptimizerState::Create(*sharded));
    KEEL_ASSIGN_OR_RETURN(auto checkpointer, Checkpointer::Create(In(dir), r.group.get()));
    KEEL_RETURN_IF_ERROR(checkpointer->Save({{"optim", &state}}, 3, 0));
    WholeState whole = Gather(*sharded, *r.group);
    if (r.rank == 0) saved = whole;
    return absl::OkStatus();
  }));
  return saved;
}

// A fresh sharded optimizer on `world` ranks, loaded strictly from the checkpoint at `path`.
WholeState LoadSharded(int world, const std::string& path) {
  WholeState loaded;
  KEEL_EXPECT_OK(RunOnRanks(world, [&](Rank& r) -> absl::Status {
    Net net;
    std::unique_ptr<DistributedOptimizer> sharded = ShardedAdamW(net, *r.group);
    KEEL_ASSIGN_OR_RETURN(OptimizerState state, OptimizerState::Create(*sharded));
    KEEL_ASSIGN_OR_RETURN(auto checkpointer, Checkpointer::Create(In(path), r.group.get()));
    KEEL_RETURN_IF_ERROR(checkpointer->Load(path, {{"optim", &state}}).status());
    WholeState whole = Gather(*sharded, *r.group);
    if (r.rank == 0) loaded = whole;
    return absl::OkStatus();
  }));
  return loaded;
}

TEST(OptimizerStateShardedTest, ShardedCheckpointsLoadOnAnyNumberOfRanksAndUnsharded) {
  for (int saved_on : {2, 3}) {
    SCOPED_TRACE(absl::StrCat("saved on ", saved_on, " ranks"));
    const std::string dir = NewTempDir("sharded");
    const WholeState saved = TrainShardedAndSave(saved_on, dir);
    ASSERT_FALSE(saved.empty());
    const std::string path = dir + "/step_0000000003";
    for (int world : {1, 2, 3, 4}) {
      SCOPED_TRACE(absl::StrCat("loaded sharded on ", world));
      ExpectSame(LoadSharded(world, path), saved);
    }
    // Unsharded, on one rank: LibTorch's AdamW over the whole parameters.
    Net net;
    torch::optim::AdamW adamw(net.parameters(), Options().lr(0.5));
    KEEL_ASSERT_OK_AND_ASSIGN(OptimizerState state, OptimizerState::Create(net, adamw));
    KEEL_ASSERT_OK_AND_ASSIGN(auto checkpointer, Checkpointer::Create(In(path), nullptr));
    KEEL_ASSERT_OK(checkpointer->Load(path, {{"optim", &state}}).status());
    ExpectSame(OfWhole(adamw, net), saved);
  }
}

TEST(OptimizerStateShardedTest, UnshardedCheckpointsLoadSharded) {
  const std::string dir = NewTempDir("unsharded");
  Net net;
  torch::optim::AdamW adamw(net.parameters(), Options());
  for (int step = 0; step < 2; ++step) {
    net.Loss(step * 4).backward();
    adamw.step();
    adamw.zero_grad();
  }
  KEEL_ASSERT_OK_AND_ASSIGN(OptimizerState state, OptimizerState::Create(net, adamw));
  KEEL_ASSERT_OK_AND_ASSIGN(auto checkpointer, Checkpointer::Create(In(dir), nullptr));
  KEEL_ASSERT_OK(checkpointer->Save({{"optim", &state}}, 2, 0));
  const WholeState saved = OfWhole(adamw, net);
  for (int world : {2, 3, 4}) {
    SCOPED_TRACE(absl::StrCat("loaded sharded on ", world));
    ExpectSame(LoadSharded(world, dir + "/step_0000000002"), saved);
  }
}

// Every optimizer the distributed optimizer accepts can be checkpointed: two sharded steps on
// two ranks, saved, loaded into fresh sharded optimizers, and one more step from each gives the
// same parameters as one more step of the original.
TEST(OptimizerStateShardedTest, EveryKindTheDistributedOptimizerTakesResumesExactly) {
  using Make = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)>;
  const std::vector<std::pair<std::string, Make>> kinds = {
      {"Adam", [](auto t) { return std::make_unique<torch::optim::Adam>(t, 0.1); }},
      {"AdamW", [](auto t) { return std::make_unique<torch::optim::AdamW>(t, 0.1); }},
      {"SGD",
       [](auto t) {
         return std::make_unique<torch::optim::SGD>(t, torch::optim::SGDOptions(0.1).momentum(0.9));
       }},
      {"RMSprop",
       [](auto t) {
         return std::make_unique<torch::optim::RMSprop>(
             t, torch::optim::RMSpropOptions(0.01).momentum(0.5).centered(true));
       }},
      {"Adagrad", [](auto t) { return std::make_unique<torch::optim::Adagrad>(t, 0.1); }},
  };
  for (const auto& [name, make] : kinds) {
    SCOPED_TRACE(name);
    const std::string dir = NewTempDir("kinds");
    std::vector<std::vector<at::Tensor>> continued(2), resumed(2);
    KEEL_ASSERT_OK(RunOnRanks(2, [&, &make = make](Rank& r) -> absl::Status {
      auto build = [&](Net& net) {
        return DistributedOptimizer::Create(net, *r.group,
                                            [&](const std::vector<ParamShard>& shards) {
                                              std::vector<at::Tensor> tensors;
                                              for (const ParamShard& shard : shards)
                                                tensors.push_back(shard.tensor);
                                              return make(tensors);
                                            });
      };
      auto step = [&](Net& net, DistributedOptimizer& optimizer, int k) -> absl::Status {
        net.Loss((k * 2 + r.rank) * 4).backward();
        KEEL_RETURN_IF_ERROR(optimizer.Wait());
        KEEL_RETURN_IF_ERROR(optimizer.Step());
        optimizer.ZeroGrad();
        return absl::OkStatus();
      };
      Net net, fresh;
      KEEL_ASSIGN_OR_RETURN(auto original, build(net));
      KEEL_ASSIGN_OR_RETURN(auto restored, build(fresh));
      for (int k = 0; k < 2; ++k) KEEL_RETURN_IF_ERROR(step(net, *original, k));
      KEEL_ASSIGN_OR_RETURN(OptimizerState saved_state, OptimizerState::Create(*original));
      KEEL_ASSIGN_OR_RETURN(OptimizerState loaded_state, OptimizerState::Create(*restored));
      KEEL_ASSIGN_OR_RETURN(auto checkpointer, Checkpointer::Create(In(dir), r.group.get()));
      KEEL_RETURN_IF_ERROR(checkpointer->Save({{"optim", &saved_state}}, 2, 0));
      KEEL_RETURN_IF_ERROR(
          checkpointer->Load(dir + "/step_0000000002", {{"optim", &loaded_state}}).status());
      {
        at::NoGradGuard no_grad;
        auto from = net.named_parameters();
        for (auto& item : fresh.named_parameters()) item.value().copy_(from[item.key()]);
      }
      KEEL_RETURN_IF_ERROR(step(net, *original, 2));
      KEEL_RETURN_IF_ERROR(step(fresh, *restored, 2));
      for (const at::Tensor& p : net.parameters()) continued[r.rank].push_back(p.detach().clone());
      for (const at::Tensor& p : fresh.parameters()) resumed[r.rank].push_back(p.detach().clone());
      return absl::OkStatus();
    }));
    for (int rank = 0; rank < 2; ++rank) {
      ASSERT_EQ(resumed[rank].size(), continued[rank].size());
      for (size_t i = 0; i < resumed[rank].size(); ++i) {
        EXPECT_TRUE(at::equal(resumed[rank][i], continued[rank][i])) << "parameter " << i;
      }
    }
  }
}

// A DataParallelOptimizer saves the same checkpoint whether its state is sharded or not: the
// same keys with the same global shapes, and the same values.
TEST(OptimizerStateShardedTest, ADataParallelOptimizerSavesAlikeShardedOrNot) {
  std::vector<std::map<std::string, std::vector<int64_t>>> shapes(4);
  std::vector<std::string> values(4);
  KEEL_ASSERT_OK(RunOnRanks(2, [&](Rank& r) -> absl::Status {
    for (bool shard : {false, true}) {
      Net net;
      optim::DataParallelOptimizerOptions options;
      options.use_distributed_optimizer = shard;
      KEEL_ASSIGN_OR_RETURN(auto optimizer,
                            optim::DataParallelOptimizer::Create(
                                gradients::TrainableParameters({&net}), r.group.get(),
                                [](const std::vector<gradients::NamedParameter>& params) {
                                  std::vector<at::Tensor> tensors;
                                  for (const auto& p : params) tensors.push_back(p.param);
                                  return std::make_unique<torch::optim::AdamW>(tensors, Options());
                                },
                                options));
      for (int step = 0; step < 2; ++step) {
        net.Loss((step * 2 + r.rank) * 4).backward();
        KEEL_RETURN_IF_ERROR(optimizer->Wait());
        KEEL_RETURN_IF_ERROR(optimizer->Step());
      }
      KEEL_ASSIGN_OR_RETURN(OptimizerState state, OptimizerState::Create(*optimizer));
      KEEL_ASSIGN_OR_RETURN(State dict, state.StateDict());
      const int slot = r.rank * 2 + (shard ? 1 : 0);
      for (const auto& [key, ref] : dict.tensors) {
        shapes[slot][key] = ref.layout ? ref.layout->global_shape : ref.tensor.sizes().vec();
      }
      values[slot] = dict.values.dump();
    }
    return absl::OkStatus();
  }));
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE(absl::StrCat("rank ", rank));
    EXPECT_FALSE(shapes[rank * 2].empty());
    EXPECT_EQ(shapes[rank * 2 + 1], shapes[rank * 2]);
    EXPECT_EQ(values[rank * 2 + 1], values[rank * 2]);
  }
}

}  // namespace
}  // namespace keel::checkpoint
