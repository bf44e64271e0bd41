// Keel's torchrun for one node, without Python: starts --nproc_per_node copies of PROGRAM with
// torchrun's worker environment (torch/distributed/run.py, elastic agent
// torch/distributed/elastic/agent/server/local_elastic_agent.py _start_workers) and stops them
// all when one fails.
//
//   bazel run //tools:launch -- --nproc_per_node=2 -- bazel-bin/tools/train --run_dir=runs/a
//   bazel run //tools:launch -- --nproc_per_node=4 --master_port=0 bazel-bin/tools/train
//
// Exit status (tools/cli/exit_code.h): 0 when every rank exits 0; otherwise the code of the
// first rank that failed (128 + the signal for a rank killed by one); 127 when PROGRAM cannot
// be started; 1 when the launcher itself fails; 2 for bad usage.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"
#include "base/files.h"
#include "base/free_port.h"
#include "base/status.h"
#include "parallel/torchrun_env.h"
#include "tools/cli/exit_code.h"
#include "tools/cli/user_path.h"

extern char** environ;

namespace keel::tools {
namespace {

constexpr char kUsage[] = R"(Starts a distributed program on this node, as torchrun does.

Usage: launch [FLAGS] [--] PROGRAM [ARGS...]

Flags (also --name value, and - for _ as in --nproc-per-node):
  --nproc_per_node=N     processes to start, ranks 0..N-1 (at most 1024). Default: 1.
  --master_addr=ADDR     address of rank 0's rendezvous store. Default: 127.0.0.1.
  --master_port=PORT     its port, 0 to pick a free one on 127.0.0.1. Default: 29500.
  --grace_seconds=S      after a rank fails, how long the others get between SIGTERM and
                         SIGKILL. Default: 10.
  --max_restarts=N       when a rank fails, stop every rank and start them all again, up to
                         N times (torchrun's flag); each start gets TORCHELASTIC_RESTART_COUNT
                         and KEEL_RESTART_CAUSE (which rank failed, how). Default: 0.
  --help                 this text.

Each process gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK=0, MASTER_ADDR,
MASTER_PORT and the other variables torchrun sets, plus OMP_NUM_THREADS=1 when N > 1 and it is
unset. A PROGRAM without a / is looked up in PATH; a relative path, and the processes' working
directory, are taken from the directory Bazel was run in. The launcher forwards SIGINT and
SIGTERM to every process; when one fails, it sends SIGTERM to the others, SIGKILL after
--grace_seconds, and exits with its code, or starts them again (--max_restarts; not after
the launcher got SIGINT or SIGTERM).)";

struct LaunchOptions {
  int64_t nproc_per_node = 1;
  std::string master_addr = "127.0.0.1";
  int64_t master_port = 29500;
  double grace_seconds = 10;
  int64_t max_restarts = 0;
  // PROGRAM and its ARGS.
  std::vector<std::string> program;
  bool help = false;
};

// The most ranks one launch starts: more than any node has cores or GPUs.
constexpr int64_t kMaxProcesses = 1024;

[[nodiscard]] absl::Status SetOption(const std::string& name, const std::string& value,
                                     LaunchOptions& options) {
  if (name == "nproc_per_node") {
    // A typed extra digit would start that many copies of the program.
    if (!absl::SimpleAtoi(value, &options.nproc_per_node) || options.nproc_per_node < 1 ||
        options.nproc_per_node > kMaxProcesses) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--nproc_per_node=", value, " must be an integer in [1, ", kMaxProcesses, "]"));
    }
  } else if (name == "master_addr") {
    if (value.empty()) return absl::InvalidArgumentError("--master_addr must not be empty");
    options.master_addr = value;
  } else if (name == "master_port") {
    if (!absl::SimpleAtoi(value, &options.master_port) || options.master_port < 0 ||
        options.master_port > 65535) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--master_port=", value, " must be an integer in [0, 65535] (0: pick a free port)"));
    }
  } else if (name == "grace_seconds") {
    if (!absl::SimpleAtod(value, &options.grace_seconds) || !std::isfinite(options.grace_seconds) ||
        options.grace_seconds < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--grace_seconds=", value, " must be a number of seconds >= 0"));
    }
  } else if (name == "max_restarts") {
    if (!absl::SimpleAtoi(value, &options.max_restarts) || options.max_restarts < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--max_restarts=", value, " must be an integer >= 0"));
    }
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown flag --", name,
                     "; the flags are --nproc_per_node, --master_addr, --master_port, "
                     "--grace_seconds, --max_restarts and --help"));
  }
  return absl::OkStatus();
}

