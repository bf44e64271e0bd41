#include "checkpoint/training_state.h"

#include <mutex>
#include <utility>
#include <vector>

#include "ATen/ops/empty.h"
#include "base/status.h"
#include "base/torch_status.h"
#include "parallel/layout.h"

namespace keel::checkpoint {
namespace {

constexpr char kCpuKey[] = "cpu";

}  // namespace

RngState::RngState(int64_t rank, int64_t world_size, at::Generator generator,
                   RngStateOptions options)
    : rank_(rank), world_size_(world_size), generator_(std::move(generator)), options_(options) {}

absl::StatusOr<State> RngState::StateDict() const {
  at::Generator generator = generator_;
  at::Tensor bytes;
  {
    std::lock_guard<std::mutex> lock(generator.mutex());
    bytes = generator.get_state();
  }
  const int64_t n = bytes.numel();
  State state;
  state.tensors[kCpuKey] =
      TensorRef{bytes.reshape({1, n}), parallel::BlockLayout({world_size_, n}, {rank_, 0})};
  return state;
}

absl::Status RngState::LoadStateDict(StateReader& reader) {
  at::Generator generator = generator_;
  int64_t n = 0;
  {
    std::lock_guard<std::mutex> lock(generator.mutex());
    n = generator.get_state().numel();
  }
  const SavedTensorInfo* info = reader.FindTensor(kCpuKey);
  const int64_t saved_ranks =
      info != nullptr && info->shape.size() == 2 ? info->shape[0] : world_size_;
  if (info != nullptr && !reader.checking()) saved_world_size_ = saved_ranks;
  if (saved_ranks != world_size_) {
    if (options_.allow_world_size_change) {
      reader.Skip(kCpuKey);
      return absl::OkStatus();
    }
    reader.ReportMismatch(absl::StrCat("RNG state ", kCpuKey, ": saved for ", saved_ranks,
                                       " ranks, loaded by ", world_size_));
  }
  if (rank_ >= saved_ranks) return absl::OkStatus();
  const at::Tensor row = at::empty({1, n}, at::TensorOptions().dtype(at::kByte));
  const std::vector<int64_t> global = {saved_ranks, n};
  KEEL_RETURN_IF_ERROR(
      reader.ReadTensor(kCpuKey, TensorRef{row, parallel::BlockLayout(global, {rank_, 0})}));
  if (info == nullptr || info->dtype != at::kByte || info->shape != global || reader.checking()) {
    return absl::OkStatus();  // reported by ReadTensor, or only checking
  }
  return base::CallTorch(absl::StatusCode::kDataLoss, "restoring the CPU generator state", [&] {
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(row.reshape({n}));
  });
}

}  // namespace keel::checkpoint
