// Runs the real //tools:launch binary on launch_test_child workers. Workers report readiness
// through an inherited pipe and failing workers wait for a byte on another, so every test
// orders its events without sleeping.
#include <signal.h>
#include <unistd.h>

#include <climits>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/files.h"
#include "tools/cli/subprocess_testutil.h"

ABSL_FLAG(std::string, launch, "", "Path of the //tools:launch binary.");
ABSL_FLAG(std::string, child, "", "Path of the //tools:launch_test_child binary.");

namespace keel::tools {
namespace {

using ::keel::testing::NewTempDir;
using ::keel::testing::ReadFileOrFail;
using ::keel::tools::cli::Subprocess;
using ::keel::tools::cli::SubprocessOptions;
using ::testing::HasSubstr;
using ::testing::Not;

std::map<std::string, std::string> ReadEnvironment(const std::string& path) {
  std::map<std::string, std::string> variables;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    const size_t equals = line.find('=');
    if (equals != std::string::npos) variables[line.substr(0, equals)] = line.substr(equals + 1);
  }
  return variables;
}

std::string Absolute(const std::string& path) { return std::filesystem::absolute(path).string(); }

// A pipe whose ends the launcher and its workers inherit.
struct Pipe {
  Pipe() { EXPECT_EQ(pipe(fds), 0); }
  ~Pipe() {
    for (int fd : fds) {
      if (fd >= 0) close(fd);
    }
  }
  int read_fd() const { return fds[0]; }
  int write_fd() const { return fds[1]; }
  void CloseWriteEnd() {
    close(fds[1]);
    fds[1] = -1;
  }
  int fds[2];
};

// Starts the launcher with `args`, its stderr in a file, BUILD_WORKING_DIRECTORY and
// OMP_NUM_THREADS removed from its environment and then `extra_environment` added, in `cwd`
// when given.
Subprocess StartLauncher(const std::vector<std::string>& args, const std::string& stderr_path,
                         const std::vector<std::string>& extra_environment = {},
                         const std::string& cwd = "") {
  std::vector<std::string> argv = {Absolute(absl::GetFlag(FLAGS_launch))};
  argv.insert(argv.end(), args.begin(), args.end());
  SubprocessOptions options;
  options.remove_environment = {"BUILD_WORKING_DIRECTORY", "OMP_NUM_THREADS"};
  options.add_environment = extra_environment;
  options.stderr_path = stderr_path;
  options.cwd = cwd;
  return Subprocess::Start(argv, options);
}

// Blocks until `count` workers have written their ready byte.
void AwaitReady(Pipe& ready, int count) {
  ready.CloseWriteEnd();  // so that a worker that dies early ends the read instead of a hang
  int received = 0;
  char buffer[64];
  while (received < count) {
    const ssize_t n = read(ready.read_fd(), buffer, sizeof(buffer));
    ASSERT_GT(n, 0) << "workers exited before " << count << " were ready";
    received += static_cast<int>(n);
  }
}

TEST(LaunchTest, EveryRankGetsTheTorchrunEnvironmentAndOneFreePort) {
  const std::string out = NewTempDir("environment");
  Subprocess launch =
      StartLauncher({"--nproc_per_node=3", "--master_port=0", "--", absl::GetFlag(FLAGS_child),
                     "--out_dir=" + out, "exit:0", "exit:0", "exit:0"},
                    out + "/stderr");
  ASSERT_EQ(launch.Wait(), 0) << launch.Stderr();
  std::string port;
  for (int rank = 0; rank < 3; ++rank) {
    SCOPED_TRACE(absl::StrCat("rank ", rank));
    auto env = ReadEnvironment(absl::StrCat(out, "/rank", rank, ".env"));
    EXPECT_EQ(env["RANK"], absl::StrCat(rank));
    EXPECT_EQ(env["LOCAL_RANK"], absl::StrCat(rank));
    EXPECT_EQ(env["GROUP_RANK"], "0");
    EXPECT_EQ(env["WORLD_SIZE"], "3");
    EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "3");
    EXPECT_EQ(env["MASTER_ADDR"], "127.0.0.1");
    EXPECT_EQ(env["OMP_NUM_THREADS"], "1");  // torchrun's default for several workers
    if (rank == 0) port = env["MASTER_PORT"];
    EXPECT_EQ(env["MASTER_PORT"], port);
  }
  int port_number = 0;
  EXPECT_TRUE(absl::SimpleAtoi(port, &port_number)) << port;
  EXPECT_GT(port_number, 0);
  EXPECT_LE(port_number, 65535);
}

