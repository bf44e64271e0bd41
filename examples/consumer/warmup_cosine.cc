// Drives an SGD optimizer with Keel's Megatron-style warmup + cosine schedule and prints
// the learning rate; exits non-zero if the schedule misses its known end points.
#include <cstdio>
#include <vector>

#include "optim/param_scheduler.h"
#include "torch/optim/sgd.h"
#include "torch/types.h"

int main() {
  torch::Tensor weight = torch::zeros({4}, torch::requires_grad());
  torch::optim::SGD optimizer(std::vector<torch::Tensor>{weight}, torch::optim::SGDOptions(0.0));

  keel::optim::ParamSchedulerOptions options;
  options.init_lr = 0.0;
  options.max_lr = 1e-3;
  options.min_lr = 1e-5;
  options.lr_warmup_steps = 10;
  options.lr_decay_steps = 100;
  options.lr_decay_style = keel::optim::LrDecayStyle::kCosine;
  options.start_wd = 0.01;
  options.end_wd = 0.01;
  auto scheduler = keel::optim::ParamScheduler::Create(options, optimizer);
  if (!scheduler.ok()) {
    std::fprintf(stderr, "%s\n", scheduler.status().ToString().c_str());
    return 1;
  }
  double peak = 0.0;
  for (int step = 1; step <= 100; ++step) {
    if (absl::Status stepped = scheduler->Step(1); !stepped.ok()) {
      std::fprintf(stderr, "%s\n", stepped.ToString().c_str());
      return 1;
    }
    const double lr = optimizer.param_groups()[0].options().get_lr();
    if (step == 10) peak = lr;
    if (step % 10 == 0) std::printf("step %3d  lr %.6g\n", step, lr);
  }
  const double last = optimizer.param_groups()[0].options().get_lr();
  return peak == 1e-3 && last == 1e-5 ? 0 : 1;
}
