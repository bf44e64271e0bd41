// Where the trainer's step spends its time: LibTorch's profiler over a few steps
// (logging.profile_steps after the first logging.profile_after_step), its trace written to
// <run_dir>/profile.json (chrome://tracing, Perfetto), and a summary on the log: the device
// kernels and the host operators that took the most time, per step and as a share of the
// profiled steps' wall time.
//
//   StepProfiler profiler(options.logging, options.run_dir, runtime.device);
//   KEEL_RETURN_IF_ERROR(profiler.BeforeStep(step));  // the 1-based step about to run
//   ... the step ...
//   KEEL_RETURN_IF_ERROR(profiler.AfterStep(step, *runtime.log));
#ifndef KEEL_TOOLS_RECIPE_PROFILE_H_
#define KEEL_TOOLS_RECIPE_PROFILE_H_

#include <chrono>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "tools/recipe/options.h"

namespace keel::tools::recipe {

// One operator call or kernel of a profile: its name, whether it ran on a device (a kernel, a
// device copy or set), and how long it took.
struct ProfiledEvent {
  std::string name;
  bool on_device = false;
  uint64_t duration_ns = 0;
};

// The summary of `events` recorded over `steps` steps that took `wall_seconds`: the `top` device
// kernels by total time (with the share of the wall time the device was busy), then the `top`
// host operators ("aten::...") by total time, which includes the operators they call.
std::string SummarizeProfile(const std::vector<ProfiledEvent>& events, double wall_seconds,
                             int64_t steps, int top = 15);

class StepProfiler {
 public:
  // Profiles nothing when options.profile_steps is 0 (on ranks other than 0, callers pass a
  // default LoggingOptions).
  StepProfiler(const LoggingOptions& options, std::string run_dir, at::Device device);

  // Starts the profiler before the first profiled step. Errors: kInternal when LibTorch's
  // profiler throws (another one is on, say).
  [[nodiscard]] absl::Status BeforeStep(int64_t step);
  // After the last profiled step: waits for the device, stops the profiler, writes the trace
  // and the summary to `log`. Errors: kInternal when LibTorch's profiler throws.
  [[nodiscard]] absl::Status AfterStep(int64_t step, std::ostream& log);

 private:
  LoggingOptions options_;
  std::string run_dir_;
  at::Device device_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace keel::tools::recipe

#endif  // KEEL_TOOLS_RECIPE_PROFILE_H_
