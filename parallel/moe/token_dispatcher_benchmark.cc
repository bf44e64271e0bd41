// The all-to-all trip of DispatchToExperts beside the experts' compute, at ep=2 on 2 Gloo ranks
// (processes of one intra-op thread), and beside its baseline in the same run: the same layer
// data-parallel (each rank holds all the experts, no all-to-all). The layer: 4 experts of
// hidden 256 and ffn 1024, 2 per token, Megatron's router; 1024 tokens a rank (8 x 128), the
// loss sum(out^2). Three rounds, the layouts in turn in each; per layout, rank 0's median over
// 20 passes (forward and backward, after 2): the whole pass, its all-to-alls (counts and
// tokens, both ways, forward and backward: CommKind::kExpertDispatch) and the rest (router,
// permutation, expert MLPs, loss); then the median of the rounds.
//
//   bazel run -c opt //parallel/moe:token_dispatcher_benchmark
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "ATen/CPUGeneratorImpl.h"
#include "ATen/Parallel.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "parallel/comm_timers.h"
#include "parallel/moe/router.h"
#include "parallel/moe/token_dispatcher.h"
#include "testing/files.h"
#include "testing/ranks.h"
#include "torch/nn/module.h"

namespace keel::parallel {
namespace {

constexpr int64_t kExperts = 4;
constexpr int64_t kTopK = 2;
constexpr int64_t kHidden = 256;
constexpr int64_t kFfn = 1024;
constexpr int64_t kTokens = 8 * 128;
constexpr int kUntimedPasses = 2;
constexpr int kTimedPasses = 20;
constexpr int kRounds = 3;

at::Tensor Draw(std::vector<int64_t> shape, uint64_t seed, double scale) {
  at::Generator generator = at::detail::createCPUGenerator(seed);
  return at::randn(shape, generator) * scale;
}

// One rank's medians, in milliseconds.
struct Pass {
  double total = 0, all_to_all = 0;
};

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// Rank r's passes through the layer, its experts split over `ep` (nullptr: all of them here).
Pass RunPasses(int rank, c10d::ProcessGroup* ep) {
  RouterOptions options;
  options.num_moe_experts = kExperts;
  options.moe_router_topk = kTopK;
  TopKRouter router(kHidden, options);
  SequentialMlp experts(kExperts, kHidden, kFfn, ep);
  {
    // Every rank draws the whole layer and keeps its experts, as the one-rank layer is.
    at::NoGradGuard no_grad;
    router->named_parameters()["weight"].copy_(Draw({kExperts, kHidden}, 1, 0.1));
    const int64_t local = experts->num_local_experts();
    const int64_t first = ep == nullptr ? 0 : ep->getRank() * local;
    experts->named_parameters()["fc1"].copy_(
        Draw({kExperts, kHidden, kFfn}, 2, 0.05).narrow(0, first, local));
    experts->named_parameters()["fc2"].copy_(
        Draw({kExperts, kFfn, kHidden}, 3, 0.05).narrow(0, first, local));
  }
  const at::Tensor tokens = Draw({kTokens, kHidden}, 10 + rank, 1.0).requires_grad_(true);
  std::vector<double> totals, all_to_alls;
  CommTimers timers;
  CommTimers::Scope counting(timers);
  for (int pass = 0; pass < kUntimedPasses + kTimedPasses; ++pass) {
    const double dispatch_before = timers.Seconds(CommKind::kExpertDispatch);
    const auto begin = std::chrono::steady_clock::now();
    const at::Tensor out = DispatchToExperts(tokens, router->forward(tokens), *experts, ep);
    out.pow(2).sum().backward();
    const std::chrono::duration<double, std::milli> took = std::chrono::steady_clock::now() - begin;
    if (pass < kUntimedPasses) continue;
    totals.push_back(took.count());
    all_to_alls.push_back(1e3 * (timers.Seconds(CommKind::kExpertDispatch) - dispatch_before));
  }
  return {Median(totals), Median(all_to_alls)};
}

// Rank 0's medians of one layout on 2 ranks.
Pass Measure(bool expert_parallel, const std::string& dir) {
  const std::string path = absl::StrCat(dir, expert_parallel ? "/ep2" : "/dp2");
  const std::vector<absl::Status> statuses = testing::RunOnRankProcesses(
      2,
      [&](testing::Rank& r) {
        at::set_num_threads(1);
        const Pass pass = RunPasses(r.rank, expert_parallel ? r.group.get() : nullptr);
        if (r.rank == 0) std::ofstream(path) << pass.total << " " << pass.all_to_all;
        return absl::OkStatus();
      },
      std::chrono::minutes(5));
  for (int rank = 0; rank < 2; ++rank) {
    if (!statuses[rank].ok()) {
      std::cerr << "rank " << rank << ": " << statuses[rank].message() << "\n";
      std::exit(1);
    }
  }
  Pass pass;
  std::ifstream(path) >> pass.total >> pass.all_to_all;
  return pass;
}

int Main() {
  at::set_num_threads(1);
  const std::string dir = testing::NewTempDir("token_dispatcher_benchmark", "/tmp");
  std::cout << "| round | dp=2 pass (ms, baseline: 4 experts a rank) | ep=2 pass (ms, 2 experts a "
               "rank) | ep=2 all-to-alls (ms) | ep=2 router, permutation, experts (ms) |\n"
               "|---|---:|---:|---:|---:|\n";
  std::vector<double> dp, ep, all_to_all, rest;
  for (int round = 1; round <= kRounds; ++round) {
    dp.push_back(Measure(/*expert_parallel=*/false, dir).total);
    const Pass pass = Measure(/*expert_parallel=*/true, dir);
    ep.push_back(pass.total);
    all_to_all.push_back(pass.all_to_all);
    rest.push_back(pass.total - pass.all_to_all);
    std::cout << absl::StrFormat("| %d | %.1f | %.1f | %.1f | %.1f |\n", round, dp.back(),
                                 pass.total, pass.all_to_all, rest.back());
  }
  std::cout << absl::StrFormat("| **median** | %.1f | %.1f | %.1f | %.1f |\n", Median(dp),
                               Median(ep), Median(all_to_all), Median(rest));
  // The tokens each all-to-all of tokens carries out of a rank (and back): k copies of each.
  std::cout << absl::StrFormat("(%.1f MiB leave each rank per all-to-all of tokens)\n",
                               kTokens * kTopK * kHidden * 4 / (1024.0 * 1024.0));
  return 0;
}

}  // namespace
}  // namespace keel::parallel

int main() { return keel::parallel::Main(); }