TEST(LaunchTest, TakesFlagsWithSeparateValuesAndPassesProgramFlagsThrough) {
  const std::string out = NewTempDir("explicit");
  // No "--": the launcher's flags end at PROGRAM, whose own flags it leaves alone.
  Subprocess launch =
      StartLauncher({"--nproc-per-node", "2", "--master_addr=10.1.2.3", "--master_port", "29517",
                     absl::GetFlag(FLAGS_child), "--out_dir=" + out, "exit:0", "exit:0"},
                    out + "/stderr");
  ASSERT_EQ(launch.Wait(), 0) << launch.Stderr();
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE(absl::StrCat("rank ", rank));
    auto env = ReadEnvironment(absl::StrCat(out, "/rank", rank, ".env"));
    EXPECT_EQ(env["RANK"], absl::StrCat(rank));
    EXPECT_EQ(env["WORLD_SIZE"], "2");
    EXPECT_EQ(env["MASTER_ADDR"], "10.1.2.3");
    EXPECT_EQ(env["MASTER_PORT"], "29517");
  }
}

TEST(LaunchTest, ResolvesProgramAndRunsWorkersInBuildWorkingDirectory) {
  const std::string out = NewTempDir("working_directory");
  char cwd[PATH_MAX];
  ASSERT_NE(getcwd(cwd, sizeof(cwd)), nullptr);  // the runfiles folder, where --child is relative
  // The launcher starts elsewhere, as under `bazel run`; OMP_NUM_THREADS set by the user stays.
  Subprocess launch = StartLauncher(
      {"--nproc_per_node=1", "--", absl::GetFlag(FLAGS_child), "--out_dir=" + out, "exit:0"},
      out + "/stderr", {absl::StrCat("BUILD_WORKING_DIRECTORY=", cwd), "OMP_NUM_THREADS=3"}, out);
  ASSERT_EQ(launch.Wait(), 0) << launch.Stderr();
  EXPECT_EQ(ReadFileOrFail(out + "/rank0.cwd"), cwd);
  auto env = ReadEnvironment(out + "/rank0.env");
  EXPECT_EQ(env["OMP_NUM_THREADS"], "3");
  EXPECT_EQ(env["WORLD_SIZE"], "1");
}

TEST(LaunchTest, ExitsWithTheFailingRanksCode) {
  const std::string out = NewTempDir("exit_code");
  Subprocess launch = StartLauncher({"--nproc_per_node=2", "--", absl::GetFlag(FLAGS_child),
                                     "--out_dir=" + out, "exit:0", "exit:7"},
                                    out + "/stderr");
  EXPECT_EQ(launch.Wait(), 7);
  EXPECT_THAT(launch.Stderr(), HasSubstr("launch: rank 1 exited with code 7\n"));
}

