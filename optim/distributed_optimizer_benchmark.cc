// Memory and step time of DistributedOptimizer (AdamW's state sharded over the ranks) beside
// its baseline, LibTorch's AdamW over the whole parameters with DataParallelGradSync, on 2
// and 4 Gloo ranks as processes (one intra-op thread each). The model: 8 float32 parameters
// of 2048 x 2048 (33.6M parameters: 128 MiB of weights, 256 MiB of AdamW state), loss
// sum_i sum(tanh(p_i) * x) (elementwise, as dp_sync_benchmark: the reference BLAS would hide
// the rest). Per configuration: the optimizer-state bytes per rank, the bytes of .grad tensors
// a rank holds after backward beside the gradient buckets (which both keep whole; the
// distributed optimizer frees each .grad into them), each rank's peak resident
// memory (VmHWM; tensors unmapped when freed, see RunRank) and its growth since the rank
// started, and rank 0's median step time (backward, gradient reduction, optimizer step,
// all-gather) over 5 steps after 2.
//
//   bazel run -c opt //optim:distributed_optimizer_benchmark
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "ATen/Parallel.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status.h"
#include "base/torch_status.h"
#include "gradients/dp_sync.h"
#include "optim/distributed_optimizer.h"
#include "testing/files.h"
#include "testing/ranks.h"
#include "torch/nn/module.h"
#include "torch/optim/adamw.h"

namespace keel::optim {
namespace {

constexpr int kParams = 8;
constexpr int64_t kSide = 2048;
constexpr int kUntimedSteps = 2;
constexpr int kTimedSteps = 5;
constexpr double kMiB = 1024.0 * 1024.0;

class Model : public torch::nn::Module {
 public:
  Model() {
    for (int i = 0; i < kParams; ++i) {
      params_.push_back(register_parameter(absl::StrCat("p", i), at::full({kSide, kSide}, 0.01f)));
    }
  }
  at::Tensor Loss(const at::Tensor& x) const {
    at::Tensor loss = params_[0].tanh().mul(x).sum();
    for (int i = 1; i < kParams; ++i) loss = loss.add(params_[i].tanh().mul(x).sum());
    return loss;
  }

