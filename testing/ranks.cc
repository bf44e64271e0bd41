#include "testing/ranks.h"

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/free_port.h"
#include "base/torch_compat.h"
#include "base/torch_status.h"
#include "testing/fake_gpu.h"
#include "testing/nccl_like_group.h"
#include "torch/csrc/distributed/c10d/HashStore.hpp"
#include "torch/csrc/distributed/c10d/PrefixStore.hpp"

namespace keel::testing {

namespace {

enum class Groups { kNone, kGloo, kNcclLike };

// Runs `fn` on a thread per rank, each with the shared store and the `groups` of all ranks.
absl::Status RunOnRankThreads(int world_size, const std::function<absl::Status(Rank&)>& fn,
                              std::chrono::milliseconds timeout, Groups groups) {
  // One store per process, a fresh prefix per call: calls never see each other's keys.
  static const auto* const kStore =
      new c10::intrusive_ptr<c10d::Store>(c10::make_intrusive<c10d::HashStore>());
  static std::atomic<int> calls{0};
  auto store = c10::make_intrusive<c10d::PrefixStore>(absl::StrCat("run", calls++), *kStore);

  std::vector<absl::Status> statuses(world_size);
  // The ranks (their groups) outlive every thread: a rank done early must not close its Gloo
  // connections while a peer is still connecting to it.
  std::vector<Rank> ranks(world_size);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([&, rank] {
      Rank& r = ranks[rank];
      r.rank = rank;
      r.world_size = world_size;
      r.store = store;
      absl::Status status;
      if (groups != Groups::kNone) {
        status = base::CallTorch(absl::StatusCode::kUnavailable, "Gloo rendezvous", [&] {
          r.host_group = base::CreateGlooProcessGroup(store, rank, world_size, timeout);
          r.group = r.host_group;
          if (groups == Groups::kNcclLike) {
            r.group = c10::make_intrusive<NcclLikeGroup>(base::CreateGlooProcessGroup(
                c10::make_intrusive<c10d::PrefixStore>("nccl_like", store), rank, world_size,
                timeout));
            r.device = FakeGpu(static_cast<c10::DeviceIndex>(rank));
          }
        });
      }
      if (status.ok()) {
        absl::Status result;
        status = base::CallTorch(absl::StatusCode::kInternal, "exception", [&] { result = fn(r); });
        if (status.ok()) status = result;
      }
      statuses[rank] = status;
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int rank = 0; rank < world_size; ++rank) {
    if (!statuses[rank].ok()) {
      return absl::Status(statuses[rank].code(),
                          absl::StrCat("rank ", rank, ": ", statuses[rank].message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunOnRanks(int world_size, const std::function<absl::Status(Rank&)>& fn,
                        std::chrono::milliseconds timeout) {
  return RunOnRankThreads(world_size, fn, timeout, Groups::kGloo);
}

absl::Status RunOnRanksNcclLike(int world_size, const std::function<absl::Status(Rank&)>& fn,
                                std::chrono::milliseconds timeout) {
  return RunOnRankThreads(world_size, fn, timeout, Groups::kNcclLike);
}

absl::Status RunOnRanksWithStore(int world_size, const std::function<absl::Status(Rank&)>& fn,
                                 std::chrono::milliseconds timeout) {
  return RunOnRankThreads(world_size, fn, timeout, Groups::kNone);
}

int FreeTcpPort() {
  const absl::StatusOr<int> port = base::PickFreePort();
  return port.ok() ? *port : 0;
}

namespace {

// One rank's life in its child process: rendezvous, `fn`, and its status down `out`.
[[noreturn]] void RunRankProcess(int rank, int world_size, int port,
                                 const std::function<absl::Status(Rank&)>& fn,
                                 std::chrono::milliseconds timeout, int out) {
  Rank r;
  r.rank = rank;
  r.world_size = world_size;
  absl::Status status = base::CallTorch(absl::StatusCode::kUnavailable, "Gloo rendezvous", [&] {
    r.store = base::CreateTcpStore("127.0.0.1", port, /*is_server=*/rank == 0, world_size, timeout);
    r.group = base::CreateGlooProcessGroup(r.store, rank, world_size, timeout);
    r.host_group = r.group;
  });
  if (status.ok()) {
    absl::Status result;
    status = base::CallTorch(absl::StatusCode::kInternal, "exception", [&] { result = fn(r); });
    if (status.ok()) status = result;
  }
  const std::string frame =
      absl::StrCat(std::string(1, static_cast<char>(status.code())), status.message());
  (void)!::write(out, frame.data(), frame.size());
  ::_exit(0);
}

}  // namespace

std::vector<absl::Status> RunOnRankProcesses(int world_size,
                                             const std::function<absl::Status(Rank&)>& fn,
                                             std::chrono::milliseconds timeout) {
  const int port = FreeTcpPort();
  std::vector<pid_t> children(world_size, -1);
  std::vector<int> pipes(world_size, -1);
  for (int rank = 0; rank < world_size; ++rank) {
    int fds[2];
    if (::pipe(fds) != 0) break;
    const pid_t child = ::fork();
    if (child == 0) {
      ::close(fds[0]);
      RunRankProcess(rank, world_size, port, fn, timeout, fds[1]);
    }
    ::close(fds[1]);
    children[rank] = child;
    pipes[rank] = fds[0];
  }
  std::vector<absl::Status> statuses(world_size);
  for (int rank = 0; rank < world_size; ++rank) {
    std::string frame;
    char buffer[4096];
    for (ssize_t n; pipes[rank] >= 0 && (n = ::read(pipes[rank], buffer, sizeof(buffer))) > 0;) {
      frame.append(buffer, static_cast<size_t>(n));
    }
    if (pipes[rank] >= 0) ::close(pipes[rank]);
    int wait_status = 0;
    if (children[rank] > 0) ::waitpid(children[rank], &wait_status, 0);
    if (frame.empty()) {
      statuses[rank] = absl::InternalError(
          absl::StrCat("rank ", rank, " ended without a status (wait status ", wait_status, ")"));
    } else {
      statuses[rank] = absl::Status(static_cast<absl::StatusCode>(frame[0]), frame.substr(1));
    }
  }
  return statuses;
}

}  // namespace keel::testing