// Launcher flags run up to "--" or to the first argument that is not a flag (PROGRAM); the rest
// is the program's command line, untouched.
[[nodiscard]] absl::StatusOr<LaunchOptions> ParseArgs(const std::vector<std::string>& args) {
  LaunchOptions options;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') break;
    absl::string_view flag = arg;
    flag.remove_prefix(absl::StartsWith(flag, "--") ? 2 : 1);
    const size_t equals = flag.find('=');
    const std::string name = absl::StrReplaceAll(flag.substr(0, equals), {{"-", "_"}});
    if (name == "help" || name == "h") {
      options.help = true;
      return options;
    }
    std::string value;
    if (equals != absl::string_view::npos) {
      value = std::string(flag.substr(equals + 1));
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      return absl::InvalidArgumentError(absl::StrCat(arg, " needs a value"));
    }
    KEEL_RETURN_IF_ERROR(SetOption(name, value, options));
  }
  options.program.assign(args.begin() + i, args.end());
  if (options.program.empty()) return absl::InvalidArgumentError("no PROGRAM given");
  return options;
}

// Which start of the workers this is: how many restarts came before, and why the last one.
struct Attempt {
  int64_t restarts = 0;
  std::string cause;
};

// The launcher's environment with torchrun's worker variables for `rank` set.
std::vector<std::string> WorkerEnvironment(const LaunchOptions& options, int64_t master_port,
                                           int64_t rank, const Attempt& attempt) {
  parallel::WorkerEnv worker;
  worker.restart_count = static_cast<int>(attempt.restarts);
  worker.max_restarts = static_cast<int>(options.max_restarts);
  worker.restart_cause = attempt.cause;
  worker.rank = static_cast<int>(rank);
  worker.local_rank = static_cast<int>(rank);
  worker.world_size = static_cast<int>(options.nproc_per_node);
  worker.local_world_size = worker.world_size;
  worker.master_addr = options.master_addr;
  worker.master_port = static_cast<int>(master_port);
  std::vector<std::pair<std::string, std::string>> set = parallel::WorkerVariables(worker);
  // torchrun sets OMP_NUM_THREADS=1 for several workers so that they do not oversubscribe
  // the cores.
  if (options.nproc_per_node > 1 && std::getenv("OMP_NUM_THREADS") == nullptr) {
    set.emplace_back("OMP_NUM_THREADS", "1");
  }
  std::vector<std::string> environment;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const absl::string_view variable = *entry;
    const absl::string_view name = variable.substr(0, variable.find('='));
    bool replaced = false;
    for (const char* outer : parallel::kOuterVariables) replaced = replaced || name == outer;
    for (const auto& [key, value] : set) replaced = replaced || name == key;
    if (!replaced) environment.emplace_back(variable);
  }
  for (const auto& [key, value] : set) environment.push_back(absl::StrCat(key, "=", value));
  return environment;
}

std::vector<char*> CStrings(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  for (std::string& s : strings) pointers.push_back(s.data());
  pointers.push_back(nullptr);
  return pointers;
}

struct Worker {
  int64_t rank;
  pid_t pid;
  bool running = true;
};

class Launcher {
 public:
  explicit Launcher(double grace_seconds) : grace_seconds_(grace_seconds) {}

