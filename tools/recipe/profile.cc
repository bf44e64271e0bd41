#include "tools/recipe/profile.h"

#include <algorithm>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/files.h"
#include "base/status.h"
#include "base/torch_status.h"
#include "torch/csrc/autograd/profiler_kineto.h"
#include "torch/cuda.h"

namespace keel::tools::recipe {
namespace {

// Runs `f` with the line Kineto logs to std::cerr when it looks for GPUs on a machine without a
// GPU driver ("gpuGetDeviceCount failed with code 35", as an error, though a CPU profile needs
// none) dropped; every other line is passed on, also when `f` throws.
template <typename F>
void WithoutGpuProbeNoise(F&& f) {
  std::ostringstream captured;
  std::streambuf* const original = std::cerr.rdbuf(captured.rdbuf());
  const auto pass_on = [&] {
    std::cerr.rdbuf(original);
    std::istringstream lines(captured.str());
    for (std::string line; std::getline(lines, line);) {
      if (!absl::StrContains(line, "gpuGetDeviceCount failed")) std::cerr << line << "\n";
    }
  };
  try {
    f();
  } catch (...) {
    pass_on();
    throw;
  }
  pass_on();
}

// Starts LibTorch's profiler (Kineto) for this process's operators and, with `cuda`, the
// kernels they launch. Throws c10::Error when a profiler is already on.
void StartProfiler(bool cuda) {
  using torch::profiler::impl::ActivityType;
  std::set<ActivityType> activities{ActivityType::CPU};
  if (cuda) activities.insert(ActivityType::CUDA);
  const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO);
  torch::autograd::profiler::prepareProfiler(config, activities);
  torch::autograd::profiler::enableProfiler(config, activities);
}

// Stops the profiler (of the kernels too with `cuda`), writes its Chrome trace to `trace_path`
// and returns the events. Throws
// c10::Error when none is on.
std::vector<ProfiledEvent> StopProfiler(const std::string& trace_path, bool cuda) {
  std::unique_ptr<torch::autograd::profiler::ProfilerResult> result;
  if (cuda) {
    result = torch::autograd::profiler::disableProfiler();
  } else {  // Kineto asks for the GPUs' properties as it collects the trace
    WithoutGpuProbeNoise([&] { result = torch::autograd::profiler::disableProfiler(); });
  }
  result->save(trace_path);
  std::vector<ProfiledEvent> events;
  for (const torch::autograd::profiler::KinetoEvent& event : result->events()) {
    events.push_back(
        {event.name(), event.deviceType() != c10::DeviceType::CPU, event.durationNs()});
  }
  return events;
}

struct Total {
  uint64_t ns = 0;
  int64_t calls = 0;
};

// The `top` names of `totals` by time, as table rows: ms per step, share of the wall time,
// calls per step, name.
std::string TopRows(const std::map<std::string, Total>& totals, double wall_seconds, int64_t steps,
                    int top) {
  std::vector<std::pair<std::string, Total>> sorted(totals.begin(), totals.end());
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
    return a.second.ns != b.second.ns ? a.second.ns > b.second.ns : a.first < b.first;
  });
  std::string rows = "  ms/step   share  calls/step  name\n";
  for (size_t i = 0; i < sorted.size() && i < static_cast<size_t>(top); ++i) {
    const auto& [name, total] = sorted[i];
    const double seconds = static_cast<double>(total.ns) * 1e-9;
    absl::StrAppendFormat(&rows, "  %7.3f  %5.1f%%  %10.1f  %s\n", seconds * 1e3 / steps,
                          100.0 * seconds / wall_seconds, static_cast<double>(total.calls) / steps,
                          name);
  }
  return rows;
}

}  // namespace

std::string SummarizeProfile(const std::vector<ProfiledEvent>& events, double wall_seconds,
                             int64_t steps, int top) {
  std::map<std::string, Total> device, host;
  uint64_t busy_ns = 0;
  int64_t launches = 0;
  for (const ProfiledEvent& event : events) {
    Total& total = (event.on_device ? device : host)[event.name];
    total.ns += event.duration_ns;
    ++total.calls;
    if (event.on_device) {
      busy_ns += event.duration_ns;
      ++launches;
    }
  }
  std::string summary;
  if (!device.empty()) {
    const double busy = static_cast<double>(busy_ns) * 1e-9;
    absl::StrAppendFormat(&summary,
                          "device: %.3f ms/step busy (%.1f%% of the wall time), %.1f kernels "
                          "and copies per step\n",
                          busy * 1e3 / steps, 100.0 * busy / wall_seconds,
                          static_cast<double>(launches) / steps);
    absl::StrAppend(&summary, TopRows(device, wall_seconds, steps, top));
  }
  absl::StrAppend(&summary, "host operators (each with the operators it calls):\n",
                  TopRows(host, wall_seconds, steps, top));
  return summary;
}

StepProfiler::StepProfiler(const LoggingOptions& options, std::string run_dir, at::Device device)
    : options_(options), run_dir_(std::move(run_dir)), device_(device) {}

absl::Status StepProfiler::BeforeStep(int64_t step) {
  if (options_.profile_steps == 0 || step != options_.profile_after_step + 1) {
    return absl::OkStatus();
  }
  KEEL_RETURN_IF_ERROR(base::CallTorch(absl::StatusCode::kInternal, "starting the profiler", [&] {
    if (device_.is_cuda()) torch::cuda::synchronize(device_.index());
    StartProfiler(/*cuda=*/device_.is_cuda());
  }));
  start_ = std::chrono::steady_clock::now();
  return absl::OkStatus();
}

absl::Status StepProfiler::AfterStep(int64_t step, std::ostream& log) {
  const int64_t last = options_.profile_after_step + options_.profile_steps;
  if (options_.profile_steps == 0 || step != last) return absl::OkStatus();
  const std::string trace = base::JoinPath(run_dir_, "profile.json");
  std::vector<ProfiledEvent> events;
  double seconds = 0.0;
  KEEL_RETURN_IF_ERROR(base::CallTorch(absl::StatusCode::kInternal, "profiling the steps", [&] {
    if (device_.is_cuda()) torch::cuda::synchronize(device_.index());
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    events = StopProfiler(trace, /*cuda=*/device_.is_cuda());
  }));
  log << "profile of steps " << options_.profile_after_step + 1 << "-" << last << " ("
      << options_.profile_steps << " steps, " << seconds << " s; trace: " << trace << ")\n"
      << SummarizeProfile(events, seconds, options_.profile_steps);
  return absl::OkStatus();
}

}  // namespace keel::tools::recipe