// --max_restarts=N: a failing rank restarts every rank, N times at most, each start told its
// restart count and the last cause; the last failure's code ends the launch. 0 fails at once.
TEST(LaunchTest, MaxRestartsStartsEveryRankAgainUpToNTimes) {
  const std::string out = NewTempDir("restarts");
  Subprocess launch =
      StartLauncher({"--nproc_per_node=2", "--max_restarts=2", "--", absl::GetFlag(FLAGS_child),
                     "--out_dir=" + out, "sleep", "exit:5"},
                    out + "/stderr");
  EXPECT_EQ(launch.Wait(), 5);
  EXPECT_THAT(launch.Stderr(),
              HasSubstr("launch: restarting every rank (restart 1 of at most 2): rank 1 exited "
                        "with code 5\n"));
  EXPECT_THAT(launch.Stderr(), HasSubstr("(restart 2 of at most 2)"));
  EXPECT_THAT(launch.Stderr(), Not(HasSubstr("(restart 3")));
  // Rank 1 writes its environment before it fails: the last start's. (Rank 0 may be stopped
  // before it writes its own.)
  auto env = ReadEnvironment(out + "/rank1.env");
  EXPECT_EQ(env["TORCHELASTIC_RESTART_COUNT"], "2");
  EXPECT_EQ(env["TORCHELASTIC_MAX_RESTARTS"], "2");
  EXPECT_EQ(env["KEEL_RESTART_CAUSE"], "rank 1 exited with code 5");

  const std::string once = NewTempDir("no_restarts");
  Subprocess failing =
      StartLauncher({"--nproc_per_node=2", "--max_restarts=0", "--", absl::GetFlag(FLAGS_child),
                     "--out_dir=" + once, "sleep", "exit:5"},
                    once + "/stderr");
  EXPECT_EQ(failing.Wait(), 5);
  EXPECT_THAT(failing.Stderr(), Not(HasSubstr("restarting")));
  EXPECT_EQ(ReadEnvironment(once + "/rank1.env")["TORCHELASTIC_RESTART_COUNT"], "0");
  EXPECT_EQ(ReadEnvironment(once + "/rank1.env")["KEEL_RESTART_CAUSE"], "");
}

TEST(LaunchTest, ExitsWith128PlusTheSignalThatKilledARank) {
  const std::string out = NewTempDir("signal_code");
  Subprocess launch =
      StartLauncher({"--nproc_per_node=2", "--", absl::GetFlag(FLAGS_child), "--out_dir=" + out,
                     "exit:0", absl::StrCat("signal:", SIGUSR1)},
                    out + "/stderr");
  EXPECT_EQ(launch.Wait(), 128 + SIGUSR1);
  EXPECT_THAT(launch.Stderr(),
              HasSubstr(absl::StrCat("launch: rank 1 killed by signal ", SIGUSR1, "\n")));
}

TEST(LaunchTest, FailingRankMakesTheLauncherTerminateItsPeers) {
  const std::string out = NewTempDir("terminate_peers");
  Pipe ready, go;
  Subprocess launch =
      StartLauncher({"--nproc_per_node=2", "--", absl::GetFlag(FLAGS_child), "--out_dir=" + out,
                     absl::StrCat("--ready_fd=", ready.write_fd()),
                     absl::StrCat("--go_fd=", go.read_fd()), "sleep", "go_exit:3"},
                    out + "/stderr");
  AwaitReady(ready, 2);
  ASSERT_EQ(write(go.write_fd(), "g", 1), 1);  // rank 1 fails only once rank 0 waits for SIGTERM
  EXPECT_EQ(launch.Wait(), 3);
  EXPECT_EQ(ReadFileOrFail(out + "/rank0.signal"), absl::StrCat(SIGTERM));
  const std::string log = launch.Stderr();
  EXPECT_THAT(log, HasSubstr("launch: rank 1 exited with code 3\n"));
  EXPECT_THAT(log, Not(HasSubstr("launch: rank 0")));  // it exited 0 after SIGTERM
}

