// Preemption flags for the StepScheduler: OS signals caught by an async-signal-safe handler
// (NeMo AutoModel's DistributedSignalHandler, nemo_automodel/components/training/
// signal_handler.py), or a flag set by code. Agreement across ranks is the StepScheduler's.
//
//   KEEL_ASSIGN_OR_RETURN(std::vector<int> signals, ResolveSignals({"SIGTERM", "usr1"}));
//   KEEL_ASSIGN_OR_RETURN(auto flag, SignalPreemptionFlag::Create(signals));
//   if (flag->Received()) { /* checkpoint and exit */ }
#ifndef KEEL_SCHEDULING_PREEMPTION_H_
#define KEEL_SCHEDULING_PREEMPTION_H_

#include <signal.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace keel::scheduling {

// Resolves signal specs as NeMo's resolve_signal does: a case-insensitive name with or
// without "SIG" ("SIGTERM", "usr1"), or, since a C++ list holds one type, a decimal number
// ("15"). Errors: kInvalidArgument for an empty list, an unknown name or number, or a signal
// named twice (NeMo's messages).
[[nodiscard]] absl::StatusOr<std::vector<int>> ResolveSignals(
    const std::vector<std::string>& specs);

// Whether this process (this rank) has been asked to stop. Once true, stays true.
class PreemptionFlag {
 public:
  virtual ~PreemptionFlag() = default;
  virtual bool Received() const = 0;
};

// Becomes true when one of its signals arrives after Create. Create installs a handler that
// only bumps an atomic counter (async-signal-safe); the destructor restores the handlers that
// were installed before. Requires: flags for the same signal are destroyed in reverse order of
// creation, as with nested Python context managers.
class SignalPreemptionFlag final : public PreemptionFlag {
 public:
  // Errors: kInvalidArgument if a signal cannot be caught (SIGKILL, SIGSTOP).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<SignalPreemptionFlag>> Create(
      const std::vector<int>& signals);
  ~SignalPreemptionFlag() override;
  SignalPreemptionFlag(const SignalPreemptionFlag&) = delete;
  SignalPreemptionFlag& operator=(const SignalPreemptionFlag&) = delete;

  bool Received() const override;

 private:
  SignalPreemptionFlag() = default;

  std::vector<int> signals_;
  std::vector<struct sigaction> previous_;
  std::vector<uint64_t> counts_at_install_;
};

// Set by code: a watchdog, a cluster agent's callback, or a test tripping one rank.
class ManualPreemptionFlag final : public PreemptionFlag {
 public:
  void Set() { received_.store(true, std::memory_order_relaxed); }
  bool Received() const override { return received_.load(std::memory_order_relaxed); }

 private:
  std::atomic<bool> received_{false};
};

}  // namespace keel::scheduling

#endif  // KEEL_SCHEDULING_PREEMPTION_H_
