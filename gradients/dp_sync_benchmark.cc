// A data-parallel training step on 2 Gloo ranks (threads, one intra-op thread each) over 16
// float32 parameters of 1M elements (16.8M parameters, 64 MiB), loss = sum_i sum(tanh(p_i) * x):
// forward + backward alone, with the sync hooks installed in accumulation mode, synchronised by
// DataParallelGradSync (bucketed all-reduce overlapping backward, then Wait), and synchronised
// naively after backward (one flat all-reduce); plus the bare all-reduce for bytes/s.
// Elementwise rather than an MLP: Debian's LibTorch uses the reference BLAS, whose matmuls would
// take seconds and hide the cost of the synchronisation.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ATen/Parallel.h"
#include "ATen/ops/cat.h"
#include "ATen/ops/full.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "base/torch_status.h"
#include "benchmark/benchmark.h"
#include "gradients/dp_sync.h"
#include "testing/ranks.h"
#include "torch/csrc/distributed/c10d/ProcessGroup.hpp"
#include "torch/nn/module.h"

namespace keel::gradients {
namespace {

constexpr int kWorld = 2;
constexpr int kParams = 16;
constexpr int64_t kNumel = 1 << 20;

class Model : public torch::nn::Module {
 public:
  Model() {
    for (int i = 0; i < kParams; ++i) {
      params_.push_back(register_parameter(absl::StrCat("p", i), at::full({kNumel}, 0.01f)));
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

enum class Mode { kLocal, kAccumulate, kSync, kNaiveSync };

// Rank 0 runs the timed loop; rank 1 runs the same number of steps, so that collectives pair.
void RunStep(benchmark::State& state, Mode mode) {
  at::set_num_threads(1);  // two ranks share the two cores
  int64_t bytes = 0;
  absl::Status status = testing::RunOnRanks(
      kWorld,
      [&](testing::Rank& r) -> absl::Status {
        Model model;
        const at::Tensor input = at::full({kNumel}, 0.5f);
        std::unique_ptr<DataParallelGradSync> sync;
        if (mode == Mode::kAccumulate || mode == Mode::kSync) {
          DataParallelGradSyncOptions options;
          options.bucket_cap_mb = static_cast<double>(state.range(0));
          KEEL_ASSIGN_OR_RETURN(sync, DataParallelGradSync::Create(model, *r.group, options));
          if (mode == Mode::kAccumulate) sync->PrepareForGradAccumulation();
          if (mode == Mode::kSync) bytes = sync->bucket_bytes();
        }
        auto step = [&]() -> absl::Status {
          KEEL_RETURN_IF_ERROR(base::CallTorch(absl::StatusCode::kInternal, "step",
                                               [&] { model.Loss(input).backward(); }));
          if (mode == Mode::kSync) return sync->Wait();
          if (mode != Mode::kNaiveSync) return absl::OkStatus();
          return base::CallTorch(absl::StatusCode::kUnavailable, "naive sync", [&] {
            std::vector<at::Tensor> grads;
            for (const at::Tensor& p : model.parameters()) grads.push_back(p.grad());
            std::vector<at::Tensor> flat = {at::cat(grads)};
            r.group->allreduce(flat)->wait();
            flat[0].div_(kWorld);
            for (int i = 0; i < kParams; ++i) grads[i].copy_(flat[0].narrow(0, i * kNumel, kNumel));
          });
        };
        KEEL_RETURN_IF_ERROR(step());  // warm-up: allocates the gradients
        if (r.rank == 0) {
          for (auto _ : state) KEEL_RETURN_IF_ERROR(step());
        } else {
          for (int64_t i = 0; i < state.max_iterations; ++i) KEEL_RETURN_IF_ERROR(step());
        }
        return absl::OkStatus();
      },
      std::chrono::seconds(120));
  if (!status.ok()) state.SkipWithError(std::string(status.message()).c_str());
  if (mode == Mode::kNaiveSync) bytes = int64_t{kParams} * kNumel * 4;
  if (bytes > 0) state.SetBytesProcessed(state.iterations() * bytes);
}

void BM_StepLocal(benchmark::State& state) { RunStep(state, Mode::kLocal); }
void BM_StepAccumulate(benchmark::State& state) { RunStep(state, Mode::kAccumulate); }
void BM_StepSync(benchmark::State& state) { RunStep(state, Mode::kSync); }
void BM_StepNaiveSync(benchmark::State& state) { RunStep(state, Mode::kNaiveSync); }

// One all-reduce (SUM) of a flat float32 tensor of state.range(0) MiB.
void BM_AllReduce(benchmark::State& state) {
  const int64_t numel = state.range(0) * 1024 * 1024 / 4;
  absl::Status status = testing::RunOnRanks(
      kWorld,
      [&](testing::Rank& r) -> absl::Status {
        std::vector<at::Tensor> tensors = {at::full({numel}, 1.0f)};
        auto once = [&] {
          return base::CallTorch(absl::StatusCode::kUnavailable, "allreduce",
                                 [&] { r.group->allreduce(tensors)->wait(); });
        };
        if (r.rank == 0) {
          for (auto _ : state) KEEL_RETURN_IF_ERROR(once());
        } else {
          for (int64_t i = 0; i < state.max_iterations; ++i) KEEL_RETURN_IF_ERROR(once());
        }
        return absl::OkStatus();
      },
      std::chrono::seconds(120));
  if (!status.ok()) state.SkipWithError(std::string(status.message()).c_str());
  state.SetBytesProcessed(state.iterations() * numel * 4);
}

// Fixed iteration counts: rank 1 must know how many steps rank 0 will time.
BENCHMARK(BM_StepLocal)->Arg(0)->Iterations(10)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_StepAccumulate)->Arg(25)->Iterations(10)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_StepSync)
    ->Arg(4)
    ->Arg(25)
    ->Arg(100)
    ->Iterations(10)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_StepNaiveSync)->Arg(0)->Iterations(10)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_AllReduce)
    ->Arg(1)
    ->Arg(25)
    ->Arg(64)
    ->Iterations(10)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace keel::gradients
