// The trainer's --dry_run: the schedule a configuration gives, computed without training. The
// data is counted (the dataset's index, or the default corpus prepared in a temporary
// directory), the StepScheduler and the LR schedule are walked step by step as the run would,
// and nothing is trained, loaded or checkpointed; only <run_dir>/schedule.svg is written.
//
//   KEEL_RETURN_IF_ERROR(DryRun(options, world_size, std::cout));
#ifndef KEEL_TOOLS_RECIPE_DRY_RUN_H_
#define KEEL_TOOLS_RECIPE_DRY_RUN_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "tools/recipe/options.h"

namespace keel::tools::recipe {

// Prints, for a run of `options` on `world_size` ranks: the layout, the precision and the
// memory of a rank's model state (tools/recipe/memory.h); the data (training, sampled and
// validation windows; with data.paths, each dataset's weight, samples drawn and epochs per
// split, planned without building an index); max_steps after the epoch cap, num_epochs,
// grad_acc_steps per rank, samples and tokens per step and in total; the checkpoint, validation and
// gc steps (as CompressSteps writes them); the learning rate and weight decay at the first,
// warm-up-end, checkpoint and last steps; warnings when num_epochs caps max_steps or a checkpoint
// or validation cadence never fires. Writes the LR and WD schedule to <run_dir>/schedule.svg. Steps
// are numbered as the trainer logs them (1 to max_steps; a checkpoint of step s is
// checkpoints/step_s). Errors: those of the trainer's data, step scheduler and LR scheduler
// construction, and of writing the plot.
[[nodiscard]] absl::Status DryRun(const TrainOptions& options, int world_size, std::ostream& out);

// Increasing steps in short form: runs of three or more at a constant stride become
// "first-last" (stride 1) or "first-last every stride", joined with ", "; "none" when empty.
// {1, 2, 3, 5, 50, 100, 150, 200} -> "1-3, 5, 50-200 every 50".
std::string CompressSteps(const std::vector<int64_t>& steps);

}  // namespace keel::tools::recipe

#endif  // KEEL_TOOLS_RECIPE_DRY_RUN_H_
