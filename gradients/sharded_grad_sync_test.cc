#include "gradients/sharded_grad_sync.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ATen/core/grad_mode.h"
#include "ATen/ops/allclose.h"
#include "ATen/ops/arange.h"
#include "ATen/ops/equal.h"
#include "ATen/ops/zeros.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "gmock/gmock.h"
#include "gradients/clip_grad_norm.h"
#include "gradients/dp_sync.h"
#include "gtest/gtest.h"
#include "testing/ranks.h"
#include "testing/status_matchers.h"
#include "torch/csrc/distributed/c10d/ProcessGroup.hpp"
#include "torch/nn/module.h"

namespace keel::gradients {
namespace {

using ::absl::StatusCode;
using ::keel::testing::Rank;
using ::keel::testing::RunOnRanks;
using ::keel::testing::RunOnRanksNcclLike;
using ::keel::testing::StatusIs;
using ::testing::HasSubstr;

// Deterministic values without the global generator (ranks run on threads).
at::Tensor Wave(at::IntArrayRef shape, double phase) {
  int64_t numel = 1;
  for (int64_t size : shape) numel *= size;
  return at::arange(numel, at::kFloat).mul(0.37).add(phase).sin().mul(0.5).reshape(shape);
}

// Parameters of many shapes, rows of several widths (and one of none): an embedding, a
// square layer, a bias, a [1] scale, a 3-d kernel and an output layer.
class Net : public torch::nn::Module {
 public:
  explicit Net(double phase) {
    embed_ = register_parameter("embed", Wave({13, 6}, phase));
    w_ = register_parameter("w", Wave({6, 6}, phase + 1));
    b_ = register_parameter("b", Wave({6}, phase + 2));
    scale_ = register_parameter("scale", Wave({1}, phase + 3));
    kernel_ = register_parameter("kernel", Wave({3, 2, 6}, phase + 4));
    out_ = register_parameter("out", Wave({5, 6}, phase + 5));
  }

  // A scalar loss of samples [first, first + count).
  at::Tensor Loss(int64_t first, int64_t count) const {
    const at::Tensor tokens =
        at::arange(first, first + count, at::kLong).remainder(13).to(embed_.device());
    at::Tensor h = embed_.index_select(0, tokens).matmul(w_.t()).add(b_).tanh().mul(scale_);
    h = h.add(kernel_.sum(1).sum(0));
    return h.matmul(out_.t()).pow(2).sum().div(count);
  }

