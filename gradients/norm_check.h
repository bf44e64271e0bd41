// A second computation of the gradient norm that does not trust the layouts' reductions, for
// runs that must not train on a norm nobody checked (NeMo AutoModel #3816: each expert-parallel
// group computed its own "global" norm; Megatron-LM #5916: experts left out of the norm when EP
// and TP combine). Every rank describes each gradient block it holds (its parameter's name,
// where the block sits in the whole tensor, its squared sum and a hash of its bytes); all ranks
// gather the descriptions, and each distinct block counts once. Blocks that two ranks claim to
// hold alike but whose bytes differ, or that do not fit or cover their whole tensor, name the
// parameters whose layout is wrong.
//
//   KEEL_ASSIGN_OR_RETURN(at::Tensor norm, ClipGradNorm(max_norm, params));
//   KEEL_ASSIGN_OR_RETURN(NormCheck check, CheckGradNorm(params, world_gloo_group));
//   if (!check.Agrees(norm.item<double>())) ...  // check.problems name the parameters
#ifndef KEEL_GRADIENTS_NORM_CHECK_H_
#define KEEL_GRADIENTS_NORM_CHECK_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gradients/parameters.h"

namespace c10d {
class ProcessGroup;
}  // namespace c10d

namespace keel::gradients {

struct NormCheck {
  // The 2-norm of every distinct gradient block of every rank, each counted once.
  double norm = 0.0;
  // One line per parameter whose blocks contradict its layout.
  std::vector<std::string> problems;

  // No problem, and `reported` (a norm the layouts' reductions gave) within rounding of `norm`
  // (a relative 1e-6: the two sum the same squares in another order).
  bool Agrees(double reported) const;
};

// Gathers the description of every gradient block (each parameter's gradient, with its layout;
// a parameter without one is a whole tensor; a missing gradient is zeros) from every rank of
// `group`, which must hold every rank that holds gradients (the world, for a mesh). Run it
// after ClipGradNorm, which resolves Partial gradients into whole ones. Collective: over
// `group` (a Gloo group: the descriptions are host bytes); nullptr for a single process.
// Errors: kInvalidArgument for a Partial dimension left in a layout; kUnavailable from peers.
[[nodiscard]] absl::StatusOr<NormCheck> CheckGradNorm(const std::vector<NamedParameter>& parameters,
                                                      c10d::ProcessGroup* group);

}  // namespace keel::gradients

#endif  // KEEL_GRADIENTS_NORM_CHECK_H_