TEST(LaunchTest, PeerIgnoringSigtermIsKilledAfterTheGracePeriod) {
  const std::string out = NewTempDir("kill_peers");
  Pipe ready, go;
  Subprocess launch =
      StartLauncher({"--nproc_per_node=2", "--grace_seconds=0.1", "--", absl::GetFlag(FLAGS_child),
                     "--out_dir=" + out, absl::StrCat("--ready_fd=", ready.write_fd()),
                     absl::StrCat("--go_fd=", go.read_fd()), "ignore_term", "go_exit:4"},
                    out + "/stderr");
  AwaitReady(ready, 2);
  ASSERT_EQ(write(go.write_fd(), "g", 1), 1);
  EXPECT_EQ(launch.Wait(), 4);  // the first failure's code, not SIGKILL's
  const std::string log = launch.Stderr();
  EXPECT_THAT(log, HasSubstr("launch: rank 1 exited with code 4\n"));
  EXPECT_THAT(log, HasSubstr(absl::StrCat("launch: rank 0 killed by signal ", SIGKILL, "\n")));
}

TEST(LaunchTest, ForwardsSigtermAndSigintToEveryRank) {
  for (const int signal : {SIGTERM, SIGINT}) {
    SCOPED_TRACE(absl::StrCat("signal ", signal));
    const std::string out = NewTempDir(absl::StrCat("forward_", signal));
    Pipe ready;
    Subprocess launch =
        StartLauncher({"--nproc_per_node=3", "--", absl::GetFlag(FLAGS_child), "--out_dir=" + out,
                       absl::StrCat("--ready_fd=", ready.write_fd()), "sleep", "sleep", "sleep"},
                      out + "/stderr");
    AwaitReady(ready, 3);
    ASSERT_EQ(kill(launch.pid(), signal), 0);
    // Every worker handled the signal and exited 0, so the launcher does too.
    EXPECT_EQ(launch.Wait(), 0) << launch.Stderr();
    for (int rank = 0; rank < 3; ++rank) {
      EXPECT_EQ(ReadFileOrFail(absl::StrCat(out, "/rank", rank, ".signal")), absl::StrCat(signal))
          << "rank " << rank;
    }
  }
}

TEST(LaunchTest, ProgramThatCannotStartExits127) {
  const std::string out = NewTempDir("no_program");
  Subprocess launch =
      StartLauncher({"--nproc_per_node=2", "--", "/nonexistent/program"}, out + "/stderr");
  EXPECT_EQ(launch.Wait(), 127);
  EXPECT_THAT(launch.Stderr(), HasSubstr("/nonexistent/program"));
}

TEST(LaunchTest, BadUsageExits2WithTheUsageText) {
  const std::string child = absl::GetFlag(FLAGS_child);
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{}, "no PROGRAM"},
      {{"--nproc_per_node=2", "--"}, "no PROGRAM"},
      {{"--nproc_per_node=0", "--", child}, "--nproc_per_node=0 must be an integer in [1, 1024]"},
      // Not 100000 copies of the program.
      {{"--nproc_per_node=100000", "--", child},
       "--nproc_per_node=100000 must be an integer in [1, 1024]"},
      {{"--nproc_per_node=two", child}, "--nproc_per_node=two"},
      {{"--master_port=65536", child}, "--master_port=65536 must be an integer in [0, 65535]"},
      {{"--grace_seconds=-1", child}, "--grace_seconds=-1 must be a number of seconds >= 0"},
      {{"--master_addr=", child}, "--master_addr must not be empty"},
      {{"--nnodes=2", child}, "unknown flag --nnodes"},
      {{"--master_port"}, "--master_port needs a value"},
  };
  const std::string out = NewTempDir("usage");
  for (const auto& [args, message] : cases) {
    SCOPED_TRACE(message);
    Subprocess launch = StartLauncher(args, out + "/stderr");
    EXPECT_EQ(launch.Wait(), 2);
    const std::string log = launch.Stderr();
    EXPECT_THAT(log, HasSubstr(message));
    EXPECT_THAT(log, HasSubstr("Usage: launch"));
  }
  EXPECT_EQ(StartLauncher({"--help"}, out + "/stderr").Wait(), 0);
}

}  // namespace
}  // namespace keel::tools
