// Megatron's gradient_accumulation_fusion over the gradient buckets: Keel's layers add their
// weights' gradients into the main gradients themselves (parallel/main_grad.h), and the main
// gradients the syncs deliver are those of the path through .grad, over accumulation
// micro-batches, one rank's buckets and two ranks' shards.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "absl/status/status.h"
#include "base/status.h"
#include "gmock/gmock.h"
#include "gradients/dp_sync.h"
#include "gradients/parameters.h"
#include "gradients/sharded_grad_sync.h"
#include "gtest/gtest.h"
#include "parallel/tensor_parallel/cross_entropy.h"
#include "parallel/tensor_parallel/layers.h"
#include "testing/ranks.h"
#include "testing/status_matchers.h"
#include "torch/csrc/distributed/c10d/ProcessGroup.hpp"
#include "torch/nn/module.h"

namespace keel::gradients {
namespace {

using ::absl::StatusCode;
using ::keel::testing::Rank;
using ::keel::testing::RunOnRanks;
using ::keel::testing::StatusIs;
using ::testing::HasSubstr;

constexpr int64_t kHidden = 8, kFfn = 12, kVocab = 20, kBatch = 2, kSeq = 5;

// Deterministic values without touching the global torch generator (ranks run on threads).
at::Tensor Wave(int64_t numel, double phase) {
  return at::arange(numel, at::kDouble).mul(0.37).add(phase).sin().mul(0.5);
}

// Each of Keel's linear forms once: a column-parallel layer with a bias, two stacked ones
// without (ForwardStacked), a row-parallel one with a bias, and an output layer whose weight
// is also the embedding (a tied weight: its gradient partly fused, partly through .grad),
// under LinearCrossEntropy whole (chunk_len 0) or in chunks.
class Net : public torch::nn::Module {
 public:
  explicit Net(int64_t chunk_len) : chunk_len_(chunk_len) {
    fc_ = register_module("fc", parallel::ColumnParallelLinear(kHidden, kFfn, nullptr));
    gate_ = register_module("gate", parallel::ColumnParallelLinear(kHidden, kFfn, nullptr,
                                                                  /*bias=*/false));
    up_ = register_module("up",
                          parallel::ColumnParallelLinear(kHidden, kFfn, nullptr, /*bias=*/false));
    proj_ = register_module("proj", parallel::RowParallelLinear(kFfn, kHidden, nullptr));
    head_ = register_parameter("head", at::zeros({kVocab, kHidden}));
    at::NoGradGuard no_grad;
    double phase = 0;
    for (at::Tensor& p : parameters()) p.copy_(Wave(p.numel(), phase += 1).view(p.sizes()));
    to(at::kBFloat16);
    head_ = named_parameters()["head"];
  }

  // The summed float32 losses of micro-batch `index`.
  at::Tensor Loss(int64_t index) {
    const at::Tensor tokens =
        at::arange(kBatch * kSeq, at::kLong).mul(7).add(3 * index).remainder(kVocab);
    const at::Tensor x = at::embedding(head_, tokens.view({kBatch, kSeq}));
    const std::vector<at::Tensor> gate_up =
        parallel::ColumnParallelLinearImpl::ForwardStacked(x, {gate_.get(), up_.get()});
    const at::Tensor y = proj_->forward(at::gelu(fc_->forward(x)) * gate_up[0] + gate_up[1]) + x;
    const at::Tensor labels = tokens.add(1).remainder(kVocab).view({kBatch, kSeq});
    parallel::LinearCrossEntropyOptions options;
    options.chunk_len = chunk_len_;
    return parallel::LinearCrossEntropy(y, head_, labels, nullptr, options).sum();
  }

