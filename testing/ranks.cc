#include "testing/ranks.h"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/torch_compat.h"
#include "base/torch_status.h"
#include "torch/csrc/distributed/c10d/HashStore.hpp"
#include "torch/csrc/distributed/c10d/PrefixStore.hpp"

namespace keel::testing {

absl::Status RunOnRanks(int world_size, const std::function<absl::Status(Rank&)>& fn,
                        std::chrono::milliseconds timeout) {
  // One store per process, a fresh prefix per call: calls never see each other's keys.
  static const auto* const kStore =
      new c10::intrusive_ptr<c10d::Store>(c10::make_intrusive<c10d::HashStore>());
  static std::atomic<int> calls{0};
  auto store = c10::make_intrusive<c10d::PrefixStore>(absl::StrCat("run", calls++), *kStore);

  std::vector<absl::Status> statuses(world_size);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([&, rank] {
      Rank r{rank, world_size, {}};
      absl::Status status = base::CallTorch(absl::StatusCode::kUnavailable, "Gloo rendezvous", [&] {
        r.group = base::CreateGlooProcessGroup(store, rank, world_size, timeout);
      });
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

}  // namespace keel::testing
