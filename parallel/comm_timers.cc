#include "parallel/comm_timers.h"

namespace keel::parallel {
namespace {

std::atomic<CommTimers*> installed{nullptr};

}  // namespace

CommTimers::Scope::Scope(CommTimers& timers) : previous_(installed.exchange(&timers)) {}

CommTimers::Scope::~Scope() { installed.store(previous_); }

CommTimers* CommTimers::Installed() { return installed.load(); }

}  // namespace keel::parallel
