#include "tools/cli/subprocess_testutil.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iterator>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "gtest/gtest.h"

extern char** environ;

namespace keel::tools::cli {
namespace {

int ExitCode(int status) {
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

}  // namespace

std::string Subprocess::Stderr() const {
  std::ifstream in(stderr_path_, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

Subprocess Subprocess::Start(const std::vector<std::string>& argv,
                             const SubprocessOptions& options) {
  std::vector<std::string> environment;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    bool removed = false;
    for (const std::string& name : options.remove_environment) {
      removed = removed || absl::StartsWith(*entry, name + "=");
    }
    if (!removed) environment.emplace_back(*entry);
  }
  environment.insert(environment.end(), options.add_environment.begin(),
                     options.add_environment.end());
  std::vector<std::string> args = argv;
  std::vector<char*> c_argv, c_environment;
  for (std::string& s : args) c_argv.push_back(s.data());
  for (std::string& s : environment) c_environment.push_back(s.data());
  c_argv.push_back(nullptr);
  c_environment.push_back(nullptr);

  int out[2] = {-1, -1};
  if (options.pipe_stdout && pipe2(out, O_CLOEXEC) != 0) {
    ADD_FAILURE() << "pipe2 failed";
    return Subprocess(-1, -1, options.stderr_path, false);
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, options.stderr_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (options.pipe_stdout) {
    posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  } else {
    posix_spawn_file_actions_adddup2(&actions, STDERR_FILENO, STDOUT_FILENO);
  }
  if (!options.cwd.empty()) posix_spawn_file_actions_addchdir_np(&actions, options.cwd.c_str());
  // Default dispositions, whatever the test runner ignores: the child must see these.
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  sigset_t defaults;
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGINT);
  sigaddset(&defaults, SIGTERM);
  posix_spawnattr_setsigdefault(&attributes, &defaults);
  short flags = POSIX_SPAWN_SETSIGDEF;
  if (options.new_process_group) {
    posix_spawnattr_setpgroup(&attributes, 0);
    flags |= POSIX_SPAWN_SETPGROUP;
  }
  posix_spawnattr_setflags(&attributes, flags);
  pid_t pid = -1;
  const int error =
      posix_spawn(&pid, c_argv[0], &actions, &attributes, c_argv.data(), c_environment.data());
  posix_spawnattr_destroy(&attributes);
  posix_spawn_file_actions_destroy(&actions);
  if (out[1] >= 0) close(out[1]);
  if (error != 0) {
    ADD_FAILURE() << base::ErrnoStatus(error, "starting", argv[0]).message();
    if (out[0] >= 0) close(out[0]);
    return Subprocess(-1, -1, options.stderr_path, false);
  }
  return Subprocess(pid, out[0], options.stderr_path, options.new_process_group);
}

Subprocess::Subprocess(pid_t pid, int stdout_fd, std::string stderr_path, bool group_leader)
    : pid_(pid),
      stdout_fd_(stdout_fd),
      stderr_path_(std::move(stderr_path)),
      group_leader_(group_leader) {}

Subprocess::Subprocess(Subprocess&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)),
      stdout_fd_(std::exchange(other.stdout_fd_, -1)),
      stderr_path_(std::move(other.stderr_path_)),
      buffer_(std::move(other.buffer_)),
      stdout_seen_(std::move(other.stdout_seen_)),
      exit_code_(other.exit_code_),
      group_leader_(other.group_leader_) {}

Subprocess::~Subprocess() {
  if (pid_ > 0 && group_leader_) kill(-pid_, SIGKILL);  // whatever of the group still runs
  if (pid_ > 0 && !exit_code_) {
    kill(pid_, SIGKILL);
    int status;
    waitpid(pid_, &status, 0);
  }
  if (stdout_fd_ >= 0) close(stdout_fd_);
}

void Subprocess::KillGroup(int signal) {
  ASSERT_TRUE(group_leader_) << "KillGroup needs SubprocessOptions::new_process_group";
  ASSERT_EQ(kill(-pid_, signal), 0)
      << base::ErrnoStatus(errno, "signalling", "the group").message();
}

bool Subprocess::ReadChunk() {
  while (stdout_fd_ >= 0) {
    char chunk[4096];
    const ssize_t n = read(stdout_fd_, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n > 0) {
      buffer_.append(chunk, static_cast<size_t>(n));
      return true;
    }
    close(stdout_fd_);
    stdout_fd_ = -1;
  }
  return false;
}

std::optional<std::string> Subprocess::ReadLine() {
  size_t newline;
  while ((newline = buffer_.find('\n')) == std::string::npos) {
    if (!ReadChunk()) break;
  }
  if (newline == std::string::npos && buffer_.empty()) return std::nullopt;
  std::string line = buffer_.substr(0, newline);
  buffer_.erase(0, newline == std::string::npos ? newline : newline + 1);
  absl::StrAppend(&stdout_seen_, line, "\n");
  return line;
}

std::string Subprocess::DrainStdout() {
  while (ReadLine()) {
  }
  return stdout_seen_;
}

int Subprocess::Wait() {
  if (pid_ <= 0) return -1;
  DrainStdout();
  if (!exit_code_) {
    int status;
    if (waitpid(pid_, &status, 0) != pid_) return -1;
    exit_code_ = ExitCode(status);
  }
  return *exit_code_;
}

std::optional<int> Subprocess::WaitFor(double seconds) {
  if (pid_ <= 0) return -1;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!exit_code_) {
    int status;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      exit_code_ = ExitCode(status);
      break;
    }
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    // A child's exit wakes no poll: look again after at most 100 ms, reading its output
    // meanwhile so that it never blocks on a full pipe.
    pollfd out = {stdout_fd_, POLLIN, 0};
    if (poll(&out, stdout_fd_ >= 0 ? 1 : 0, 100) > 0) ReadChunk();
  }
  DrainStdout();
  return *exit_code_;
}

std::vector<std::string> With(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace keel::tools::cli