 private:
  int64_t chunk_len_;
  parallel::ColumnParallelLinear fc_{nullptr}, gate_{nullptr}, up_{nullptr};
  parallel::RowParallelLinear proj_{nullptr};
  at::Tensor head_;
};

DataParallelGradSyncOptions MainGradients(bool fusion) {
  DataParallelGradSyncOptions options;
  options.main_grad_dtype = at::kFloat;
  options.gradient_accumulation_fusion = fusion;
  return options;
}

struct Delivered {
  std::map<std::string, at::Tensor> main_grads;
  std::map<std::string, int> incoming;
};

// Two micro-batches, the second synchronised, on one rank: the main gradients delivered, and
// how many gradients autograd handed each parameter through its hook (the path through .grad).
Delivered OneRankStep(int64_t chunk_len, bool fusion) {
  Net net(chunk_len);
  auto incoming = std::make_shared<std::map<std::string, int>>();
  for (auto& item : net.named_parameters()) {
    item.value().register_hook([incoming, name = item.key()](const at::Tensor& grad) {
      if (grad.defined()) ++(*incoming)[name];
    });
  }
  std::vector<NamedParameter> parameters = TrainableParameters({&net});
  auto sync = DataParallelGradSync::CreateLocal(parameters, MainGradients(fusion));
  EXPECT_TRUE(sync.ok()) << sync.status();
  (*sync)->PrepareForGradAccumulation();
  net.Loss(0).backward();
  (*sync)->PrepareForFinalBackward();
  net.Loss(1).backward();
  EXPECT_TRUE((*sync)->Wait().ok());
  Delivered delivered;
  for (size_t i = 0; i < parameters.size(); ++i) {
    delivered.main_grads[parameters[i].name] = (*sync)->MainGrad(i).clone();
    EXPECT_FALSE(parameters[i].param.grad().defined()) << parameters[i].name;
  }
  delivered.incoming = *incoming;
  return delivered;
}

const std::vector<std::string> kFused = {"fc.weight", "gate.weight", "up.weight",
                                         "proj.weight"};

TEST(GradientAccumulationFusionTest, OneRanksMainGradientsAreThoseThroughGrad) {
  for (const int64_t chunk_len : {int64_t{0}, int64_t{3}}) {
    SCOPED_TRACE(chunk_len == 0 ? "whole logits" : "chunked logits");
    const Delivered plain = OneRankStep(chunk_len, /*fusion=*/false);
    const Delivered fused = OneRankStep(chunk_len, /*fusion=*/true);
    ASSERT_EQ(plain.main_grads.size(), 7u);
    for (const auto& [name, expected] : plain.main_grads) {
      SCOPED_TRACE(name);
      const at::Tensor& got = fused.main_grads.at(name);
      EXPECT_EQ(got.scalar_type(), at::kFloat);
      if (name == "head") {
        // Its output-layer part now stays in float32, where .grad rounded it to bf16 (and
        // the chunked sum to bf16) before adding the embedding's part.
        EXPECT_TRUE(at::allclose(got, expected, /*rtol=*/1e-2, /*atol=*/1e-2));
        EXPECT_GT(got.abs().max().item<double>(), 0.1);
      } else {
        // The same products in the same dtype, added in the same order.
        EXPECT_TRUE(at::equal(got, expected));
      }
      EXPECT_EQ(plain.incoming.at(name), 2);
    }
    for (const std::string& name : kFused) {
      EXPECT_EQ(fused.incoming.count(name), 0u) << name << " came through .grad";
    }
    for (const char* name : {"fc.bias", "proj.bias", "head"}) {
      EXPECT_EQ(fused.incoming.at(name), 2) << name;
    }
  }
}

// Two ranks' shards: the buckets cut some weights' rows between the ranks, and each rank's rows
// of each main gradient are the plain path's.
TEST(GradientAccumulationFusionTest, ShardedMainGradientsAreThoseThroughGrad) {
  std::vector<std::map<std::string, at::Tensor>> plain(2), fused(2);
  std::vector<bool> cut(2, false);
  KEEL_ASSERT_OK(RunOnRanks(2, [&](Rank& r) -> absl::Status {
    for (const bool fusion : {false, true}) {
      Net net(/*chunk_len=*/4);
      KEEL_ASSIGN_OR_RETURN(auto sync,
                            ShardedGradSync::Create(net, *r.group, MainGradients(fusion)));
      sync->PrepareForGradAccumulation();
      net.Loss(r.rank).backward();
      sync->PrepareForFinalBackward();
      net.Loss(2 + r.rank).backward();
      KEEL_RETURN_IF_ERROR(sync->Wait());
      for (const ParamShard& shard : sync->shards()) {
        (fusion ? fused : plain)[r.rank][shard.name] = shard.main_grad.clone();
        const int64_t rows = net.named_parameters()[shard.name].size(0);
        if (shard.main_grad.numel() > 0 && shard.main_grad.size(0) < rows) cut[r.rank] = true;
      }
    }
    return absl::OkStatus();
  }));
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_TRUE(cut[rank]) << "no parameter's rows were cut between the ranks";
    for (const auto& [name, expected] : plain[rank]) {
      SCOPED_TRACE(name);
      const at::Tensor& got = fused[rank].at(name);
      if (name == "head") {
        EXPECT_TRUE(at::allclose(got, expected, /*rtol=*/1e-2, /*atol=*/1e-2));
      } else {
        EXPECT_TRUE(at::equal(got, expected));
      }
    }
  }
}

TEST(GradientAccumulationFusionTest, AFusedGradientAfterTheSyncedBackwardIsAnError) {
  Net net(/*chunk_len=*/0);
  KEEL_ASSERT_OK_AND_ASSIGN(auto sync,
                            DataParallelGradSync::CreateLocal(TrainableParameters({&net}),
                                                              MainGradients(true)));
  net.Loss(0).backward();
  net.Loss(1).backward();
  EXPECT_THAT(sync->Wait(),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("received a second gradient")));
  // The next step starts clean.
  net.Loss(0).backward();
  KEEL_EXPECT_OK(sync->Wait());
}

}  // namespace
}  // namespace keel::gradients