  // Blocks the signals the launcher waits for; they stay pending until Wait() takes them.
  [[nodiscard]] absl::Status BlockSignals() {
    sigemptyset(&waited_);
    sigaddset(&waited_, SIGCHLD);
    for (const int signal : {SIGINT, SIGTERM}) {
      struct sigaction action;
      // Keep ignoring what the launcher was started ignoring (as `nohup` or `&` arrange).
      if (sigaction(signal, nullptr, &action) == 0 && action.sa_handler != SIG_IGN) {
        sigaddset(&waited_, signal);
      }
    }
    if (const int error = pthread_sigmask(SIG_BLOCK, &waited_, &original_mask_); error != 0) {
      return base::ErrnoStatus(error, "blocking signals", "");
    }
    return absl::OkStatus();
  }

  // Starts one worker with the launcher's original signal mask. Errors: kUnavailable naming
  // the rank, the program and the reason.
  [[nodiscard]] absl::Status Start(int64_t rank, std::vector<std::string> argv,
                                   std::vector<std::string> environment) {
    posix_spawnattr_t attributes;
    posix_spawnattr_init(&attributes);
    posix_spawnattr_setsigmask(&attributes, &original_mask_);
    posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGMASK);
    std::vector<char*> c_argv = CStrings(argv);
    std::vector<char*> c_environment = CStrings(environment);
    pid_t pid;
    const int error =
        posix_spawnp(&pid, c_argv[0], nullptr, &attributes, c_argv.data(), c_environment.data());
    posix_spawnattr_destroy(&attributes);
    if (error != 0) {
      return base::ErrnoStatus(error, absl::StrCat("starting rank ", rank, ","), argv[0]);
    }
    workers_.push_back(Worker{rank, pid});
    return absl::OkStatus();
  }

  // Forgets the last start's workers and outcome, for a restart.
  void Reset() {
    workers_.clear();
    exit_code_.reset();
    cause_.clear();
    deadline_.reset();
  }

  // Why the last start failed ("rank 1 killed by signal 9"), and whether the launcher was
  // told to stop (SIGINT or SIGTERM), when no restart may follow.
  const std::string& cause() const { return cause_; }
  bool signalled() const { return signalled_; }

  // Records a failure that is not a worker's (`code`) and stops the workers.
  void Fail(int code) {
    if (!exit_code_.has_value()) exit_code_ = code;
    Terminate();
  }

  // Waits for every worker, forwarding SIGINT and SIGTERM, and stopping the others when one
  // fails. Returns the exit code of the first failure, or 0.
  int Wait() {
    while (Reap() > 0) {
      siginfo_t info;
      int signal;
      if (deadline_.has_value()) {
        const auto left = std::max(*deadline_ - Clock::now(), Clock::duration::zero());
        const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(left);
        const timespec timeout = {
            static_cast<time_t>(seconds.count()),
            static_cast<long>(std::chrono::nanoseconds(left - seconds).count())};
        signal = sigtimedwait(&waited_, &info, &timeout);
      } else {
        signal = sigwaitinfo(&waited_, &info);
      }
      if (signal == SIGINT || signal == SIGTERM) {
        signalled_ = true;
        std::cerr << "launch: got signal " << signal << ", forwarding it to " << Running()
                  << " running ranks\n";
        Signal(signal);
      } else if (signal < 0 && errno == EAGAIN && deadline_.has_value()) {
        std::cerr << "launch: " << Running() << " ranks still running " << grace_seconds_
                  << " s after SIGTERM; sending SIGKILL\n";
        Signal(SIGKILL);
        deadline_.reset();
      }
    }
    return exit_code_.value_or(0);
  }

 private:
  using Clock = std::chrono::steady_clock;

  // Collects the workers that have exited and returns how many still run.
  int64_t Reap() {
    for (Worker& worker : workers_) {
      if (!worker.running) continue;
      int status;
      const pid_t pid = waitpid(worker.pid, &status, WNOHANG);
      if (pid != worker.pid) continue;
      worker.running = false;
      int code = 0;
      std::string what;
      if (WIFSIGNALED(status)) {
        code = 128 + WTERMSIG(status);
        what = absl::StrCat("rank ", worker.rank, " killed by signal ", WTERMSIG(status));
      } else if (WEXITSTATUS(status) != 0) {
        code = WEXITSTATUS(status);
        what = absl::StrCat("rank ", worker.rank, " exited with code ", code);
      }
      if (!what.empty()) std::cerr << "launch: " << what << "\n";
      if (code != 0 && !exit_code_.has_value()) {
        exit_code_ = code;
        cause_ = what;
        Terminate();
      }
    }
    return Running();
  }

  int64_t Running() const {
    int64_t running = 0;
    for (const Worker& worker : workers_) running += worker.running;
    return running;
  }

  void Signal(int signal) {
    for (const Worker& worker : workers_) {
      if (worker.running) kill(worker.pid, signal);
    }
  }

  void Terminate() {
    if (Running() > 0) {
      std::cerr << "launch: sending SIGTERM to " << Running() << " running ranks\n";
    }
    Signal(SIGTERM);
    deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                   std::chrono::duration<double>(grace_seconds_));
  }

  const double grace_seconds_;
  sigset_t waited_;
  sigset_t original_mask_;
  std::vector<Worker> workers_;
  std::optional<int> exit_code_;
  std::string cause_;
  bool signalled_ = false;
  std::optional<Clock::time_point> deadline_;
};

