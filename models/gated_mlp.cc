#include "models/gated_mlp.h"

#include <vector>

#include "ATen/ATen.h"

namespace keel::models {

GatedMlpImpl::GatedMlpImpl(int64_t hidden_size, int64_t intermediate_size, c10d::ProcessGroup* tp,
                           bool sequence_parallel)
    : gate_proj_(register_module(
          "gate_proj", parallel::ColumnParallelLinear(hidden_size, intermediate_size, tp,
                                                      /*bias=*/false, /*gather_output=*/false,
                                                      sequence_parallel))),
      up_proj_(register_module(
          "up_proj", parallel::ColumnParallelLinear(hidden_size, intermediate_size, tp,
                                                    /*bias=*/false, /*gather_output=*/false,
                                                    sequence_parallel))),
      down_proj_(register_module(
          "down_proj", parallel::RowParallelLinear(intermediate_size, hidden_size, tp,
                                                   /*bias=*/false, /*input_is_parallel=*/true,
                                                   sequence_parallel))) {}

at::Tensor GatedMlpImpl::forward(const at::Tensor& x) {
  // gate and up from one product (and under sequence parallelism one gather of x).
  const std::vector<at::Tensor> gate_up =
      parallel::ColumnParallelLinearImpl::ForwardStacked(x, {gate_proj_.get(), up_proj_.get()});
  return down_proj_->forward(at::silu(gate_up[0]) * gate_up[1]);
}

}  // namespace keel::models