 private:
  at::Tensor embed_, w_, b_, scale_, kernel_, out_;
};

std::vector<at::Tensor> Params(const torch::nn::Module& model) {
  std::vector<at::Tensor> params;
  for (const at::Tensor& p : model.parameters()) params.push_back(p.detach().clone());
  return params;
}

struct ShardInfo {
  int64_t row_begin = 0;
  int64_t rows = 0;
};

// Every rank's shard of every parameter is a block of whole rows; in rank order they tile
// the parameter, and each rank holds about 1/N of every bucket (within a row per part).
TEST(ShardedGradSyncTest, ShardsAreRowBlocksThatTileEachParameterOnce) {
  for (int world : {1, 2, 3, 4}) {
    for (double bucket_cap_mb : {25.0, 1e-6, 3e-4}) {  // one bucket; one per parameter; some
      SCOPED_TRACE(absl::StrCat("world=", world, " bucket_cap_mb=", bucket_cap_mb));
      std::vector<std::map<std::string, ShardInfo>> shards(world);
      std::vector<int64_t> shard_numel(world), bucket_numel(world), buckets(world);
      KEEL_ASSERT_OK(RunOnRanks(world, [&](Rank& r) -> absl::Status {
        Net net(/*phase=*/0);
        DataParallelGradSyncOptions options;
        options.bucket_cap_mb = bucket_cap_mb;
        KEEL_ASSIGN_OR_RETURN(auto sync, ShardedGradSync::Create(net, *r.group, options));
        for (const ParamShard& shard : sync->shards()) {
          shards[r.rank][shard.name] = {shard.row_begin, shard.tensor.size(0)};
          // A view of the parameter's rows.
          const at::Tensor param = net.named_parameters()[shard.name];
          EXPECT_EQ(shard.layout.global_shape, param.sizes().vec());
          EXPECT_EQ(shard.layout.offsets[0], shard.row_begin);
          EXPECT_EQ(shard.layout.dims.size(), 1u);
          if (!shard.layout.dims.empty()) {
            EXPECT_EQ(shard.layout.dims[0].name, "dp");
            EXPECT_EQ(shard.layout.dims[0].group, r.group.get());
          }
          if (shard.tensor.numel() > 0) {
            EXPECT_EQ(shard.tensor.data_ptr(), param[shard.row_begin].data_ptr());
          }
          EXPECT_FALSE(shard.tensor.requires_grad());
        }
        shard_numel[r.rank] = sync->shard_numel();
        bucket_numel[r.rank] = sync->bucket_numel();
        buckets[r.rank] = static_cast<int64_t>(sync->num_buckets());
        return absl::OkStatus();
      }));
      const Net net(0);
      int64_t total = 0;
      for (const auto& item : net.named_parameters()) {
        SCOPED_TRACE(item.key());
        int64_t next_row = 0;
        for (int rank = 0; rank < world; ++rank) {
          const ShardInfo& shard = shards[rank].at(item.key());
          EXPECT_EQ(shard.row_begin, next_row) << "rank " << rank;
          next_row += shard.rows;
        }
        EXPECT_EQ(next_row, item.value().size(0));
        total += item.value().numel();
      }
      const int64_t widest_row = 12;  // kernel's rows: 2 x 6
      for (int rank = 0; rank < world; ++rank) {
        SCOPED_TRACE(absl::StrCat("rank ", rank));
        EXPECT_NEAR(shard_numel[rank], double(total) / world, buckets[rank] * widest_row);
        EXPECT_GE(bucket_numel[rank], total);
        EXPECT_LE(bucket_numel[rank], total + world * buckets[rank] * widest_row);
      }
      // 3e-4 MiB (314 bytes): [out, kernel, scale, b, w] and [embed].
      EXPECT_EQ(buckets[0], bucket_cap_mb > 1 ? 1 : bucket_cap_mb < 1e-4 ? 6 : 2);
    }
  }
}

// A word embedding tied across pipeline stages (shared_embedding) is alone in its bucket, so
// that a first stage ([embed, w]) and a last one ([w2, norm, embed]) cut it into the same rows
// per rank (Megatron's _does_param_require_new_bucket); among other parameters its cut follows
// theirs, here rows [0, 2) of rank 0 on the first stage and [0, 7) on the last.
TEST(ShardedGradSyncTest, ASharedEmbeddingIsCutAlikeWhateverItsNeighbours) {
  for (const bool marked : {true, false}) {
    SCOPED_TRACE(marked ? "marked" : "not marked");
    std::vector<std::vector<ShardInfo>> embed_shards(2);  // [rank]: first stage's, last's
    KEEL_ASSERT_OK(RunOnRanks(2, [&](Rank& r) -> absl::Status {
      const auto parameter = [&](const std::string& name, at::IntArrayRef shape, double phase) {
        NamedParameter p{name, Wave(shape, phase).requires_grad_(true)};
        p.shared_embedding = marked && name == "embed";
        return p;
      };
      const std::vector<std::vector<NamedParameter>> stages = {
          {parameter("embed", {10, 4}, 0), parameter("w", {6, 4}, 1)},
          {parameter("w2", {3, 4}, 2), parameter("norm", {4}, 3), parameter("embed", {10, 4}, 0)}};
      for (const std::vector<NamedParameter>& stage : stages) {
        KEEL_ASSIGN_OR_RETURN(auto sync, ShardedGradSync::Create(stage, *r.group));
        for (const ParamShard& shard : sync->shards()) {
          if (shard.name == "embed") {
            embed_shards[r.rank].push_back({shard.row_begin, shard.tensor.size(0)});
          }
        }
      }
      return absl::OkStatus();
    }));
    for (int rank = 0; rank < 2; ++rank) {
      ASSERT_EQ(embed_shards[rank].size(), 2u);
      const ShardInfo& first = embed_shards[rank][0];
      const ShardInfo& last = embed_shards[rank][1];
      if (marked) {
        EXPECT_EQ(first.row_begin, 5 * rank);
        EXPECT_EQ(first.rows, 5);
        EXPECT_EQ(last.row_begin, first.row_begin);
        EXPECT_EQ(last.rows, first.rows);
      } else {
        EXPECT_EQ(first.rows, rank == 0 ? 2 : 8);
        EXPECT_EQ(last.rows, rank == 0 ? 7 : 3);
      }
    }
  }
}

// With `micro_batches` per step, each rank's loss is divided by global batch / world, as
// DataParallelGradSync's tests do; micro-batch k of rank r holds samples starting there.
int64_t First(int step, int k, int rank, int world, int micro_batches) {
  return ((int64_t{step} * micro_batches + k) * world + rank) * 2;
}

template <typename Sync>
absl::Status Backward(Net& net, Sync& sync, int step, int rank, int world, int micro_batches) {
  sync.PrepareForGradAccumulation();
  for (int k = 0; k < micro_batches; ++k) {
    if (k == micro_batches - 1) sync.PrepareForFinalBackward();
    net.Loss(First(step, k, rank, world, micro_batches), 2).div(micro_batches).backward();
  }
  return sync.Wait();
}

// `actual` equals `expected` to the bit, or else within 1e-6: a few float32 roundings of
// the values of order 1 that the sums add (a sum of N <= 4 of them in another order, or a
// parameter stepped by such sums). Bugs (rows of another rank, a missing step) are >= 1e-3.
void ExpectMatches(const at::Tensor& actual, const at::Tensor& expected, bool exact) {
  if (exact) {
    EXPECT_TRUE(at::equal(actual, expected));
  } else {
    EXPECT_TRUE(at::allclose(actual, expected, /*rtol=*/1e-6, /*atol=*/1e-6));
  }
}

// After Wait, each shard's grad is the rows of DataParallelGradSync's average, on every rank;
// then stepping the shards and AllGather leave every rank with the parameters that the same
// step on the whole averaged gradients gives. On 1 and 2 ranks to the bit (a + b is b + a);
// on 3 and 4 the Gloo all-reduce of the padded buckets adds the ranks' values in another
// order than that of the packed ones, so the sums may differ in their last bit.
TEST(ShardedGradSyncTest, ShardsGetTheAverageAndAllGatherMakesTheStepWhole) {
  for (int world : {1, 2, 3, 4}) {
    for (int micro_batches : {1, 3}) {
      SCOPED_TRACE(absl::StrCat("world=", world, " micro_batches=", micro_batches));
      const bool exact = world <= 2;
      std::vector<std::vector<at::Tensor>> replicated(world), sharded(world);
      KEEL_ASSERT_OK(RunOnRanks(world, [&](Rank& r) -> absl::Status {
        Net reference(/*phase=*/r.rank), net(/*phase=*/r.rank);  // init_sync: rank 0's
        KEEL_ASSIGN_OR_RETURN(auto dp, DataParallelGradSync::Create(reference, *r.group));
        DataParallelGradSyncOptions options;
        options.bucket_cap_mb = 3e-4;
        KEEL_ASSIGN_OR_RETURN(auto sync, ShardedGradSync::Create(net, *r.group, options));
        for (int step = 0; step < 2; ++step) {
          KEEL_RETURN_IF_ERROR(Backward(reference, *dp, step, r.rank, world, micro_batches));
          KEEL_RETURN_IF_ERROR(Backward(net, *sync, step, r.rank, world, micro_batches));
          at::NoGradGuard no_grad;
          for (const ParamShard& shard : sync->shards()) {
            SCOPED_TRACE(absl::StrCat(shard.name, " step ", step, " rank ", r.rank));
            const at::Tensor whole = reference.named_parameters()[shard.name].grad();
            ExpectMatches(shard.tensor.grad(),
                          whole.narrow(0, shard.row_begin, shard.tensor.size(0)), exact);
            shard.tensor.sub_(shard.tensor.grad().mul(0.1));
          }
          for (at::Tensor& p : reference.parameters()) p.sub_(p.grad().mul(0.1));
          KEEL_RETURN_IF_ERROR(sync->AllGather());
          for (auto* model : {static_cast<torch::nn::Module*>(&reference),
                              static_cast<torch::nn::Module*>(&net)}) {
            for (at::Tensor& p : model->parameters()) p.mutable_grad().reset();
          }
        }
        replicated[r.rank] = Params(reference);
        sharded[r.rank] = Params(net);
        return absl::OkStatus();
      }));
      for (int rank = 0; rank < world; ++rank) {
        for (size_t i = 0; i < sharded[0].size(); ++i) {
          SCOPED_TRACE(absl::StrCat("rank ", rank, " parameter ", i));
          EXPECT_TRUE(at::equal(sharded[rank][i], sharded[0][i]));  // the replicas agree
          ExpectMatches(sharded[rank][i], replicated[0][i], exact);
        }
      }
    }
  }
}

// On a device group (an NcclLikeGroup: tensors on the fake GPU, host tensors refused as NCCL
// refuses them), the sync takes NCCL's path, a flat reduce-scatter and all-gather of each
// bucket, and exchanges no host tensor: the shards' gradients and the parameters after the
// all-gather are those of the same step over Gloo, within ExpectMatches' bound (the fake GPU
// runs the CPU's kernels, or LibTorch's generic ones).
TEST(ShardedGradSyncTest, OnADeviceGroupNoHostTensorIsExchanged) {
  constexpr int kWorld = 2;
  const auto step = [](std::vector<std::vector<at::Tensor>>& grads,
                       std::vector<std::vector<at::Tensor>>& params) {
    return [&](Rank& r) -> absl::Status {
      Net net(/*phase=*/r.rank);
      net.to(r.device);
      DataParallelGradSyncOptions options;
      options.bucket_cap_mb = 3e-4;  // two buckets
      KEEL_ASSIGN_OR_RETURN(auto sync, ShardedGradSync::Create(net, *r.group, options));
      KEEL_RETURN_IF_ERROR(Backward(net, *sync, /*step=*/0, r.rank, kWorld, /*micro_batches=*/2));
      at::NoGradGuard no_grad;
      for (const ParamShard& shard : sync->shards()) {
        grads[r.rank].push_back(shard.tensor.grad().cpu());
        shard.tensor.sub_(shard.tensor.grad().mul(0.1));
      }
      KEEL_RETURN_IF_ERROR(sync->AllGather());
      for (const at::Tensor& p : net.parameters()) params[r.rank].push_back(p.detach().cpu());
      return absl::OkStatus();
    };
  };
  std::vector<std::vector<at::Tensor>> host_grads(kWorld), host_params(kWorld);
  std::vector<std::vector<at::Tensor>> device_grads(kWorld), device_params(kWorld);
  KEEL_ASSERT_OK(RunOnRanks(kWorld, step(host_grads, host_params)));
  KEEL_ASSERT_OK(RunOnRanksNcclLike(kWorld, step(device_grads, device_params)));
  for (int rank = 0; rank < kWorld; ++rank) {
    ASSERT_EQ(device_grads[rank].size(), host_grads[rank].size());
    for (size_t i = 0; i < host_grads[rank].size(); ++i) {
      SCOPED_TRACE(absl::StrCat("rank ", rank, " shard ", i));
      ExpectMatches(device_grads[rank][i], host_grads[rank][i], /*exact=*/false);
    }
    for (size_t i = 0; i < host_params[rank].size(); ++i) {
      SCOPED_TRACE(absl::StrCat("rank ", rank, " parameter ", i));
      ExpectMatches(device_params[rank][i], host_params[rank][i], /*exact=*/false);
    }
  }
}

// A rank whose all-gather fails in the middle of its buckets (here copying its rows of a
// parameter that was replaced by a smaller tensor) still launches every bucket's all-gather,
// and every rank fails at once: the failing one with its error, the others naming it, instead
// of waiting for the buckets it never sent.
TEST(ShardedGradSyncTest, AFailureInTheMiddleOfTheAllGatherReachesEveryRank) {
  constexpr int kWorld = 2;
  std::vector<absl::Status> statuses(kWorld);
  KEEL_ASSERT_OK(RunOnRanks(
      kWorld,
      [&](Rank& r) -> absl::Status {
        Net net(/*phase=*/0);
        DataParallelGradSyncOptions options;
        options.bucket_cap_mb = 3e-4;
        KEEL_ASSIGN_OR_RETURN(auto sync, ShardedGradSync::Create(net, *r.group, options));
        EXPECT_EQ(sync->num_buckets(), 2u);
        KEEL_RETURN_IF_ERROR(Backward(net, *sync, /*step=*/0, r.rank, kWorld, 1));
        if (r.rank == 1) {
          // "w" is in the first of the two buckets (buckets hold the parameters in reverse
          // order), and rank 1 owns some of its rows.
          const auto it = std::find_if(sync->shards().begin(), sync->shards().end(),
                                       [](const ParamShard& s) { return s.name == "w"; });
          EXPECT_GT(it->tensor.size(0), 0);
          at::NoGradGuard no_grad;
          net.named_parameters()["w"].set_data(at::zeros({1}));
        }
        statuses[r.rank] = sync->AllGather();
        return absl::OkStatus();
      },
      /*timeout=*/std::chrono::seconds(30)));
  EXPECT_THAT(statuses[1], StatusIs(StatusCode::kInternal,
                                    HasSubstr("copying this rank's rows into parameter bucket")));
  EXPECT_THAT(statuses[0], StatusIs(StatusCode::kAborted,
                                    "rank 1 failed the parameter all-gather; see its error"));
}

// The averaged gradient, whole on every rank, from the shards: each rank writes its rows
// into zeros and a sum over the group adds exact zeros elsewhere.
absl::StatusOr<std::vector<NamedParameter>> WholeGradients(const ShardedGradSync& sync,
                                                           c10d::ProcessGroup& group) {
  std::vector<NamedParameter> whole;
  for (const ParamShard& shard : sync.shards()) {
    at::Tensor grad = at::zeros(shard.layout.global_shape);
    grad.narrow(0, shard.row_begin, shard.tensor.size(0)).copy_(shard.tensor.grad());
    std::vector<at::Tensor> tensors = {grad};
    group.allreduce(tensors)->wait();
    at::Tensor param = at::zeros(shard.layout.global_shape);
    param.mutable_grad() = grad;
    whole.push_back({shard.name, param});
  }
  return whole;
}

// ClipGradNorm over the shards, with their layouts, gives the norm of the whole averaged gradient
// (the same squares, summed in float64 in another grouping, so equal to rounding), and clips
// every shard by the factor the whole gradients get.
TEST(ShardedGradSyncTest, ClippingTheShardsUsesTheWholeNorm) {
  for (int world : {2, 3, 4}) {
    for (double norm_type : {2.0, std::numeric_limits<double>::infinity()}) {
      SCOPED_TRACE(absl::StrCat("world=", world, " norm_type=", norm_type));
      KEEL_ASSERT_OK(RunOnRanks(world, [&](Rank& r) -> absl::Status {
        Net net(/*phase=*/0);
        KEEL_ASSIGN_OR_RETURN(auto sync, ShardedGradSync::Create(net, *r.group));
        KEEL_RETURN_IF_ERROR(Backward(net, *sync, 0, r.rank, world, 1));
        KEEL_ASSIGN_OR_RETURN(std::vector<NamedParameter> whole, WholeGradients(*sync, *r.group));
        ClipGradNormOptions options;
        options.norm_type = norm_type;
        KEEL_ASSIGN_OR_RETURN(at::Tensor expected, ClipGradNorm(0.01, whole, options));
        KEEL_ASSIGN_OR_RETURN(at::Tensor norm,
                              ClipGradNorm(0.01, sync->ShardParameters(), options));
        EXPECT_GT(expected.item<double>(), 0.1);  // so 0.01 clips
        EXPECT_NEAR(norm.item<double>(), expected.item<double>(), 1e-12 * expected.item<double>());
        for (size_t i = 0; i < whole.size(); ++i) {
          const ParamShard& shard = sync->shards()[i];
          EXPECT_TRUE(at::allclose(
              shard.tensor.grad(),
              whole[i].param.grad().narrow(0, shard.row_begin, shard.tensor.size(0)), 1e-6, 0))
              << shard.name;
        }
        return absl::OkStatus();
      }));
    }
  }
}

class Scalar : public torch::nn::Module {
 public:
  Scalar() { register_parameter("temperature", at::ones({})); }
};

TEST(ShardedGradSyncTest, ZeroDimensionalParameterIsRefusedNamingIt) {
  KEEL_ASSERT_OK(RunOnRanks(2, [&](Rank& r) -> absl::Status {
    Scalar model;
    EXPECT_THAT(ShardedGradSync::Create(model, *r.group),
                StatusIs(StatusCode::kInvalidArgument,
                         HasSubstr("parameter 'temperature' is 0-dimensional")));
    return absl::OkStatus();
  }));
}

// The ranks agree before anything is reduced (the machinery DataParallelGradSync shares).
TEST(ShardedGradSyncTest, RanksWithDifferentParametersAreRejected) {
  class Other : public torch::nn::Module {
   public:
    Other() { register_parameter("w", at::ones({4, 2})); }
  };
  KEEL_ASSERT_OK(RunOnRanks(2, [&](Rank& r) -> absl::Status {
    Net net(0);
    Other other;
    absl::StatusOr<std::unique_ptr<ShardedGradSync>> sync =
        r.rank == 0 ? ShardedGradSync::Create(net, *r.group)
                    : ShardedGradSync::Create(other, *r.group);
    EXPECT_THAT(sync, StatusIs(StatusCode::kInvalidArgument, HasSubstr("modules differ")));
    return absl::OkStatus();
  }));
}

}  // namespace
}  // namespace keel::gradients