// The exit code of the whole run.
[[nodiscard]] absl::StatusOr<int> Launch(const LaunchOptions& options) {
  int64_t master_port = options.master_port;
  if (master_port == 0) {
    KEEL_ASSIGN_OR_RETURN(master_port, base::PickFreePort());
  }
  std::vector<std::string> argv = options.program;
  if (argv[0].find('/') != std::string::npos) argv[0] = cli::UserPath(argv[0]);  // else: PATH
  if (const char* dir = std::getenv("BUILD_WORKING_DIRECTORY"); dir != nullptr) {
    if (chdir(dir) != 0) return base::ErrnoError("entering BUILD_WORKING_DIRECTORY", dir);
  }
  Launcher launcher(options.grace_seconds);
  KEEL_RETURN_IF_ERROR(launcher.BlockSignals());
  for (Attempt attempt;; ++attempt.restarts) {
    for (int64_t rank = 0; rank < options.nproc_per_node; ++rank) {
      if (absl::Status started =
              launcher.Start(rank, argv, WorkerEnvironment(options, master_port, rank, attempt));
          !started.ok()) {
        std::cerr << "launch: " << started.message() << "\n";
        launcher.Fail(127);
        break;
      }
    }
    const int code = launcher.Wait();
    if (code == 0 || code == 127 || launcher.signalled() ||
        attempt.restarts == options.max_restarts) {
      return code;
    }
    attempt.cause = launcher.cause();
    std::cerr << "launch: restarting every rank (restart " << attempt.restarts + 1 << " of at most "
              << options.max_restarts << "): " << attempt.cause << "\n";
    launcher.Reset();
    // Rank 0 serves the store again; a port picked for this launch may be taken by now.
    if (options.master_port == 0) {
      KEEL_ASSIGN_OR_RETURN(master_port, base::PickFreePort());
    }
  }
}

}  // namespace
}  // namespace keel::tools

int main(int argc, char** argv) {
  absl::StatusOr<keel::tools::LaunchOptions> options =
      keel::tools::ParseArgs(std::vector<std::string>(argv + 1, argv + argc));
  if (!options.ok()) {
    std::cerr << "launch: " << options.status().message() << "\n\n" << keel::tools::kUsage << "\n";
    return keel::tools::cli::kExitUsage;
  }
  if (options->help) {
    std::cout << keel::tools::kUsage << "\n";
    return keel::tools::cli::kExitSuccess;
  }
  return keel::tools::cli::Exit("launch", keel::tools::Launch(*options));
}
