// The router against Megatron's formulas computed independently here, and the experts split
// over 2 Gloo ranks (threads) against the same layer on one rank: each rank's outputs, and
// slice for slice the gradients, including a rank whose experts receive no tokens; with
// sequence parallelism each rank gets its half of the sequence; over a device group (the
// NCCL-like group of a fake GPU's tensors) nothing goes over the host.
#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "ATen/CPUGeneratorImpl.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "parallel/layout.h"
#include "parallel/moe/router.h"
#include "parallel/moe/token_dispatcher.h"
#include "parallel/tensor_parallel/mappings.h"
#include "testing/ranks.h"
#include "testing/status_matchers.h"
#include "torch/csrc/autograd/function.h"
#include "torch/csrc/autograd/variable.h"

namespace keel::parallel {
namespace {

using ::keel::testing::Rank;
using ::keel::testing::RunOnRanks;
using ::keel::testing::RunOnRanksNcclLike;

constexpr int64_t kExperts = 4;
constexpr int64_t kHidden = 6;
constexpr int64_t kFfn = 8;

at::Tensor Draw(std::vector<int64_t> shape, uint64_t seed) {
  at::Generator generator = at::detail::createCPUGenerator(seed);
  return at::randn(shape, generator);
}

TopKRouter Router(const RouterOptions& options) {
  TopKRouter router(kHidden, options);
  at::NoGradGuard no_grad;
  router->named_parameters()["weight"].copy_(Draw({options.num_moe_experts, kHidden}, 1));
  return router;
}

TEST(TopKRouterTest, TopKWeightsAndTheLoadBalancingLossFollowMegatron) {
  for (const bool pre_softmax : {false, true}) {
    SCOPED_TRACE(pre_softmax);
    RouterOptions options;
    options.num_moe_experts = kExperts;
    options.moe_router_topk = 2;
    options.moe_router_pre_softmax = pre_softmax;
    options.moe_aux_loss_coeff = 0.01;
    TopKRouter router = Router(options);
    const at::Tensor tokens = Draw({5, kHidden}, 2);
    const Routing routing = router->forward(tokens);
    const at::Tensor logits =
        at::matmul(tokens, router->named_parameters()["weight"].detach().t()).to(at::kDouble);
    const at::Tensor softmax = at::softmax(logits, -1);
    std::vector<int64_t> count(kExperts, 0);
    double scores_times_counts = 0.0;
    for (int64_t t = 0; t < 5; ++t) {
      // The two largest logits, by hand.
      std::vector<std::pair<double, int64_t>> ranked;
      for (int64_t e = 0; e < kExperts; ++e) ranked.emplace_back(logits[t][e].item<double>(), e);
      std::sort(ranked.rbegin(), ranked.rend());
      const double a = std::exp(ranked[0].first), b = std::exp(ranked[1].first);
      for (int j = 0; j < 2; ++j) {
        const int64_t e = ranked[j].second;
        EXPECT_EQ(routing.indices[t][j].item<int64_t>(), e);
        const double expected =
            pre_softmax ? softmax[t][e].item<double>() : (j == 0 ? a : b) / (a + b);
        EXPECT_NEAR(routing.probs[t][j].item<double>(), expected, 1e-6);
        ++count[e];
      }
    }
    for (int64_t e = 0; e < kExperts; ++e) {
      EXPECT_EQ(routing.tokens_per_expert[e].item<int64_t>(), count[e]);
      scores_times_counts += count[e] * softmax.select(1, e).sum().item<double>();
    }
    // E x coeff / (k x T^2) x sum_e(tokens_e x sum_t p_te).
    const double aux = kExperts * 0.01 / (2.0 * 25.0) * scores_times_counts;
    EXPECT_NEAR(routing.aux_loss.item<double>(), aux, 1e-7);
  }
}

TEST(TopKRouterTest, TheAuxLossGradientJoinsTheBackwardPassScaled) {
  RouterOptions options;
  options.num_moe_experts = kExperts;
  options.moe_aux_loss_coeff = 0.1;
  TopKRouter router = Router(options);
  const at::Tensor tokens = Draw({5, kHidden}, 3);
  at::Tensor weight = router->named_parameters()["weight"];
  router->forward(tokens).aux_loss.backward();
  const at::Tensor aux_grad = weight.grad().clone();
  weight.mutable_grad().reset();
  // The output carries the aux loss: its own gradient passes unchanged, the aux loss gets 0.25.
  const at::Tensor x = at::ones({3}).requires_grad_(true);
  (AttachAuxLoss(x, router->forward(tokens).aux_loss, 0.25) * 2.0).sum().backward();
  EXPECT_TRUE(at::equal(x.grad(), at::full({3}, 2.0)));
  EXPECT_TRUE(at::allclose(weight.grad(), aux_grad * 0.25, 1e-6, 1e-9));
}

// An expert-parallel rank without a micro-batch routes no token: its load-balancing loss is 0,
// not the 0 / 0 of the formula, and its backward pass leaves the router's gradient finite.
TEST(TopKRouterTest, NoTokensHaveNoLoadToBalance) {
  RouterOptions options;
  options.num_moe_experts = kExperts;
  options.moe_aux_loss_coeff = 0.1;
  TopKRouter router = Router(options);
  const at::Tensor x = at::ones({3}).requires_grad_(true);
  const Routing routing = router->forward(at::zeros({0, kHidden}));
  EXPECT_EQ(routing.aux_loss.item<double>(), 0.0);
  EXPECT_EQ(routing.tokens_per_expert.sum().item<int64_t>(), 0);
  AttachAuxLoss(x, routing.aux_loss, 0.25).sum().backward();
  EXPECT_TRUE(at::equal(x.grad(), at::ones({3})));
}

// The layer on one rank, whose weights every split copies its blocks of.
struct Whole {
  SequentialMlp experts{kExperts, kHidden, kFfn, nullptr};
  Whole() {
    at::NoGradGuard no_grad;
    experts->named_parameters()["fc1"].copy_(Draw({kExperts, kHidden, kFfn}, 4) / 3);
    experts->named_parameters()["fc2"].copy_(Draw({kExperts, kFfn, kHidden}, 5) / 3);
  }
};

// Rank r's tokens and a routing of them: the router's, or (`onto_first_half`) every token to
// experts 0 and 1, which rank 0 holds at ep = 2.
Routing RouteOf(const at::Tensor& tokens, bool onto_first_half) {
  RouterOptions options;
  options.num_moe_experts = kExperts;
  if (!onto_first_half) return Router(options)->forward(tokens);
  Routing routing;
  routing.indices = at::tensor({0, 1}, at::kLong).repeat({tokens.size(0), 1});
  routing.probs = at::full({tokens.size(0), 2}, 0.5);
  return routing;
}

// `routing` with its probabilities a leaf of their own, whose gradient a test reads.
Routing WithLeafProbabilities(Routing routing) {
  routing.probs = routing.probs.detach().clone().requires_grad_(true);
  return routing;
}

// The one-rank layer's output and its tokens' and probabilities' gradients for `tokens` routed
// by `routing`, the loss sum(out^2); its weights' gradients accumulate in `whole`.
struct Expected {
  at::Tensor output, token_grads, prob_grads;
};
Expected OneRank(Whole& whole, const at::Tensor& tokens, const Routing& routing) {
  const at::Tensor x = tokens.clone().requires_grad_(true);
  const Routing leaf = WithLeafProbabilities(routing);
  const at::Tensor out =
      SumExpertParts(DispatchToExperts(x, leaf, *whole.experts, nullptr), *whole.experts, nullptr);
  (out * out).sum().backward();
  return {out.detach(), x.grad(), leaf.probs.grad()};
}

// `experts`' block of `whole_tensor`, the whole of one of `whole`'s tensors of weight `name`
// (itself where `experts` holds the weight whole).
at::Tensor BlockFor(const SequentialMlpImpl& experts, const std::string& name,
                    const at::Tensor& whole_tensor) {
  const auto layouts = experts.LocalLayouts();
  const auto layout = layouts.find(name);
  if (layout == layouts.end()) return whole_tensor;
  return BlockOf(whole_tensor, layout->second, experts.named_parameters()[name].sizes());
}

// Copies into `experts` its blocks of `whole`'s weights.
void CopyBlocks(SequentialMlpImpl& experts, const Whole& whole) {
  const auto whole_params = whole.experts->named_parameters();
  at::NoGradGuard no_grad;
  for (auto& item : experts.named_parameters()) {
    item.value().copy_(BlockFor(experts, item.key(), whole_params[item.key()]));
  }
}

// The names of `experts`' weights whose gradients differ from their blocks of `whole`'s.
std::vector<std::string> WeightsDifferingFrom(SequentialMlpImpl& experts, const Whole& whole) {
  const auto whole_params = whole.experts->named_parameters();
  std::vector<std::string> differing;
  for (const auto& item : experts.named_parameters()) {
    const at::Tensor block = BlockFor(experts, item.key(), whole_params[item.key()].grad());
    if (!at::allclose(item.value().grad(), block, 1e-5, 1e-6)) differing.push_back(item.key());
  }
  return differing;
}

// A split of the layer (`experts`, over `ep`) given the blocks of `whole`'s weights, run on
// `tokens`: what differs from `expected` ("output", "token gradients", "probability
// gradients") and, for each weight, from its block of `whole`'s gradients (by name).
std::vector<std::string> DifferencesFromOneRank(SequentialMlpImpl& experts, const Whole& whole,
                                                const at::Tensor& tokens, const Routing& routing,
                                                c10d::ProcessGroup* ep, const Expected& expected) {
  CopyBlocks(experts, whole);
  const at::Tensor x = tokens.clone().requires_grad_(true);
  const Routing leaf = WithLeafProbabilities(routing);
  const at::Tensor out =
      SumExpertParts(DispatchToExperts(x, leaf, experts, ep), experts, /*sequence_group=*/nullptr);
  (out * out).sum().backward();
  std::vector<std::string> differing;
  if (!at::allclose(out, expected.output, 1e-5, 1e-6)) differing.push_back("output");
  if (!at::allclose(x.grad(), expected.token_grads, 1e-5, 1e-6)) {
    differing.push_back("token gradients");
  }
  if (!at::allclose(leaf.probs.grad(), expected.prob_grads, 1e-5, 1e-6)) {
    differing.push_back("probability gradients");
  }
  for (const std::string& name : WeightsDifferingFrom(experts, whole)) differing.push_back(name);
  return differing;
}

TEST(DispatchToExpertsTest, TwoExpertParallelRanksComputeTheOneRankLayer) {
  for (const bool onto_first_half : {false, true}) {
    SCOPED_TRACE(onto_first_half ? "rank 1's experts get no tokens" : "the router's choice");
    const std::vector<at::Tensor> tokens = {Draw({256, kHidden}, 6), Draw({256, kHidden}, 7)};
    Whole whole;
    std::vector<Expected> expected;
    for (int r = 0; r < 2; ++r) {
      expected.push_back(OneRank(whole, tokens[r], RouteOf(tokens[r], onto_first_half)));
    }
    std::vector<std::vector<std::string>> differing(2);
    KEEL_ASSERT_OK(RunOnRanks(2, [&](Rank& r) -> absl::Status {
      SequentialMlp experts(kExperts, kHidden, kFfn, r.group.get());
      EXPECT_EQ(experts->num_local_experts(), 2);
      differing[r.rank] = DifferencesFromOneRank(*experts, whole, tokens[r.rank],
                                                 RouteOf(tokens[r.rank], onto_first_half),
                                                 r.group.get(), expected[r.rank]);
      return absl::OkStatus();
    }));
    EXPECT_THAT(differing[0], ::testing::IsEmpty());
    EXPECT_THAT(differing[1], ::testing::IsEmpty());
  }
}

// Over an expert tensor-parallel group of 2 (each rank half of every expert's ffn, the same
// tokens on both), the layer is the one-rank layer, experts without tokens included.
TEST(DispatchToExpertsTest, TwoExpertTensorParallelRanksComputeTheOneRankLayer) {
  for (const bool onto_first_half : {false, true}) {
    SCOPED_TRACE(onto_first_half ? "experts 2 and 3 get no tokens" : "the router's choice");
    const at::Tensor tokens = Draw({256, kHidden}, 8);
    Whole whole;
    const Expected expected = OneRank(whole, tokens, RouteOf(tokens, onto_first_half));
    std::vector<std::vector<std::string>> differing(2);
    KEEL_ASSERT_OK(RunOnRanks(2, [&](Rank& r) -> absl::Status {
      SequentialMlp experts(kExperts, kHidden, kFfn, nullptr, r.group.get());
      EXPECT_EQ(experts->named_parameters()["fc1"].sizes(),
                (std::vector<int64_t>{kExperts, kHidden, kFfn / 2}));
      EXPECT_EQ(experts->LocalLayouts().at("fc2").dims.at(0).name, "expert_tp");
      differing[r.rank] = DifferencesFromOneRank(
          *experts, whole, tokens, RouteOf(tokens, onto_first_half), nullptr, expected);
      return absl::OkStatus();
    }));
    EXPECT_THAT(differing[0], ::testing::IsEmpty());
    EXPECT_THAT(differing[1], ::testing::IsEmpty());
  }
}

// With sequence parallelism over 2 ranks, each holding half of every row's sequence: the
// gathered tokens through the experts, split over the group (their parts reduce-scattered) or
// whole on each rank (each keeping its half of the outputs), give each rank its half of the
// one-rank layer's output and of its tokens' gradients, and the one-rank gradients of the
// probabilities and of the weights' blocks.
TEST(SumExpertPartsTest, SequenceParallelRanksGetTheirHalfOfTheOneRankLayer) {
  const at::Tensor rows = Draw({2, 64, kHidden}, 9);  // [batch, seq, hidden]
  const at::Tensor tokens = rows.reshape({-1, kHidden});
  const Routing routing = RouteOf(tokens, /*onto_first_half=*/false);
  for (const bool split : {true, false}) {
    SCOPED_TRACE(split ? "the experts split over the group" : "whole experts on each rank");
    Whole whole;
    const Expected expected = OneRank(whole, tokens, routing);
    std::vector<std::vector<std::string>> differing(2);
    KEEL_ASSERT_OK(RunOnRanks(2, [&](Rank& r) -> absl::Status {
      c10d::ProcessGroup* group = r.group.get();
      SequentialMlp experts(kExperts, kHidden, kFfn, nullptr, split ? group : nullptr);
      CopyBlocks(*experts, whole);
      const at::Tensor x = rows.chunk(2, 1)[r.rank].clone().requires_grad_(true);
      const at::Tensor gathered =
          GatherFromSequenceParallelRegion(x, group, /*tensor_parallel_output_grad=*/false);
      const Routing leaf = WithLeafProbabilities(routing);
      const at::Tensor parts =
          DispatchToExperts(gathered.reshape({-1, kHidden}), leaf, *experts, nullptr);
      const at::Tensor out = SumExpertParts(parts.view_as(gathered), *experts, group);
      (out * out).sum().backward();
      const auto half = [&](const at::Tensor& whole_rows) {
        return whole_rows.view_as(rows).chunk(2, 1)[r.rank];
      };
      if (!at::allclose(out, half(expected.output), 1e-5, 1e-6)) {
        differing[r.rank].push_back("output");
      }
      if (!at::allclose(x.grad(), half(expected.token_grads), 1e-5, 1e-6)) {
        differing[r.rank].push_back("token gradients");
      }
      if (!at::allclose(leaf.probs.grad(), expected.prob_grads, 1e-5, 1e-6)) {
        differing[r.rank].push_back("probability gradients");
      }
      for (const std::string& name : WeightsDifferingFrom(*experts, whole)) {
        differing[r.rank].push_back(name);
      }
      return absl::OkStatus();
    }));
    EXPECT_THAT(differing[0], ::testing::IsEmpty());
    EXPECT_THAT(differing[1], ::testing::IsEmpty());
  }
}

// Over a device group (an NcclLikeGroup: tensors on the fake GPU, host tensors refused as NCCL
// refuses them), the counts and the tokens go to the experts' ranks and back on the device,
// forward and backward, and the layer computes what it computes over Gloo (the fake GPU runs
// the CPU's kernels, or LibTorch's generic ones: up to rounding), including a rank whose experts
// get no tokens.
TEST(DispatchToExpertsTest, OverADeviceGroupNoHostTensorIsExchanged) {
  const std::vector<at::Tensor> tokens = {Draw({64, kHidden}, 6), Draw({64, kHidden}, 7)};
  const Whole whole;
  const auto layer = [&](std::vector<std::map<std::string, at::Tensor>>& results) {
    return [&](Rank& r) -> absl::Status {
      SequentialMlp experts(kExperts, kHidden, kFfn, r.group.get());
      CopyBlocks(*experts, whole);
      experts->to(r.device);
      Routing routing = RouteOf(tokens[r.rank], /*onto_first_half=*/true);
      routing.indices = routing.indices.to(r.device);
      routing.probs = routing.probs.to(r.device);
      const at::Tensor x = tokens[r.rank].to(r.device).detach().requires_grad_(true);
      const at::Tensor out = DispatchToExperts(x, routing, *experts, r.group.get());
      (out * out).sum().backward();
      results[r.rank] = {{"output", out.detach().cpu()},
                         {"token gradients", x.grad().cpu()},
                         {"fc1", experts->named_parameters()["fc1"].grad().cpu()},
                         {"fc2", experts->named_parameters()["fc2"].grad().cpu()}};
      return absl::OkStatus();
    };
  };
  std::vector<std::map<std::string, at::Tensor>> host(2), device(2);
  KEEL_ASSERT_OK(RunOnRanks(2, layer(host)));
  KEEL_ASSERT_OK(RunOnRanksNcclLike(2, layer(device)));
  for (int rank = 0; rank < 2; ++rank) {
    for (const auto& [name, value] : host[rank]) {
      EXPECT_TRUE(at::allclose(device[rank].at(name), value, 1e-5, 1e-6))
          << "rank " << rank << ": " << name;
    }
  }
}

TEST(SequentialMlpTest, ExpertsAreShardedOverEpByIndex) {
  KEEL_ASSERT_OK(RunOnRanks(2, [&](Rank& r) -> absl::Status {
    SequentialMlp experts(kExperts, kHidden, kFfn, r.group.get());
    const auto layouts = experts->LocalLayouts();
    EXPECT_EQ(layouts.at("fc1").global_shape, (std::vector<int64_t>{kExperts, kHidden, kFfn}));
    EXPECT_EQ(layouts.at("fc1").offsets, (std::vector<int64_t>{2 * r.rank, 0, 0}));
    EXPECT_EQ(layouts.at("fc2").offsets, (std::vector<int64_t>{2 * r.rank, 0, 0}));
    EXPECT_EQ(layouts.at("fc2").dims.at(0).name, "ep");
    return absl::OkStatus();
  }));
  EXPECT_TRUE(SequentialMlp(kExperts, kHidden, kFfn, nullptr)->LocalLayouts().empty());
}

// How many gradient functions take `parameter`'s gradient straight to its accumulator in the
// graph behind `output`.
int EdgesInto(const at::Tensor& output, const at::Tensor& parameter) {
  const std::shared_ptr<torch::autograd::Node> accumulator =
      torch::autograd::impl::try_get_grad_accumulator(parameter);
  std::vector<torch::autograd::Node*> stack = {output.grad_fn().get()};
  std::set<torch::autograd::Node*> seen;
  int edges = 0;
  while (!stack.empty()) {
    torch::autograd::Node* node = stack.back();
    stack.pop_back();
    if (node == nullptr || !seen.insert(node).second) continue;
    for (const torch::autograd::Edge& edge : node->next_edges()) {
      if (edge.function == accumulator) ++edges;
      stack.push_back(edge.function.get());
    }
  }
  return edges;
}

// The module against each expert as two separate weights of its own: groups of rows (two per
// expert, as from two source ranks, one of them empty) give the same outputs and gradients, bit
// for bit, and each stacked weight's gradient is built once, not once per group.
TEST(SequentialMlpTest, GroupsOfRowsGoThroughTheirExpertsAndEachWeightIsReadOnce) {
  Whole whole;
  const auto params = whole.experts->named_parameters();
  std::vector<at::Tensor> fc1, fc2;
  for (int64_t e = 0; e < kExperts; ++e) {
    fc1.push_back(params["fc1"][e].detach().clone().requires_grad_(true));
    fc2.push_back(params["fc2"][e].detach().clone().requires_grad_(true));
  }
  const std::vector<int64_t> counts = {3, 0, 2, 4, 1, 2, 0, 3};
  const at::Tensor tokens = Draw({15, kHidden}, 7);
  const at::Tensor x = tokens.clone().requires_grad_(true);
  const at::Tensor out = whole.experts->forward(x, counts);
  EXPECT_EQ(EdgesInto(out, params["fc1"]), 1);
  EXPECT_EQ(EdgesInto(out, params["fc2"]), 1);
  (out * out).sum().backward();

  const at::Tensor x_ref = tokens.clone().requires_grad_(true);
  std::vector<at::Tensor> groups;
  int64_t start = 0;
  for (size_t c = 0; c < counts.size(); ++c) {
    const int64_t e = static_cast<int64_t>(c) % kExperts;
    groups.push_back(
        at::matmul(at::gelu(at::matmul(x_ref.narrow(0, start, counts[c]), fc1[e])), fc2[e]));
    start += counts[c];
  }
  const at::Tensor expected = at::cat(groups);
  (expected * expected).sum().backward();
  EXPECT_TRUE(at::equal(out, expected));
  EXPECT_TRUE(at::equal(x.grad(), x_ref.grad()));
  for (int64_t e = 0; e < kExperts; ++e) {
    // Expert 1's and 2's groups include empty ones.
    EXPECT_TRUE(at::equal(params["fc1"].grad()[e], fc1[e].grad())) << "fc1 of expert " << e;
    EXPECT_TRUE(at::equal(params["fc2"].grad()[e], fc2[e].grad())) << "fc2 of expert " << e;
  }
  EXPECT_THAT(
      [&] {
        whole.experts->forward(x, {3, 4});
      },
      ::testing::ThrowsMessage<c10::Error>(
          ::testing::HasSubstr("the experts' groups of rows (7 in all) must cover the 15 tokens")));
}

TEST(MoeGeometryTest, BadSizesThrowNamingTheNumbers) {
  RouterOptions options;
  options.num_moe_experts = 4;
  options.moe_router_topk = 5;
  EXPECT_THAT([&] { TopKRouter router(kHidden, options); },
              ::testing::ThrowsMessage<c10::Error>(
                  ::testing::HasSubstr("moe_router_topk (5) must be in [1, num_moe_experts (4)]")));
  options.moe_router_topk = 0;
  EXPECT_THAT([&] { TopKRouter router(kHidden, options); },
              ::testing::ThrowsMessage<c10::Error>(::testing::HasSubstr("moe_router_topk (0)")));
  KEEL_ASSERT_OK(RunOnRanks(2, [&](Rank& r) -> absl::Status {
    EXPECT_THAT(
        [&] { SequentialMlp experts(3, kHidden, kFfn, r.group.get()); },
        ::testing::ThrowsMessage<c10::Error>(::testing::HasSubstr(
            "num_experts (3) must be a positive multiple of the expert-parallel size (2)")));
    return absl::OkStatus();
  }));
}

}  // namespace
}  // namespace keel::parallel