 private:
  std::vector<at::Tensor> params_;
};

// A /proc/self/status field in KiB ("VmRSS", "VmHWM"), as MiB.
double StatusMiB(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stod(line.substr(field.size() + 1)) / 1024;
  }
  return 0;
}

int64_t AdamWStateBytes(torch::optim::Optimizer& optimizer) {
  int64_t bytes = 0;
  for (const auto& [key, state] : optimizer.state()) {
    const auto& adamw = static_cast<const torch::optim::AdamWParamState&>(*state);
    bytes += adamw.exp_avg().nbytes() + adamw.exp_avg_sq().nbytes();
  }
  return bytes;
}

struct RankResult {
  double state_mib = 0, grad_mib = 0, peak_mib = 0, growth_mib = 0, step_ms = 0;
};

// The bytes of the parameters' .grad tensors, as MiB.
double GradMiB(torch::nn::Module& model) {
  int64_t bytes = 0;
  for (const at::Tensor& p : model.parameters()) {
    if (p.grad().defined()) bytes += p.grad().nbytes();
  }
  return bytes / kMiB;
}

// One rank of one configuration; its result goes to `path`.
absl::Status RunRank(testing::Rank& r, bool sharded, const std::string& path) {
  at::set_num_threads(1);
  // Every tensor of 128 KiB or more in its own mapping, unmapped when freed: without this,
  // glibc raises its threshold past 16 MiB after the first free and keeps freed tensors in
  // the heap, and the resident memory says more about the allocator than about the state.
  mallopt(M_MMAP_THRESHOLD, 128 * 1024);
  const double start_mib = StatusMiB("VmRSS");
  Model model;
  const at::Tensor x = at::full({kSide, kSide}, 0.5f);
  const torch::optim::AdamWOptions options(1e-4);
  std::unique_ptr<DistributedOptimizer> distributed;
  std::unique_ptr<torch::optim::AdamW> adamw;
  std::unique_ptr<gradients::DataParallelGradSync> sync;
  if (sharded) {
    KEEL_ASSIGN_OR_RETURN(distributed,
                          DistributedOptimizer::Create(
                              model, *r.group, [&](const std::vector<gradients::ParamShard>& s) {
                                std::vector<at::Tensor> tensors;
                                for (const auto& shard : s) tensors.push_back(shard.tensor);
                                return std::make_unique<torch::optim::AdamW>(tensors, options);
                              }));
  } else {
    adamw = std::make_unique<torch::optim::AdamW>(model.parameters(), options);
    KEEL_ASSIGN_OR_RETURN(sync, gradients::DataParallelGradSync::Create(model, *r.group));
  }
  std::vector<double> times;
  double grad_mib = 0;
  for (int step = 0; step < kUntimedSteps + kTimedSteps; ++step) {
    const auto begin = std::chrono::steady_clock::now();
    model.Loss(x).backward();
    grad_mib = GradMiB(model);  // beside the buckets, which every path keeps whole
    if (sharded) {
      KEEL_RETURN_IF_ERROR(distributed->Wait());
      KEEL_RETURN_IF_ERROR(distributed->Step());
      distributed->ZeroGrad();
    } else {
      KEEL_RETURN_IF_ERROR(sync->Wait());
      adamw->step();
      // Gradients freed, as DistributedOptimizer::ZeroGrad and torch's zero_grad do.
      for (at::Tensor& p : model.parameters()) p.mutable_grad().reset();
    }
    const std::chrono::duration<double, std::milli> took = std::chrono::steady_clock::now() - begin;
    if (step >= kUntimedSteps) times.push_back(took.count());
  }
  std::sort(times.begin(), times.end());
  const int64_t state = AdamWStateBytes(sharded ? distributed->optimizer() : *adamw);
  const double peak = StatusMiB("VmHWM");
  std::ofstream(path) << state / kMiB << " " << grad_mib << " " << peak << " " << peak - start_mib
                      << " " << times[times.size() / 2];
  return absl::OkStatus();
}

// Every rank's result of one configuration, in rank order.
std::vector<RankResult> Measure(int world, bool sharded, const std::string& dir) {
  const std::string prefix = absl::StrCat(dir, "/", world, sharded ? "_sharded_" : "_whole_");
  const std::vector<absl::Status> statuses = testing::RunOnRankProcesses(
      world, [&](testing::Rank& r) { return RunRank(r, sharded, absl::StrCat(prefix, r.rank)); },
      std::chrono::minutes(5));
  std::vector<RankResult> results(world);
  for (int rank = 0; rank < world; ++rank) {
    if (!statuses[rank].ok()) {
      std::cerr << "rank " << rank << ": " << statuses[rank].message() << "\n";
      std::exit(1);
    }
    std::ifstream in(absl::StrCat(prefix, rank));
    RankResult& result = results[rank];
    in >> result.state_mib >> result.grad_mib >> result.peak_mib >> result.growth_mib >>
        result.step_ms;
  }
  return results;
}

void Print(int world, const char* optimizer, const std::vector<RankResult>& results) {
  double state = 0, grad = 0, peak = 0, growth = 0;
  for (const RankResult& r : results) {
    state = std::max(state, r.state_mib);
    grad = std::max(grad, r.grad_mib);
    peak = std::max(peak, r.peak_mib);
    growth = std::max(growth, r.growth_mib);
  }
  std::cout << absl::StrFormat("| %d | %s | %.1f | %.0f | %.0f | %.0f | %.0f |\n", world, optimizer,
                               state, grad, peak, growth, results[0].step_ms);
}

int Main() {
  at::set_num_threads(1);
  const std::string dir = testing::NewTempDir("distributed_optimizer_benchmark", "/tmp");
  std::cout << "| ranks | optimizer | AdamW state per rank (MiB) | .grad after backward (MiB) "
               "| peak RSS per rank (MiB) | peak - start (MiB) | step (ms, median) |\n"
               "|---:|---|---:|---:|---:|---:|---:|\n";
  for (int world : {2, 4}) {
    const std::vector<RankResult> whole = Measure(world, /*sharded=*/false, dir);
    Print(world, "AdamW + DataParallelGradSync", whole);
    const std::vector<RankResult> sharded = Measure(world, /*sharded=*/true, dir);
    Print(world, "DistributedOptimizer", sharded);
    double saved = whole[0].peak_mib;  // the smallest saving of any rank
    for (int rank = 0; rank < world; ++rank) {
      saved = std::min(saved, whole[rank].peak_mib - sharded[rank].peak_mib);
    }
    std::cout << absl::StrFormat(
        "|  | saving per rank: %.0f MiB of peak; (N-1)/N of the state: %.0f MiB |  |  |  |  |  "
        "|\n",
        saved, whole[0].state_mib * (world - 1) / world);
  }
  return 0;
}

}  // namespace
}  // namespace keel::optim

int main() { return keel::optim::Main(); }
