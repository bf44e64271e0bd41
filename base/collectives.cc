#include "base/collectives.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "base/torch_status.h"
#include "torch/csrc/distributed/c10d/ProcessGroup.hpp"

namespace keel::base {

int GroupSize(const c10d::ProcessGroup* group) { return group == nullptr ? 1 : group->getSize(); }

int GroupRank(const c10d::ProcessGroup* group) { return group == nullptr ? 0 : group->getRank(); }

absl::Status AllReduce(at::Tensor& tensor, Reduce op, c10d::ProcessGroup& group,
                       absl::string_view context) {
  KEEL_RETURN_IF_ERROR(
      CheckGroupCarries(&group, tensor.device(), absl::StrCat("all-reducing ", context)));
  std::vector<at::Tensor> tensors = {tensor};
  c10d::AllreduceOptions options;
  switch (op) {
    case Reduce::kSum:
      options.reduceOp = c10d::ReduceOp::SUM;
      break;
    case Reduce::kMax:
      options.reduceOp = c10d::ReduceOp::MAX;
      break;
    case Reduce::kMin:
      options.reduceOp = c10d::ReduceOp::MIN;
      break;
  }
  return CallTorch(absl::StatusCode::kUnavailable, absl::StrCat("all-reducing ", context),
                   [&] { group.allreduce(tensors, options)->wait(); });
}

absl::StatusOr<std::vector<std::string>> AllGatherBytes(const std::string& bytes,
                                                        c10d::ProcessGroup& group,
                                                        absl::string_view context) {
  KEEL_RETURN_IF_ERROR(
      CheckGroupCarries(&group, at::kCPU, absl::StrCat("all-gathering ", context)));
  const int world = group.getSize();
  std::vector<std::string> gathered(world);
  KEEL_RETURN_IF_ERROR(
      CallTorch(absl::StatusCode::kUnavailable, absl::StrCat("all-gathering ", context), [&] {
        // Lengths first, then the payloads padded to the longest (list-based all-gather).
        std::vector<at::Tensor> length = {
            at::full({1}, static_cast<int64_t>(bytes.size()), at::kLong)};
        std::vector<std::vector<at::Tensor>> lengths(1);
        for (int r = 0; r < world; ++r) lengths[0].push_back(at::empty({1}, at::kLong));
        group.allgather(lengths, length)->wait();
        int64_t longest = 0;
        for (const at::Tensor& l : lengths[0]) longest = std::max(longest, l.item<int64_t>());
        std::vector<at::Tensor> payload = {at::zeros({std::max<int64_t>(longest, 1)}, at::kByte)};
        std::memcpy(payload[0].data_ptr(), bytes.data(), bytes.size());
        std::vector<std::vector<at::Tensor>> payloads(1);
        for (int r = 0; r < world; ++r) payloads[0].push_back(at::empty_like(payload[0]));
        group.allgather(payloads, payload)->wait();
        for (int r = 0; r < world; ++r) {
          gathered[r].assign(static_cast<const char*>(payloads[0][r].data_ptr()),
                             lengths[0][r].item<int64_t>());
        }
      }));
  return gathered;
}

namespace {

// One byte of status code, then the payload or the error message.
std::string Frame(const absl::Status& status, const std::string& payload) {
  std::string frame(1, static_cast<char>(status.code()));
  frame += status.ok() ? payload : std::string(status.message());
  return frame;
}

}  // namespace

std::string StatusBytes(const absl::Status& status) { return Frame(status, ""); }

absl::Status StatusFromBytes(absl::string_view bytes) {
  if (bytes.empty()) return absl::InternalError("an empty status record");
  const auto code = static_cast<absl::StatusCode>(bytes[0]);
  if (code == absl::StatusCode::kOk) return absl::OkStatus();
  return absl::Status(code, bytes.substr(1));
}

absl::StatusOr<std::vector<std::string>> ExchangeWithStatus(const absl::Status& status,
                                                            const std::string& payload,
                                                            c10d::ProcessGroup* group,
                                                            absl::string_view context) {
  std::vector<std::string> frames;
  if (group == nullptr) {
    frames.push_back(Frame(status, payload));
  } else {
    KEEL_ASSIGN_OR_RETURN(frames, AllGatherBytes(Frame(status, payload), *group, context));
  }
  std::vector<std::string> payloads;
  for (size_t rank = 0; rank < frames.size(); ++rank) {
    if (const absl::Status failed = StatusFromBytes(frames[rank]); !failed.ok()) {
      return absl::Status(failed.code(), frames.size() == 1
                                             ? std::string(failed.message())
                                             : absl::StrCat("rank ", rank, ": ", failed.message()));
    }
    payloads.push_back(frames[rank].substr(1));
  }
  return payloads;
}

absl::Status AgreeOnStatus(const absl::Status& status, c10d::ProcessGroup* group,
                           absl::string_view context) {
  return ExchangeWithStatus(status, "", group, context).status();
}

absl::Status AgreeOnFailure(const absl::Status& status, c10d::ProcessGroup& group,
                            const at::Device& device, absl::string_view context) {
  const int64_t world = group.getSize();
  at::Tensor lowest = at::full({1}, status.ok() ? world : group.getRank(),
                               at::TensorOptions().dtype(at::kLong).device(device));
  absl::Status reduced = AllReduce(lowest, Reduce::kMin, group, context);
  if (!status.ok()) return status;
  KEEL_RETURN_IF_ERROR(reduced);
  const int64_t failed = lowest.item<int64_t>();
  if (failed == world) return absl::OkStatus();
  return absl::AbortedError(absl::StrCat("rank ", failed, " failed ", context, "; see its error"));
}

absl::Status CheckGroupCarries(const c10d::ProcessGroup* group, const at::Device& device,
                               absl::string_view what) {
  if (group == nullptr) return absl::OkStatus();
  const std::string backend = group->getBackendName();
  if (backend == "nccl" && device.is_cpu()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what,
        ": a host (cpu) tensor cannot go over a process group of backend \"nccl\", which "
        "carries device tensors only; keep it on the group's device, or exchange host values "
        "over a Gloo group of the same ranks"));
  }
  if (backend == "gloo" && !device.is_cpu()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": a ", device.str(),
        " tensor cannot go over a process group of backend "
        "\"gloo\", which Keel uses for host (cpu) tensors only; copy it to the host, or use the "
        "device group of the same ranks"));
  }
  return absl::OkStatus();
}

void CheckGroupCarriesOrThrow(const c10d::ProcessGroup* group, const at::Device& device,
                              absl::string_view what) {
  const absl::Status status = CheckGroupCarries(group, device, what);
  TORCH_CHECK(status.ok(), std::string(status.message()));
}

}  // namespace keel::base
