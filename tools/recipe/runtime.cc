#include "tools/recipe/runtime.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "base/torch_status.h"
#include "parallel/mesh_layout.h"
#include "parallel/process_group.h"
#include "torch/csrc/distributed/c10d/Store.hpp"

namespace keel::tools::recipe {

namespace {

using parallel::GroupKind;

// The mesh's group of `kind` (nullptr for a single process); `host`: its Gloo twin.
c10d::ProcessGroup* MeshGroup(const TrainRuntime& runtime, GroupKind kind, bool host = false) {
  if (runtime.mesh == nullptr) return nullptr;
  return host ? runtime.mesh->GlooGroup(kind) : runtime.mesh->Group(kind);
}

// As MeshGroup, but nullptr where the group is this rank alone.
c10d::ProcessGroup* ParallelGroup(const TrainRuntime& runtime, GroupKind kind, bool host = false) {
  if (runtime.mesh == nullptr || runtime.mesh->GroupSize(kind) <= 1) return nullptr;
  return MeshGroup(runtime, kind, host);
}

}  // namespace

c10d::ProcessGroup* TrainRuntime::gradient_group() const {
  return ParallelGroup(*this, GroupKind::kDpCp);
}
c10d::ProcessGroup* TrainRuntime::tensor_group() const { return MeshGroup(*this, GroupKind::kTp); }
c10d::ProcessGroup* TrainRuntime::expert_group() const { return MeshGroup(*this, GroupKind::kEp); }
c10d::ProcessGroup* TrainRuntime::expert_tensor_group() const {
  return MeshGroup(*this, GroupKind::kExpertTp);
}
models::ModelGroups TrainRuntime::model_groups(const DistributedOptions& options) const {
  return {tensor_group(), pipeline_group(), expert_group(), expert_tensor_group(),
          options.sequence_parallel};
}
c10d::ProcessGroup* TrainRuntime::expert_data_group() const {
  return MeshGroup(*this, GroupKind::kExpertDp);
}
c10d::ProcessGroup* TrainRuntime::pipeline_group() const {
  return ParallelGroup(*this, GroupKind::kPp);
}
c10d::ProcessGroup* TrainRuntime::embedding_group() const {
  return pipeline_group() == nullptr ? nullptr : MeshGroup(*this, GroupKind::kEmbedding);
}
c10d::ProcessGroup* TrainRuntime::control_group() const {
  return mesh == nullptr ? nullptr : mesh->control_group();
}
c10d::ProcessGroup* TrainRuntime::data_host_group() const {
  return MeshGroup(*this, GroupKind::kDp, /*host=*/true);
}
c10d::ProcessGroup* TrainRuntime::pipeline_host_group() const {
  return ParallelGroup(*this, GroupKind::kPp, /*host=*/true);
}
c10d::ProcessGroup* TrainRuntime::checkpoint_group() const {
  return mesh == nullptr ? nullptr : mesh->checkpoint_group();
}
c10d::Store* TrainRuntime::store() const { return mesh == nullptr ? nullptr : mesh->store(); }

absl::Status ReduceOverRanks(at::Tensor& tensor, base::Reduce op, const TrainRuntime& runtime,
                             absl::string_view what) {
  c10d::ProcessGroup* group = runtime.control_group();
  if (group == nullptr) return absl::OkStatus();
  return base::AllReduce(tensor, op, *group, what);
}

absl::Status SumOverData(at::Tensor& tensor, const TrainRuntime& runtime, absl::string_view what) {
  c10d::ProcessGroup* group = runtime.data_host_group();
  if (group == nullptr) return absl::OkStatus();
  return base::AllReduce(tensor, base::Reduce::kSum, *group, what);
}

absl::Status SumOverStages(at::Tensor& tensor, const TrainRuntime& runtime,
                           absl::string_view what) {
  c10d::ProcessGroup* group = runtime.pipeline_host_group();
  if (group == nullptr) return absl::OkStatus();
  return base::AllReduce(tensor, base::Reduce::kSum, *group, what);
}

absl::Status AgreeOverRanks(const absl::Status& status, const TrainRuntime& runtime,
                            absl::string_view what) {
  return base::AgreeOnStatus(status, runtime.control_group(), what);
}

RankZeroWait RankZeroWaitFor(const TrainOptions& options) {
  RankZeroWait wait;
  wait.longest_poll = std::min<std::chrono::milliseconds>(
      wait.longest_poll, std::chrono::milliseconds(options.distributed.timeout_seconds * 250));
  return wait;
}

absl::Status RunOnRankZero(const TrainRuntime& runtime, absl::string_view what,
                           const std::function<absl::Status()>& phase, const RankZeroWait& wait) {
  c10d::Store* store = runtime.world_size > 1 ? runtime.store() : nullptr;
  if (store == nullptr) return phase();
  const std::string key = absl::StrCat("keel/rank_zero/", what);
  if (runtime.rank == 0) {
    const absl::Status status = phase();
    KEEL_RETURN_IF_ERROR(base::CallTorch(
        absl::StatusCode::kUnavailable, absl::StrCat("publishing the outcome of ", what), [&] {
          const std::string encoded = base::StatusBytes(status);
          store->set(key, std::vector<uint8_t>(encoded.begin(), encoded.end()));
        }));
    return status;
  }
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  Clock::time_point next_line = start + wait.progress_every;
  const std::string context = absl::StrCat("waiting for rank 0: ", what);
  // Polls at 10 Hz at first, then (by default) once a second: thousands of waiting ranks over a
  // long index build ask the store a few thousand times a second, not tens of thousands.
  std::chrono::milliseconds poll(100);
  while (true) {
    bool published = false;
    KEEL_RETURN_IF_ERROR(base::CallTorch(absl::StatusCode::kUnavailable, context,
                                         [&] { published = store->check({key}); }));
    if (published) break;
    const Clock::time_point now = Clock::now();
    if (now - start >= wait.limit) {
      return absl::DeadlineExceededError(
          absl::StrCat(context, ": no outcome after ",
                       std::chrono::duration_cast<std::chrono::seconds>(wait.limit).count(), " s"));
    }
    if (now >= next_line) {
      if (runtime.rank == 1 && runtime.log != nullptr) {
        *runtime.log << context << " ("
                     << std::chrono::duration_cast<std::chrono::seconds>(now - start).count()
                     << " s)" << std::endl;
      }
      next_line += wait.progress_every;
    }
    std::this_thread::sleep_for(poll);
    poll = std::min<std::chrono::milliseconds>(2 * poll, wait.longest_poll);
  }
  std::vector<uint8_t> bytes;
  KEEL_RETURN_IF_ERROR(
      base::CallTorch(absl::StatusCode::kUnavailable, context, [&] { bytes = store->get(key); }));
  const absl::Status published = base::StatusFromBytes(
      absl::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
  if (published.ok()) return published;
  return absl::Status(published.code(), absl::StrCat("rank 0: ", published.message()));
}

ProcessGroups::ProcessGroups(parallel::DeviceMesh mesh, at::Device device)
    : mesh_(std::move(mesh)), device_(device) {}
ProcessGroups::ProcessGroups(ProcessGroups&&) noexcept = default;
ProcessGroups& ProcessGroups::operator=(ProcessGroups&&) noexcept = default;
ProcessGroups::~ProcessGroups() = default;

namespace {

// Writes `what`, then " (<seconds since its start> s<after>)", to `log` every `every` on a
// thread of its own, until it is destroyed.
class ProgressLine {
 public:
  ProgressLine(std::ostream& log, std::string what, std::string after,
               std::chrono::milliseconds every)
      : thread_([this, &log, what = std::move(what), after = std::move(after), every] {
          const auto start = std::chrono::steady_clock::now();
          std::unique_lock<std::mutex> lock(mutex_);
          while (!done_.wait_for(lock, every, [this] { return stop_; })) {
            const auto waited = std::chrono::duration_cast<std::chrono::seconds>(
                std::chrono::steady_clock::now() - start);
            log << what << " (" << waited.count() << " s" << after << ")" << std::endl;
          }
        }) {}
  ~ProgressLine() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    done_.notify_one();
    thread_.join();
  }

 private:
  std::mutex mutex_;
  std::condition_variable done_;
  bool stop_ = false;
  std::thread thread_;  // last: it starts once the members above exist
};

}  // namespace

absl::StatusOr<ProcessGroups> ProcessGroups::Connect(const parallel::WorkerEnv& env,
                                                     const DistributedOptions& options,
                                                     std::ostream* log,
                                                     std::chrono::milliseconds progress_every) {
  const absl::StatusOr<at::Device> device = parallel::SelectDevice(options.backend, env.local_rank);
  KEEL_RETURN_IF_ERROR(base::Annotate(device.status(), "distributed"));
  std::optional<ProgressLine> progress;
  if (log != nullptr && env.world_size > 1 && env.local_rank == 0) {
    progress.emplace(*log,
                     absl::StrCat("rendezvous at ", env.master_addr, ":", env.master_port,
                                  ": waiting for the ", env.world_size, " ranks"),
                     absl::StrCat(" of distributed.timeout_seconds ", options.timeout_seconds),
                     progress_every);
  }
  KEEL_ASSIGN_OR_RETURN(
      parallel::DeviceMesh mesh,
      parallel::DeviceMesh::Connect(env, options.parallel, options.backend,
                                    std::chrono::seconds(options.timeout_seconds)));
  return ProcessGroups(std::move(mesh), *device);
}

void ProcessGroups::Attach(TrainRuntime& runtime) const { AttachMesh(mesh_, device_, runtime); }

void AttachMesh(const parallel::DeviceMesh& mesh, const at::Device& device, TrainRuntime& runtime) {
  runtime.rank = mesh.rank();
  runtime.world_size = mesh.world_size();
  runtime.dp_rank = mesh.GroupRank(parallel::GroupKind::kDp);
  runtime.dp_size = mesh.GroupSize(parallel::GroupKind::kDp);
  runtime.mesh = &mesh;
  runtime.device = device;
}

}  // namespace keel::tools::recipe
