#include "tools/recipe/watchdog.h"

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "torch/csrc/distributed/c10d/Store.hpp"

namespace keel::tools::recipe {
namespace {

using SteadyClock = std::chrono::steady_clock;
using WallClock = std::chrono::system_clock;

constexpr char kKeyPrefix[] = "keel/watchdog/";

int64_t Milliseconds(WallClock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
}

double Seconds(SteadyClock::duration d) { return std::chrono::duration<double>(d).count(); }

// One rank's published state: when it was published, the step, the phase and when the phase
// began (milliseconds since the epoch).
struct RankState {
  int64_t published_ms = 0;
  int64_t step = 0;
  Phase phase = Phase::kBatches;
  int64_t entered_ms = 0;
};

std::optional<RankState> Decode(const std::vector<uint8_t>& bytes) {
  const std::vector<std::string> parts =
      absl::StrSplit(std::string(bytes.begin(), bytes.end()), '|');
  RankState state;
  int phase = 0;
  if (parts.size() != 4 || !absl::SimpleAtoi(parts[0], &state.published_ms) ||
      !absl::SimpleAtoi(parts[1], &state.step) || !absl::SimpleAtoi(parts[2], &phase) ||
      !absl::SimpleAtoi(parts[3], &state.entered_ms) || phase < 0 ||
      phase > static_cast<int>(Phase::kFinishing)) {
    return std::nullopt;
  }
  state.phase = static_cast<Phase>(phase);
  return state;
}

// Whether `a` is behind `b` in the order a run goes through its steps and phases.
bool Behind(const RankState& a, const RankState& b) {
  return a.step != b.step ? a.step < b.step : a.phase < b.phase;
}

std::string Describe(const RankState& state, int64_t now_ms) {
  return absl::StrFormat("step %d, %s for %.1f s", state.step, PhaseName(state.phase),
                         1e-3 * static_cast<double>(now_ms - state.entered_ms));
}

}  // namespace

absl::string_view PhaseName(Phase phase) {
  switch (phase) {
    case Phase::kBatches:
      return "reading the step's batches";
    case Phase::kForwardBackward:
      return "the forward and backward passes";
    case Phase::kGradientSync:
      return "waiting for the data-parallel gradient reduction";
    case Phase::kStepEnd:
      return "the step's loss and gradient norm over the ranks, clipping and the optimizer step";
    case Phase::kValidation:
      return "validation";
    case Phase::kCheckpoint:
      return "saving a checkpoint";
    case Phase::kReporting:
      return "logging the step";
    case Phase::kFinishing:
      return "waiting for the last checkpoint";
  }
  return "an unknown phase";
}

HangWatchdog::HangWatchdog(int rank, int world_size, c10d::Store* store, WatchdogOptions options)
    : rank_(rank),
      world_size_(world_size),
      store_(store),
      options_(std::move(options)),
      entered_(SteadyClock::now()),
      entered_wall_(WallClock::now()) {
  if (options_.timeout_seconds == 0.0) return;  // off
  watcher_ = std::thread([this] { Watch(); });
  if (store_ != nullptr) publisher_ = std::thread([this] { Publish(); });
}

HangWatchdog::~HangWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  stop_requested_.notify_all();
  if (watcher_.joinable()) watcher_.join();
  if (publisher_.joinable()) publisher_.join();
}

void HangWatchdog::Enter(int64_t step, Phase phase) {
  const SteadyClock::time_point now = SteadyClock::now();
  std::lock_guard<std::mutex> lock(mutex_);
  longest_ = std::max(longest_, now - entered_);
  step_ = step;
  phase_ = phase;
  entered_ = now;
  entered_wall_ = WallClock::now();
}

double HangWatchdog::timeout_seconds() const {
  if (options_.timeout_seconds.has_value()) return *options_.timeout_seconds;
  std::lock_guard<std::mutex> lock(mutex_);
  return std::max(options_.floor_seconds, options_.factor * Seconds(longest_));
}

std::string HangWatchdog::Encode(WallClock::time_point now) const {
  return absl::StrCat(Milliseconds(now), "|", step_, "|", static_cast<int>(phase_), "|",
                      Milliseconds(entered_wall_));
}

void HangWatchdog::Publish() {
  const std::string key = absl::StrCat(kKeyPrefix, rank_);
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_requested_.wait_for(lock, options_.publish_every, [this] { return stop_; })) {
    if (step_ == 0) continue;  // nothing entered yet
    const std::string state = Encode(WallClock::now());
    lock.unlock();
    try {
      store_->set(key, std::vector<uint8_t>(state.begin(), state.end()));
    } catch (const std::exception&) {
      // The store is gone (its host ended): the collectives fail on their own.
    }
    lock.lock();
  }
}

void HangWatchdog::Watch() {
  // A gap between two checks far longer than the interval means this process was stopped
  // (a job suspended, then continued): the time it was stopped is no rank's hang.
  const SteadyClock::duration suspended =
      std::max<SteadyClock::duration>(5 * options_.publish_every, std::chrono::seconds(5));
  SteadyClock::time_point last_check = SteadyClock::now();
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_requested_.wait_for(lock, options_.publish_every, [this] { return stop_; })) {
    const SteadyClock::time_point now = SteadyClock::now();
    if (now - last_check > suspended) entered_ += now - last_check - options_.publish_every;
    last_check = now;
    const double stalled = Seconds(now - entered_);
    lock.unlock();
    const double timeout = timeout_seconds();
    if (timeout > 0 && stalled > timeout) {
      const std::string report = Report(stalled);
      if (options_.on_hang) {
        options_.on_hang(report);
        return;
      }
      std::cerr << report << std::endl;
      std::_Exit(kHangExitCode);
    }
    lock.lock();
  }
}

