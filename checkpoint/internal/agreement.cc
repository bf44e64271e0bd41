#include "checkpoint/internal/agreement.h"

#include "absl/strings/str_cat.h"
#include "base/collectives.h"
#include "base/status.h"

namespace keel::checkpoint::internal {
namespace {

// One byte of status code, then the payload or the error message.
std::string Frame(const absl::Status& status, const std::string& payload) {
  std::string frame(1, static_cast<char>(status.code()));
  frame += status.ok() ? payload : std::string(status.message());
  return frame;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> Exchange(const absl::Status& status,
                                                  const std::string& payload,
                                                  c10d::ProcessGroup* group,
                                                  absl::string_view what) {
  std::vector<std::string> frames;
  if (group == nullptr) {
    frames.push_back(Frame(status, payload));
  } else {
    KEEL_ASSIGN_OR_RETURN(frames, base::AllGatherBytes(Frame(status, payload), *group, what));
  }
  std::vector<std::string> payloads;
  for (size_t rank = 0; rank < frames.size(); ++rank) {
    const auto code = frames[rank].empty() ? absl::StatusCode::kInternal
                                           : static_cast<absl::StatusCode>(frames[rank][0]);
    if (code != absl::StatusCode::kOk) {
      const std::string message = frames[rank].substr(1);
      return absl::Status(
          code, frames.size() == 1 ? message : absl::StrCat("rank ", rank, ": ", message));
    }
    payloads.push_back(frames[rank].substr(1));
  }
  return payloads;
}

absl::Status Agree(const absl::Status& status, c10d::ProcessGroup* group, absl::string_view what) {
  return Exchange(status, "", group, what).status();
}

}  // namespace keel::checkpoint::internal
