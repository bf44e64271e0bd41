// Wall-clock time the parallel blocks spend communicating, by kind, for one training run (or
// one benchmark): the tensor-parallel collectives (tensor_parallel/mappings.h), the pipeline's
// exchanges with the neighbouring stages, its bubble included (pipeline_parallel/
// schedules.h), and the experts' all-to-alls (moe/token_dispatcher.h). A run installs its set
// for as long as it trains; the blocks add to the installed set, if any (one per process at a
// time: the blocks' autograd functions have no other way to reach it). Thread-safe.
//
//   keel::parallel::CommTimers timers;
//   {
//     keel::parallel::CommTimers::Scope counting(timers);
//     ...  // train
//   }
//   double tp = timers.Seconds(keel::parallel::CommKind::kTensorParallel);
#ifndef KEEL_PARALLEL_COMM_TIMERS_H_
#define KEEL_PARALLEL_COMM_TIMERS_H_

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <utility>

namespace keel::parallel {

enum class CommKind { kTensorParallel, kPipeline, kExpertDispatch };

class CommTimers {
 public:
  CommTimers() = default;
  CommTimers(const CommTimers&) = delete;
  CommTimers& operator=(const CommTimers&) = delete;

  // Seconds counted for `kind` so far.
  double Seconds(CommKind kind) const {
    return 1e-9 * static_cast<double>(nanoseconds_[Index(kind)].load());
  }

  // Makes `timers` the set the blocks add to until destroyed, then the one before it again.
  // Requires: `timers` outlives the scope; scopes end in the reverse order they began.
  class Scope {
   public:
    explicit Scope(CommTimers& timers);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    CommTimers* previous_;
  };

  // Runs `fn`, adding its wall-clock time to the installed set's `kind` (none installed:
  // only runs it).
  template <typename Fn>
  static void Time(CommKind kind, Fn&& fn) {
    CommTimers* timers = Installed();
    if (timers == nullptr) {
      std::forward<Fn>(fn)();
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    std::forward<Fn>(fn)();
    timers->nanoseconds_[Index(kind)] += std::chrono::duration_cast<std::chrono::nanoseconds>(
                                             std::chrono::steady_clock::now() - start)
                                             .count();
  }

 private:
  static CommTimers* Installed();
  static constexpr size_t Index(CommKind kind) { return static_cast<size_t>(kind); }

  std::array<std::atomic<int64_t>, 3> nanoseconds_{};
};

}  // namespace keel::parallel

#endif  // KEEL_PARALLEL_COMM_TIMERS_H_
