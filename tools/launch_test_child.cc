// A worker for launch_test: records what //tools:launch gave it, then does what its ACTION for
// its RANK says.
//
//   launch_test_child --out_dir=DIR [--ready_fd=N] [--go_fd=N] ACTION_RANK_0 ACTION_RANK_1 ...
//
// It writes its environment to DIR/rank<R>.env (one NAME=VALUE a line) and its working directory
// to DIR/rank<R>.cwd, then writes one byte to --ready_fd. ACTIONs:
//   exit:N      exit with code N
//   go_exit:N   read one byte from --go_fd, then exit with code N
//   signal:N    kill itself with signal N
//   sleep       wait for SIGTERM or SIGINT, write its number to DIR/rank<R>.signal, exit 0
//   ignore_term ignore SIGTERM and wait forever
// Exit code 99 reports bad arguments.
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

extern char** environ;

namespace {

constexpr int kBadArguments = 99;

int Run(int argc, char** argv) {
  std::string out_dir;
  int ready_fd = -1;
  int go_fd = -1;
  std::vector<std::string> actions;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (absl::StartsWith(arg, "--out_dir=")) {
      out_dir = arg.substr(10);
    } else if (absl::StartsWith(arg, "--ready_fd=")) {
      if (!absl::SimpleAtoi(arg.substr(11), &ready_fd)) return kBadArguments;
    } else if (absl::StartsWith(arg, "--go_fd=")) {
      if (!absl::SimpleAtoi(arg.substr(8), &go_fd)) return kBadArguments;
    } else {
      actions.push_back(arg);
    }
  }
  const char* rank_variable = std::getenv("RANK");
  int rank;
  if (out_dir.empty() || rank_variable == nullptr || !absl::SimpleAtoi(rank_variable, &rank) ||
      rank < 0 || rank >= static_cast<int>(actions.size())) {
    return kBadArguments;
  }
  const std::string action = actions[rank];

  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  if (action == "sleep") sigprocmask(SIG_BLOCK, &stop, nullptr);
  if (action == "ignore_term") signal(SIGTERM, SIG_IGN);

  const std::string prefix = absl::StrCat(out_dir, "/rank", rank);
  {
    std::ofstream env(prefix + ".env");
    for (char** entry = environ; *entry != nullptr; ++entry) env << *entry << "\n";
    char cwd[4096];
    std::ofstream(prefix + ".cwd") << (getcwd(cwd, sizeof(cwd)) != nullptr ? cwd : "?");
  }
  if (ready_fd >= 0 && write(ready_fd, "r", 1) != 1) return kBadArguments;

  int number;
  if (absl::StartsWith(action, "exit:") && absl::SimpleAtoi(action.substr(5), &number)) {
    return number;
  }
  if (absl::StartsWith(action, "go_exit:") && absl::SimpleAtoi(action.substr(8), &number)) {
    char byte;
    if (read(go_fd, &byte, 1) != 1) return kBadArguments;
    return number;
  }
  if (absl::StartsWith(action, "signal:") && absl::SimpleAtoi(action.substr(7), &number)) {
    kill(getpid(), number);
    return kBadArguments;
  }
  if (action == "sleep") {
    int received;
    if (sigwait(&stop, &received) != 0) return kBadArguments;
    std::ofstream(prefix + ".signal") << received;
    return 0;
  }
  if (action == "ignore_term") {
    while (true) pause();
  }
  return kBadArguments;
}

}  // namespace

int main(int argc, char** argv) { return Run(argc, argv); }
