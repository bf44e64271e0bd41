#include "checkpoint/reader.h"

#include <optional>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "checkpoint/internal/disk_state.h"
#include "checkpoint/state_dict.h"

namespace keel::checkpoint {
namespace {

absl::Status NoObject(const std::string& name) {
  return absl::NotFoundError(absl::StrCat("no object \"", name, "\" in the checkpoint"));
}

}  // namespace

class CheckpointReader::Impl {
 public:
  explicit Impl(std::unique_ptr<internal::DiskSavedState> saved) : saved(std::move(saved)) {}
  std::unique_ptr<internal::DiskSavedState> saved;
};

absl::StatusOr<std::unique_ptr<CheckpointReader>> CheckpointReader::Open(const std::string& path) {
  KEEL_ASSIGN_OR_RETURN(std::unique_ptr<internal::DiskSavedState> saved,
                        internal::DiskSavedState::Open(path));
  return std::unique_ptr<CheckpointReader>(
      new CheckpointReader(std::make_unique<Impl>(std::move(saved))));
}

CheckpointReader::CheckpointReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CheckpointReader::~CheckpointReader() = default;

const Manifest& CheckpointReader::manifest() const { return impl_->saved->manifest(); }

absl::StatusOr<at::Tensor> CheckpointReader::ReadTensor(const std::string& name) const {
  auto it = impl_->saved->tensors().find(name);
  if (it == impl_->saved->tensors().end()) {
    return absl::NotFoundError(absl::StrCat("no tensor \"", name, "\" in the checkpoint"));
  }
  at::Tensor tensor =
      at::empty(it->second.info.shape, at::TensorOptions().dtype(it->second.info.dtype));
  const size_t slash = name.find('/');
  LoadReport report;
  StateReader reader(*impl_->saved, name.substr(0, slash), report);
  KEEL_RETURN_IF_ERROR(reader.ReadTensor(name.substr(slash + 1), {tensor}));
  return tensor;
}

absl::StatusOr<base::Json> CheckpointReader::ReadValues(const std::string& name) const {
  auto it = impl_->saved->values().find(name);
  if (it == impl_->saved->values().end()) return NoObject(name);
  if (it->second.size() != 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("object \"", name, "\" holds different values on each of its ",
                     it->second.size(), " ranks; read them with ReadValuesOfEachRank"));
  }
  return it->second[0];
}

absl::StatusOr<std::vector<base::Json>> CheckpointReader::ReadValuesOfEachRank(
    const std::string& name) const {
  std::optional<std::vector<base::Json>> values = impl_->saved->ValuesOfEachRank(name);
  if (!values) return NoObject(name);
  return *std::move(values);
}

}  // namespace keel::checkpoint
