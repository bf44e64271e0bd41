// Child processes for the tests of the //tools binaries: start one with chosen arguments,
// environment and output files, read its stdout line by line as it runs, wait for it (with a
// deadline for the tests of hangs).
//
//   Subprocess child = Subprocess::Start({train, "--set", "run_dir=" + dir}, options);
//   while (auto line = child.ReadLine()) if (absl::StrContains(*line, "step 5/")) break;
//   kill(child.pid(), SIGTERM);
//   EXPECT_EQ(child.Wait(), 0) << child.Stderr();
#ifndef KEEL_TOOLS_CLI_SUBPROCESS_TESTUTIL_H_
#define KEEL_TOOLS_CLI_SUBPROCESS_TESTUTIL_H_

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

namespace keel::tools::cli {

struct SubprocessOptions {
  // Variables whose NAME= prefix is listed are removed from the inherited environment.
  std::vector<std::string> remove_environment;
  // NAME=VALUE entries added after the removal.
  std::vector<std::string> add_environment;
  // The child's stderr goes to this file (truncated). Required.
  std::string stderr_path;
  // Its stdout goes to a pipe that ReadLine reads when true, else to stderr_path too.
  bool pipe_stdout = false;
  // Its working directory; empty: the test's.
  std::string cwd;
  // Starts the child as the leader of a new process group, which KillGroup signals whole (a
  // launcher and the ranks it started).
  bool new_process_group = false;
};

class Subprocess {
 public:
  // Starts argv[0] (a path) with argv, SIGINT and SIGTERM at their default dispositions. The
  // child inherits the test's descriptors that are not close-on-exec (pipes of a test's own
  // protocol).
  // A failure to start fails the current test and returns a Subprocess whose Wait() is -1.
  static Subprocess Start(const std::vector<std::string>& argv, const SubprocessOptions& options);

  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&&) = delete;
  // Kills (SIGKILL) and reaps a child that is still running (its process group too, if it
  // leads one).
  ~Subprocess();

  pid_t pid() const { return pid_; }

  // Sends `signal` to the child's whole process group. Requires: options.new_process_group.
  void KillGroup(int signal);

  // The next line of the child's stdout without its newline; nullopt at end of file.
  // Requires: options.pipe_stdout.
  std::optional<std::string> ReadLine();
  // Every stdout line read so far, and the rest up to end of file, joined with newlines.
  std::string DrainStdout();

  // Reads stdout to its end (when piped), then reaps the child: its exit code, or 128 + the
  // signal that killed it; -1 if it was never started.
  int Wait();
  // As Wait, but gives up after `seconds`: nullopt if the child is still running then.
  std::optional<int> WaitFor(double seconds);

  // What the child wrote to stderr so far ("" if nothing).
  std::string Stderr() const;

 private:
  Subprocess(pid_t pid, int stdout_fd, std::string stderr_path, bool group_leader);
  // Appends what one read(2) of stdout gives to buffer_; false (and the pipe closed) at its end.
  bool ReadChunk();

  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  std::string stderr_path_;
  std::string buffer_;
  std::string stdout_seen_;
  std::optional<int> exit_code_;
  bool group_leader_ = false;
};

// The arguments `a` followed by `b`: a child's common arguments and one run's own.
std::vector<std::string> With(std::vector<std::string> a, const std::vector<std::string>& b);

}  // namespace keel::tools::cli

#endif  // KEEL_TOOLS_CLI_SUBPROCESS_TESTUTIL_H_
