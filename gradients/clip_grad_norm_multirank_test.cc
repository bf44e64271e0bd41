// Clipping gradients sharded over Gloo ranks (threads) gives the norm and the clipped values
// of the same gradients unsharded on one rank; over device groups (the NCCL-like group of a fake
// GPU's tensors) it exchanges no host tensor.
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "ATen/CPUGeneratorImpl.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "gmock/gmock.h"
#include "gradients/clip_grad_norm.h"
#include "gtest/gtest.h"
#include "parallel/layout.h"
#include "testing/ranks.h"
#include "testing/status_matchers.h"

namespace keel::gradients {
namespace {

using ::keel::parallel::Placement;
using ::keel::testing::Rank;
using ::keel::testing::RunOnRanks;
using ::keel::testing::RunOnRanksNcclLike;

constexpr double kMaxNorm = 1.0;

// The full gradients; integer-valued so that splitting a Partial gradient into per-rank
// parts is exact. A local generator: rank threads must not share the default one.
const std::map<std::string, at::Tensor>& FullGrads() {
  static const auto* const grads = [] {
    at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(/*seed_in=*/3);
    auto draw = [&](std::vector<int64_t> shape) {
      return at::randint(-9, 10, shape, generator, at::kFloat);
    };
    return new std::map<std::string, at::Tensor>{{"w_rows", draw({8, 6})},
                                                 {"w_cols", draw({6, 4})},
                                                 {"p_partial", draw({12})},
                                                 {"r_plain", draw({3})},
                                                 {"b_replicate", draw({4})}};
  }();
  return *grads;
}

NamedParameter Param(const std::string& name, const at::Tensor& grad,
                     const at::Device& device = at::kCPU) {
  at::Tensor param = at::zeros_like(grad).to(device).requires_grad_(true);
  param.mutable_grad() = grad.clone().to(device);
  return {name, param};
}

// What rank `rank` of `world` holds of each full gradient.
at::Tensor LocalGrad(const std::string& name, const at::Tensor& full, int rank, int world) {
  if (name == "w_rows") return full.chunk(world, 0)[rank];
  if (name == "w_cols") return full.chunk(world, 1)[rank];
  if (name == "p_partial") {  // element i belongs to rank i % world; the others hold zeros
    at::Tensor mine = at::arange(full.numel()).remainder(world).eq(rank);
    return full * mine.to(at::kFloat);
  }
  return full;
}

// Each parameter's layout over the tp group (the rest are ordinary local tensors).
std::vector<NamedParameter> WithLayouts(std::vector<NamedParameter> params,
                                        c10d::ProcessGroup* group) {
  const std::map<std::string, Placement> placements = {{"w_rows", Placement::Shard(0)},
                                                       {"w_cols", Placement::Shard(1)},
                                                       {"p_partial", Placement::Partial()},
                                                       {"b_replicate", Placement::Replicate()}};
  for (NamedParameter& p : params) {
    auto it = placements.find(p.name);
    if (it == placements.end()) continue;
    absl::StatusOr<parallel::TensorLayout> layout =
        parallel::EvenlySharded(FullGrads().at(p.name).sizes().vec(), {{"tp", group, it->second}});
    EXPECT_TRUE(layout.ok()) << layout.status();
    p.layout = *layout;
  }
  return params;
}

// NeMo's exact float64 sums, and PyTorch's multi-tensor float32 norms (kForeach: a layout's
// blocks' norm, its p-th powers summed over the shards).
TEST(ClipGradNormMultiRankTest, ShardedPartialAndReplicatedGradsMatchTheUnshardedOnes) {
  FullGrads();  // drawn once, before any rank thread reads it
  for (NormAlgorithm algorithm : {NormAlgorithm::kExact, NormAlgorithm::kForeach})
    for (double norm_type : {2.0, 1.0, 3.0, std::numeric_limits<double>::infinity()}) {
      const bool exact = algorithm == NormAlgorithm::kExact;
      // The unsharded reference on one rank.
      std::map<std::string, at::Tensor> reference;
      std::vector<NamedParameter> full;
      for (const auto& [name, grad] : FullGrads()) full.push_back(Param(name, grad));
      ClipGradNormOptions options;
      options.norm_type = norm_type;
      options.algorithm = algorithm;
      KEEL_ASSERT_OK_AND_ASSIGN(at::Tensor reference_norm, ClipGradNorm(kMaxNorm, full, options));
      for (const NamedParameter& p : full) reference[p.name] = p.param.grad();

      for (int world : {2, 4}) {
        SCOPED_TRACE(absl::StrCat("exact=", exact, " norm_type=", norm_type, " world=", world));
        std::vector<double> norms(world);
        std::vector<std::map<std::string, at::Tensor>> clipped(world);
        KEEL_ASSERT_OK(RunOnRanks(world, [&](Rank& r) -> absl::Status {
          std::vector<NamedParameter> local;
          for (const auto& [name, grad] : FullGrads()) {
            local.push_back(Param(name, LocalGrad(name, grad, r.rank, world)));
          }
          KEEL_ASSIGN_OR_RETURN(at::Tensor norm,
                                ClipGradNorm(kMaxNorm, WithLayouts(local, r.group.get()), options));
          norms[r.rank] = norm.item<double>();
          for (const NamedParameter& p : local) clipped[r.rank][p.name] = p.param.grad();
          return absl::OkStatus();
        }));
        for (int rank = 0; rank < world; ++rank) {
          EXPECT_EQ(norms[rank], norms[0]);  // ranks agree exactly
          // Sharding changes only the summation order: of float64 sums (exact), or of float32
          // norms and their powers (foreach).
          EXPECT_NEAR(norms[rank], reference_norm.item<double>(),
                      (exact ? 1e-12 : 2e-6) * reference_norm.item<double>());
          for (const auto& [name, grad] : FullGrads()) {
            SCOPED_TRACE(name);
            // A Partial gradient becomes the full (replicated) one before clipping.
            const at::Tensor expected = name == "p_partial"
                                            ? reference[name]
                                            : LocalGrad(name, reference[name], rank, world);
            // The clip coefficient may differ in its last float64 bit (exact: float32 results
            // agree to about one float32 ulp) or by the float32 norm's rounding (foreach).
            EXPECT_TRUE(at::allclose(clipped[rank][name], expected, /*rtol=*/exact ? 1e-6 : 4e-6,
                                     /*atol=*/0))
                << clipped[rank][name] << expected;
          }
        }
      }
    }
}

// A rank whose gradients for some parameters were never produced (an expert that received no
// tokens) runs the same collectives as its peers, contributing zeros: every rank returns the
// norm of the gradients with the missing ones counted as zeros, and nothing waits.
TEST(ClipGradNormMultiRankTest, MissingShardedAndPartialGradsCountAsZerosOnEveryRank) {
  FullGrads();
  constexpr int kLacking = 1;  // the rank without w_rows' and p_partial's gradients
  for (double norm_type : {2.0, std::numeric_limits<double>::infinity()}) {
    for (int world : {2, 4}) {
      SCOPED_TRACE(absl::StrCat("norm_type=", norm_type, " world=", world));
      // The unsharded reference: the lacking rank's rows of w_rows and its elements of
      // p_partial are zeros.
      std::vector<NamedParameter> full;
      for (const auto& [name, grad] : FullGrads()) {
        at::Tensor g = grad.clone();
        if (name == "w_rows") g.chunk(world, 0)[kLacking].zero_();
        if (name == "p_partial") g -= LocalGrad(name, grad, kLacking, world);
        full.push_back(Param(name, g));
      }
      ClipGradNormOptions options;
      options.norm_type = norm_type;
      KEEL_ASSERT_OK_AND_ASSIGN(at::Tensor reference, ClipGradNorm(kMaxNorm, full, options));
      at::Tensor reference_partial;
      for (const NamedParameter& p : full) {
        if (p.name == "p_partial") reference_partial = p.param.grad();
      }

      std::vector<double> norms(world);
      std::vector<at::Tensor> partial(world), rows(world);
      KEEL_ASSERT_OK(RunOnRanks(world, [&](Rank& r) -> absl::Status {
        std::vector<NamedParameter> local;
        for (const auto& [name, grad] : FullGrads()) {
          local.push_back(Param(name, LocalGrad(name, grad, r.rank, world)));
          const bool missing = name == "w_rows" || name == "p_partial";
          if (missing && r.rank == kLacking) local.back().param.mutable_grad().reset();
        }
        KEEL_ASSIGN_OR_RETURN(at::Tensor norm,
                              ClipGradNorm(kMaxNorm, WithLayouts(local, r.group.get()), options));
        norms[r.rank] = norm.item<double>();
        for (const NamedParameter& p : local) {
          if (p.name == "p_partial") partial[r.rank] = p.param.grad();
          if (p.name == "w_rows") rows[r.rank] = p.param.grad();
        }
        return absl::OkStatus();
      }));
      for (int rank = 0; rank < world; ++rank) {
        SCOPED_TRACE(absl::StrCat("rank ", rank));
        EXPECT_EQ(norms[rank], norms[0]);
        EXPECT_NEAR(norms[rank], reference.item<double>(), 1e-12 * reference.item<double>());
        // The summed Partial gradient reaches every rank, the lacking one too, clipped alike.
        ASSERT_TRUE(partial[rank].defined());
        EXPECT_TRUE(at::allclose(partial[rank], reference_partial, /*rtol=*/1e-6, /*atol=*/0));
        // A missing sharded gradient stays missing.
        EXPECT_EQ(rows[rank].defined(), rank != kLacking);
      }
    }
  }
}

TEST(ClipGradNormMultiRankTest, TwoPipelineStagesCombineIntoTheUnshardedNorm) {
  for (double norm_type : {2.0, std::numeric_limits<double>::infinity()}) {
    SCOPED_TRACE(norm_type);
    std::vector<NamedParameter> full;
    for (const auto& [name, grad] : FullGrads()) full.push_back(Param(name, grad));
    ClipGradNormOptions options;
    options.norm_type = norm_type;
    KEEL_ASSERT_OK_AND_ASSIGN(at::Tensor reference_norm, ClipGradNorm(kMaxNorm, full, options));

    std::vector<double> norms(2);
    std::vector<at::Tensor> tied(2);
    KEEL_ASSERT_OK(RunOnRanks(2, [&](Rank& r) -> absl::Status {
      // Stage 0 holds the first two parameters (by name), stage 1 the rest and a shared copy of
      // the first (a tied embedding), which the norm must not count twice.
      std::vector<NamedParameter> stage;
      int index = 0;
      for (const auto& [name, grad] : FullGrads()) {
        if ((index++ < 2) == (r.rank == 0)) stage.push_back(Param(name, grad));
      }
      if (r.rank == 1) {
        const auto& [name, grad] = *FullGrads().begin();
        stage.push_back(Param(name, grad));
        stage.back().shared = true;
      }
      ClipGradNormOptions pp = options;
      pp.pp_group = r.group.get();
      KEEL_ASSIGN_OR_RETURN(at::Tensor norm, ClipGradNorm(kMaxNorm, stage, pp));
      norms[r.rank] = norm.item<double>();
      tied[r.rank] = r.rank == 0 ? stage.front().param.grad() : stage.back().param.grad();
      return absl::OkStatus();
    }));
    EXPECT_EQ(norms[0], norms[1]);
    EXPECT_NEAR(norms[0], reference_norm.item<double>(), 1e-12 * reference_norm.item<double>());
    // Both copies are clipped alike.
    EXPECT_TRUE(at::equal(tied[0], tied[1]));
    EXPECT_TRUE(at::equal(tied[0], full.front().param.grad()));
  }
}

// On a device group (an NcclLikeGroup: tensors on the fake GPU, host tensors refused as NCCL
// refuses them): the Partial all-reduces and each layout's reductions exchange no host tensor
// and give the norm and clipped gradients of the same ranks over Gloo (the fake GPU runs the
// CPU's kernels, or LibTorch's generic ones: up to rounding).
TEST(ClipGradNormMultiRankTest, OnADeviceGroupNoHostTensorIsExchanged) {
  FullGrads();
  constexpr int kWorld = 2;
  const auto clip = [](std::vector<double>& norms,
                       std::vector<std::map<std::string, at::Tensor>>& clipped) {
    return [&](Rank& r) -> absl::Status {
      std::vector<NamedParameter> local;
      for (const auto& [name, grad] : FullGrads()) {
        local.push_back(Param(name, LocalGrad(name, grad, r.rank, kWorld), r.device));
      }
      KEEL_ASSIGN_OR_RETURN(at::Tensor norm,
                            ClipGradNorm(kMaxNorm, WithLayouts(local, r.group.get())));
      norms[r.rank] = norm.item<double>();
      for (const NamedParameter& p : local) clipped[r.rank][p.name] = p.param.grad().cpu();
      return absl::OkStatus();
    };
  };
  std::vector<double> host_norms(kWorld), device_norms(kWorld);
  std::vector<std::map<std::string, at::Tensor>> host(kWorld), device(kWorld);
  KEEL_ASSERT_OK(RunOnRanks(kWorld, clip(host_norms, host)));
  KEEL_ASSERT_OK(RunOnRanksNcclLike(kWorld, clip(device_norms, device)));
  for (int rank = 0; rank < kWorld; ++rank) {
    SCOPED_TRACE(absl::StrCat("rank ", rank));
    EXPECT_NEAR(device_norms[rank], host_norms[rank], 1e-12 * host_norms[rank]);
    for (const auto& [name, grad] : host[rank]) {
      EXPECT_TRUE(at::allclose(device[rank].at(name), grad, /*rtol=*/1e-6, /*atol=*/0)) << name;
    }
  }
}

// A pipeline stage without parameters still joins the stages' exchange of the norm, on the
// device the options name: over a device group a host zero would be refused (it was, before
// ClipGradNormOptions::device).
TEST(ClipGradNormMultiRankTest, AStageWithoutParametersExchangesOnTheGroupsDevice) {
  std::vector<NamedParameter> full;
  for (const auto& [name, grad] : FullGrads()) full.push_back(Param(name, grad));
  KEEL_ASSERT_OK_AND_ASSIGN(at::Tensor reference, ClipGradNorm(kMaxNorm, full));
  std::vector<double> norms(2);
  KEEL_ASSERT_OK(RunOnRanksNcclLike(2, [&](Rank& r) -> absl::Status {
    std::vector<NamedParameter> stage;
    if (r.rank == 0) {
      for (const auto& [name, grad] : FullGrads()) stage.push_back(Param(name, grad, r.device));
    }
    ClipGradNormOptions options;
    options.pp_group = r.group.get();
    options.device = r.device;
    KEEL_ASSIGN_OR_RETURN(at::Tensor norm, ClipGradNorm(kMaxNorm, stage, options));
    EXPECT_EQ(norm.device(), r.device);
    norms[r.rank] = norm.item<double>();
    return absl::OkStatus();
  }));
  EXPECT_EQ(norms[0], norms[1]);
  EXPECT_NEAR(norms[0], reference.item<double>(), 1e-12 * reference.item<double>());
}

}  // namespace
}  // namespace keel::gradients
