// A hang watchdog per rank: the training loop marks its progress (Enter: a step and a phase),
// a thread publishes this rank's state in the rendezvous store, and when the phase has not
// changed for the hang timeout it reads every rank's state, prints which ranks have not arrived
// where this one waits (a stopped or dead process: its state no longer refreshed) and what
// every rank is doing, and ends the process (kHangExitCode), so that a job ends instead of
// holding its GPUs until a collective's timeout. No collective and no device work: a thread,
// a mutex per Enter, one store write per second.
//
//   KEEL_ASSIGN_OR_RETURN(auto watchdog, HangWatchdog::Start(runtime, options));
//   watchdog->Enter(step, Phase::kForwardBackward);
#ifndef KEEL_TOOLS_RECIPE_WATCHDOG_H_
#define KEEL_TOOLS_RECIPE_WATCHDOG_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "absl/strings/string_view.h"

namespace c10d {
class Store;
}  // namespace c10d

namespace keel::tools::recipe {

// The exit code of a rank the watchdog ends (tools/cli/exit_code.h lists it).
inline constexpr int kHangExitCode = 3;

// What a rank is doing, in the order a step does it.
enum class Phase {
  kBatches,          // reading the step's batches, and summing their label tokens over ranks
  kForwardBackward,  // the forward and backward passes (tensor-, pipeline-, expert-parallel)
  kGradientSync,     // waiting for the data-parallel gradient reduction
  kStepEnd,          // the loss and norm over ranks, clipping, the optimizer step
  kValidation,       // a validation batch
  kCheckpoint,       // saving a checkpoint
  kReporting,        // logging and recording the step
  kFinishing,        // waiting for the last checkpoint
};

// How the phase reads in a report ("the forward and backward passes").
absl::string_view PhaseName(Phase phase);

struct WatchdogOptions {
  // distributed.hang_timeout_seconds: no phase change for this long is a hang; 0 turns the
  // watchdog off. Default: nullopt, derived: max(floor_seconds, factor x the longest phase
  // seen so far).
  std::optional<double> timeout_seconds;
  double floor_seconds = 300.0;
  double factor = 10.0;
  // How often the state is published and the timeout checked. Default: 1 s.
  std::chrono::milliseconds publish_every = std::chrono::seconds(1);
  // How long a report waits for the store (whose host may be the stopped rank) before it
  // reports without the other ranks' states; a rank that is not the reporter also waits, at
  // most half of it, until the reporter has read them (the store's host must not end the
  // store under it). Default: 5 s.
  std::chrono::milliseconds store_wait = std::chrono::seconds(5);
  // Called with the report on a hang, on the watchdog's thread. Default: print it to stderr
  // and end the process with kHangExitCode.
  std::function<void(const std::string& report)> on_hang;
};

class HangWatchdog {
 public:
  // Starts the threads for `rank` of `world_size`: one checks the timeout, one publishes under
  // "keel/watchdog/" in `store` (nullptr: a single process, whose report names only itself),
  // so that a store that stops answering (its host stopped) delays no check. Requires:
  // `store` outlives the watchdog (and, after a report that gave up waiting for it, the
  // process: the thread that reads it is left behind).
  HangWatchdog(int rank, int world_size, c10d::Store* store, WatchdogOptions options);
  // Stops the threads.
  ~HangWatchdog();
  HangWatchdog(const HangWatchdog&) = delete;
  HangWatchdog& operator=(const HangWatchdog&) = delete;

  // This rank is now in `phase` of step `step` (the step being run, from 1): progress, even
  // when the phase is the one it was in (a validation batch after another).
  void Enter(int64_t step, Phase phase);

  // The timeout in force now, in seconds (0: off).
  double timeout_seconds() const;

 private:
  void Watch();
  void Publish();
  // This rank's state as the store holds it. Requires: mutex_ held.
  std::string Encode(std::chrono::system_clock::time_point now) const;
  std::string Report(double stalled_seconds);

  const int rank_;
  const int world_size_;
  c10d::Store* const store_;
  const WatchdogOptions options_;
  mutable std::mutex mutex_;
  std::condition_variable stop_requested_;
  bool stop_ = false;
  int64_t step_ = 0;
  Phase phase_ = Phase::kBatches;
  std::chrono::steady_clock::time_point entered_;
  std::chrono::system_clock::time_point entered_wall_;
  // The longest a phase has lasted, for the derived timeout.
  std::chrono::steady_clock::duration longest_{};
  std::thread watcher_;
  std::thread publisher_;
};

}  // namespace keel::tools::recipe

#endif  // KEEL_TOOLS_RECIPE_WATCHDOG_H_
