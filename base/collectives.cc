#include "base/collectives.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "base/torch_status.h"
#include "torch/csrc/distributed/c10d/ProcessGroup.hpp"

namespace keel::base {

absl::Status AllReduce(at::Tensor& tensor, Reduce op, c10d::ProcessGroup& group,
                       absl::string_view context) {
  std::vector<at::Tensor> tensors = {tensor};
  c10d::AllreduceOptions options;
  options.reduceOp = op == Reduce::kSum ? c10d::ReduceOp::SUM : c10d::ReduceOp::MAX;
  return CallTorch(absl::StatusCode::kUnavailable, absl::StrCat("all-reducing ", context),
                   [&] { group.allreduce(tensors, options)->wait(); });
}

}  // namespace keel::base
