#include "scheduling/preemption.h"

#include <cctype>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "base/files.h"

namespace keel::scheduling {
namespace {

// Python's signal.Signals members on Linux, aliases included.
struct SignalName {
  const char* name;
  int number;
};
const SignalName kSignals[] = {
    {"SIGHUP", SIGHUP},       {"SIGINT", SIGINT},       {"SIGQUIT", SIGQUIT},
    {"SIGILL", SIGILL},       {"SIGTRAP", SIGTRAP},     {"SIGABRT", SIGABRT},
    {"SIGIOT", SIGIOT},       {"SIGBUS", SIGBUS},       {"SIGFPE", SIGFPE},
    {"SIGKILL", SIGKILL},     {"SIGUSR1", SIGUSR1},     {"SIGSEGV", SIGSEGV},
    {"SIGUSR2", SIGUSR2},     {"SIGPIPE", SIGPIPE},     {"SIGALRM", SIGALRM},
    {"SIGTERM", SIGTERM},     {"SIGSTKFLT", SIGSTKFLT}, {"SIGCHLD", SIGCHLD},
    {"SIGCLD", SIGCHLD},      {"SIGCONT", SIGCONT},     {"SIGSTOP", SIGSTOP},
    {"SIGTSTP", SIGTSTP},     {"SIGTTIN", SIGTTIN},     {"SIGTTOU", SIGTTOU},
    {"SIGURG", SIGURG},       {"SIGXCPU", SIGXCPU},     {"SIGXFSZ", SIGXFSZ},
    {"SIGVTALRM", SIGVTALRM}, {"SIGPROF", SIGPROF},     {"SIGWINCH", SIGWINCH},
    {"SIGIO", SIGIO},         {"SIGPOLL", SIGPOLL},     {"SIGPWR", SIGPWR},
    {"SIGSYS", SIGSYS},       {"SIGRTMIN", 34},         {"SIGRTMAX", 64},
};

// The canonical (first) name of a signal number, or nullptr if Python has no member for it.
const char* CanonicalName(int number) {
  for (const SignalName& entry : kSignals) {
    if (entry.number == number) return entry.name;
  }
  return nullptr;
}

// Received-signal counts, bumped by the handler. Lock-free atomics are async-signal-safe.
std::atomic<uint64_t> g_signal_counts[65];
static_assert(std::atomic<uint64_t>::is_always_lock_free);

void CountSignal(int signal_number) {
  if (signal_number > 0 && signal_number < 65) {
    g_signal_counts[signal_number].fetch_add(1, std::memory_order_relaxed);
  }
}

absl::StatusOr<int> ResolveSignal(const std::string& spec) {
  int number = 0;
  if (absl::SimpleAtoi(spec, &number)) {
    if (CanonicalName(number) == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("Invalid signal number: ", number));
    }
    return number;
  }
  std::string name = absl::AsciiStrToUpper(absl::StripAsciiWhitespace(spec));
  if (!absl::StartsWith(name, "SIG")) name = absl::StrCat("SIG", name);
  for (const SignalName& entry : kSignals) {
    if (name == entry.name) return entry.number;
  }
  return absl::InvalidArgumentError(absl::StrCat("Unknown signal name: '", spec, "'"));
}

}  // namespace

absl::StatusOr<std::vector<int>> ResolveSignals(const std::vector<std::string>& specs) {
  std::vector<int> signals;
  for (const std::string& spec : specs) {
    absl::StatusOr<int> signal_number = ResolveSignal(spec);
    if (!signal_number.ok()) return signal_number.status();
    signals.push_back(*signal_number);
  }
  if (signals.empty()) return absl::InvalidArgumentError("At least one signal must be provided");
  for (size_t i = 0; i < signals.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (signals[i] != signals[j]) continue;
      std::vector<std::string> names;
      for (int s : signals) names.push_back(absl::StrCat("'", CanonicalName(s), "'"));
      return absl::InvalidArgumentError(
          absl::StrCat("Duplicate signals provided: [", absl::StrJoin(names, ", "), "]"));
    }
  }
  return signals;
}

absl::StatusOr<std::unique_ptr<SignalPreemptionFlag>> SignalPreemptionFlag::Create(
    const std::vector<int>& signals) {
  std::unique_ptr<SignalPreemptionFlag> flag(new SignalPreemptionFlag());
  struct sigaction action;
  std::memset(&action, 0, sizeof(action));
  action.sa_handler = &CountSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int signal_number : signals) {
    if (signal_number <= 0 || signal_number >= 65) {
      return absl::InvalidArgumentError(absl::StrCat("Invalid signal number: ", signal_number));
    }
    const uint64_t count = g_signal_counts[signal_number].load(std::memory_order_relaxed);
    struct sigaction previous;
    if (sigaction(signal_number, &action, &previous) != 0) {
      // The destructor restores the handlers installed so far.
      return base::ErrnoStatus(
          errno, "cannot handle signal",
          absl::StrCat(signal_number, " (", CanonicalName(signal_number), ")"));
    }
    flag->signals_.push_back(signal_number);
    flag->previous_.push_back(previous);
    flag->counts_at_install_.push_back(count);
  }
  return flag;
}

SignalPreemptionFlag::~SignalPreemptionFlag() {
  for (size_t i = signals_.size(); i-- > 0;) sigaction(signals_[i], &previous_[i], nullptr);
}

bool SignalPreemptionFlag::Received() const {
  for (size_t i = 0; i < signals_.size(); ++i) {
    if (g_signal_counts[signals_[i]].load(std::memory_order_relaxed) != counts_at_install_[i]) {
      return true;
    }
  }
  return false;
}

}  // namespace keel::scheduling
