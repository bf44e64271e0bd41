// The experts' compute, forward and backward, as SequentialMlp runs it (each stacked weight
// unbound once a call), beside the same arithmetic over separate weights, one pair of leaves an
// expert (the floor: no stacked gradient to build), and beside indexing the stacked weights
// once per group of rows (what SequentialMlp did before: backward then builds a zero-filled
// gradient of the whole stack for every group and adds them up). The groups are as
// DispatchToExperts hands them over at ep = 2: [2 source ranks][local experts], 64 rows each,
// hidden 256, ffn 512, float32, the loss sum(out^2); the weights' gradients are dropped after
// every pass. Arguments: the local experts (8, 32).
//
//   bazel run -c opt //parallel/moe:experts_benchmark
#include <cstdint>
#include <vector>

#include "ATen/ATen.h"
#include "ATen/CPUGeneratorImpl.h"
#include "benchmark/benchmark.h"
#include "parallel/moe/token_dispatcher.h"

namespace keel::parallel {
namespace {

enum class Weights { kStacked, kSeparate, kIndexed };

constexpr int64_t kHidden = 256, kFfn = 512, kRows = 64, kSources = 2;

at::Tensor Draw(std::vector<int64_t> shape, uint64_t seed) {
  at::Generator generator = at::detail::createCPUGenerator(seed);
  return at::randn(shape, generator) * 0.05;
}

void BM_Experts(benchmark::State& state, Weights weights) {
  const int64_t local = state.range(0);
  SequentialMlp experts(local, kHidden, kFfn, nullptr);
  auto params = experts->named_parameters();
  {
    at::NoGradGuard no_grad;
    params["fc1"].copy_(Draw({local, kHidden, kFfn}, 1));
    params["fc2"].copy_(Draw({local, kFfn, kHidden}, 2));
  }
  std::vector<at::Tensor> fc1, fc2;  // kSeparate's leaves
  for (int64_t e = 0; e < local; ++e) {
    fc1.push_back(params["fc1"][e].detach().clone().requires_grad_(true));
    fc2.push_back(params["fc2"][e].detach().clone().requires_grad_(true));
  }
  const std::vector<int64_t> counts(kSources * local, kRows);
  const at::Tensor tokens = Draw({kSources * local * kRows, kHidden}, 3);
  const auto through = [&](const at::Tensor& w1, const at::Tensor& w2, int64_t group) {
    return at::matmul(at::gelu(at::matmul(tokens.narrow(0, group * kRows, kRows), w1)), w2);
  };
  for (auto _ : state) {
    at::Tensor out;
    if (weights == Weights::kStacked) {
      out = experts->forward(tokens, counts);
    } else {
      std::vector<at::Tensor> groups;
      for (int64_t c = 0; c < kSources * local; ++c) {
        const int64_t e = c % local;
        groups.push_back(weights == Weights::kSeparate
                             ? through(fc1[e], fc2[e], c)
                             : through(params["fc1"][e], params["fc2"][e], c));
      }
      out = at::cat(groups);
    }
    (out * out).sum().backward();
    for (auto& item : params) item.value().mutable_grad().reset();
    for (at::Tensor& leaf : fc1) leaf.mutable_grad().reset();
    for (at::Tensor& leaf : fc2) leaf.mutable_grad().reset();
  }
  state.counters["rows/s"] = benchmark::Counter(
      static_cast<double>(state.iterations() * tokens.size(0)), benchmark::Counter::kIsRate);
}

BENCHMARK_CAPTURE(BM_Experts, stacked, Weights::kStacked)
    ->Arg(8)
    ->Arg(32)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Experts, separate, Weights::kSeparate)
    ->Arg(8)
    ->Arg(32)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Experts, indexed, Weights::kIndexed)
    ->Arg(8)
    ->Arg(32)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace keel::parallel