namespace {

// What a report reads from the store, on a thread of its own (the store may not answer).
struct Gathered {
  std::mutex mutex;
  std::condition_variable done_cv;
  bool done = false;
  // Whether this rank is the first to report, and every rank's state (nullopt: none).
  bool reporter = true;
  std::vector<std::optional<RankState>> states;
  // Why a rank's state could not be read ("" when it was, or was never published).
  std::vector<std::string> errors;
};

// Every rank's state, read by the first rank to ask (the reporter); the others wait, at most
// `wait`, until it has read them, so that the rank serving the store (rank 0 under
// tools:launch) does not end the store under the reporter.
void Gather(c10d::Store* store, int world_size, std::chrono::milliseconds wait,
            const std::shared_ptr<Gathered>& out) {
  const std::string reported = absl::StrCat(kKeyPrefix, "reported");
  bool reporter = true;
  std::vector<std::optional<RankState>> states(world_size);
  std::vector<std::string> errors(world_size);
  try {
    reporter = store->add(absl::StrCat(kKeyPrefix, "reporters"), 1) == 1;
    const auto deadline = SteadyClock::now() + wait;
    while (!reporter && !store->check({reported}) && SteadyClock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  } catch (const std::exception&) {
    // Report: better two reports than none.
  }
  for (int r = 0; reporter && r < world_size; ++r) {
    try {
      const std::string key = absl::StrCat(kKeyPrefix, r);
      if (store->check({key})) states[r] = Decode(store->get(key));
    } catch (const std::exception& e) {
      errors[r] = e.what();  // this rank's state stays unknown; the others are still read
    }
  }
  if (reporter) {
    try {
      store->set(reported, std::vector<uint8_t>{1});
    } catch (const std::exception&) {
      // The others stop waiting at their deadline.
    }
  }
  std::lock_guard<std::mutex> lock(out->mutex);
  out->reporter = reporter;
  out->states = std::move(states);
  out->errors = std::move(errors);
  out->done = true;
  out->done_cv.notify_all();
}

}  // namespace

std::string HangWatchdog::Report(double stalled_seconds) {
  RankState mine;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    mine = {Milliseconds(WallClock::now()), step_, phase_, Milliseconds(entered_wall_)};
  }
  const std::string head = absl::StrFormat(
      "hang: rank %d has made no progress for %.1f s (distributed.hang_timeout_seconds %g) at "
      "step %d, in %s",
      rank_, stalled_seconds, timeout_seconds(), mine.step, PhaseName(mine.phase));
  const std::string tail = absl::StrCat(". Ending this rank (exit ", kHangExitCode, ").");
  std::vector<std::optional<RankState>> states(world_size_);
  std::vector<std::string> errors(world_size_);
  if (store_ != nullptr) {
    auto gathered = std::make_shared<Gathered>();
    std::thread([store = store_, world = world_size_, wait = options_.store_wait / 2, gathered] {
      Gather(store, world, wait, gathered);
    }).detach();
    std::unique_lock<std::mutex> lock(gathered->mutex);
    if (!gathered->done_cv.wait_for(lock, options_.store_wait, [&] { return gathered->done; })) {
      return absl::StrCat(
          head, "; the rendezvous store did not answer within ",
          std::chrono::duration_cast<std::chrono::seconds>(options_.store_wait).count(),
          " s: its host (rank 0, unless an agent serves it) is stopped or dead", tail);
    }
    if (!gathered->reporter) return absl::StrCat(head, "; another rank reports every rank's state");
    states = std::move(gathered->states);
    errors = std::move(gathered->errors);
  }
  states[rank_] = mine;
  const int64_t now_ms = Milliseconds(WallClock::now());
  const int64_t stale_ms = std::max<int64_t>(3 * options_.publish_every.count(), 3000);
  std::vector<std::string> missing;
  std::vector<std::string> every;
  for (int r = 0; r < world_size_; ++r) {
    if (!states[r].has_value()) {
      missing.push_back(absl::StrCat(
          "rank ", r,
          errors[r].empty() ? " (no state published: it never reached the training loop, or its "
                              "store connection failed)"
                            : absl::StrCat(" (its state could not be read: ",
                                           absl::string_view(errors[r]).substr(0, 200), ")")));
      every.push_back(absl::StrCat("rank ", r, ": unknown"));
      continue;
    }
    const RankState& state = *states[r];
    const std::string where = Describe(state, now_ms);
    every.push_back(absl::StrCat("rank ", r, ": ", where));
    if (r != rank_ && now_ms - state.published_ms > stale_ms) {
      missing.push_back(absl::StrFormat(
          "rank %d (%s; its state stopped refreshing %.1f s ago: the process is stopped or "
          "dead)",
          r, where, 1e-3 * static_cast<double>(now_ms - state.published_ms)));
    } else if (Behind(state, mine)) {
      missing.push_back(absl::StrCat("rank ", r, " (", where, ")"));
    }
  }
  return absl::StrCat(head, ". Not arrived: ", missing.empty() ? "none" : "",
                      absl::StrJoin(missing, ", "), ". Every rank: ", absl::StrJoin(every, "; "),
                      tail);
}

}  // namespace keel::tools::recipe
