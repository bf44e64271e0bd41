// What the end-to-end tests of //tools:train share: a small run's arguments, starting the
// trainer alone or as ranks (//tools:launch), reading its progress, and comparing runs by
// their metrics and checkpoints. Children run with OMP_NUM_THREADS=1, so every run of a
// configuration computes the same floating-point operations in the same order.
//
//   Subprocess child = StartTrain(SmallRun(dir, 24), dir + "/stderr");
//   ASSERT_TRUE(ReadUntilStep(child, 10));
//   kill(child.pid(), SIGTERM);
//   ExpectSameTrace(Metrics(reference_dir), Metrics(dir));
#ifndef KEEL_TOOLS_TRAIN_TESTUTIL_H_
#define KEEL_TOOLS_TRAIN_TESTUTIL_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/declare.h"
#include "tools/cli/subprocess_testutil.h"
#include "tools/recipe/metrics.h"

// Paths of the binaries and the default configuration, passed by the test's BUILD rule;
// --torchrun is the torchrun of the PyTorch of Keel's LibTorch (@libtorch//:torchrun).
ABSL_DECLARE_FLAG(std::string, train);
ABSL_DECLARE_FLAG(std::string, torchrun);
ABSL_DECLARE_FLAG(std::string, launch);
ABSL_DECLARE_FLAG(std::string, preprocess);
ABSL_DECLARE_FLAG(std::string, config);

namespace keel::tools {

std::string Absolute(const std::string& path);

// A model and batch small enough for many runs in a test: 2 layers of width 64 over 64-token
// windows, 8 samples a step in micro-batches of 4; validation every 8 steps and an
// (asynchronous) checkpoint every 3, so that runs cross both; a progress line every step; the
// gradient norm checked against every rank's blocks at every step.
// `more` are further section.field=value assignments, applied after these.
std::vector<std::string> SmallRun(const std::string& run_dir, int64_t max_steps,
                                  const std::vector<std::string>& more = {});

// SmallRun shuffling globally (sampler.shuffle_scope=global): the samples of each step are the
// same on any number of data-parallel ranks, so runs of different layouts differ only in their
// arithmetic.
std::vector<std::string> SameSamplesRun(const std::string& run_dir, int64_t max_steps,
                                        std::vector<std::string> more = {});

// An indexed dataset of 40 documents of 300 random tokens below the vocabulary (131) of the
// fixtures of testdata/hf_parity, written once; its prefix.
std::string HfFixtureTokens();

// Assignments for a run from the fixture `name` of testdata/hf_parity (the test's data must
// hold it) on HfFixtureTokens, 16-token windows, with SmallRun's model sizes.
std::vector<std::string> PretrainedRun(const std::string& name);

// The options of a trainer child: OMP_NUM_THREADS=1, no inherited torchrun variables, stderr
// to `stderr_path`, stdout piped; `environment` adds NAME=VALUE entries.
cli::SubprocessOptions ChildOptions(const std::string& stderr_path,
                                    std::vector<std::string> environment = {});

// //tools:train with `args`, as one process.
cli::Subprocess StartTrain(const std::vector<std::string>& args, const std::string& stderr_path,
                           std::vector<std::string> environment = {});

// //tools:train with `args` on `ranks` ranks under //tools:launch (a free port, and
// `launch_flags`), as a new process group: Subprocess::KillGroup kills the launcher and every
// rank at once.
cli::Subprocess LaunchTrain(int ranks, const std::vector<std::string>& args,
                            const std::string& stderr_path,
                            const std::vector<std::string>& launch_flags = {});

// Why --torchrun cannot run (no Python installation goes with this LibTorch), or nullopt:
// `if (auto why = WhyNoTorchrun()) GTEST_SKIP() << *why;`
std::optional<std::string> WhyNoTorchrun();

// //tools:train with `args` on `ranks` ranks under torchrun (--torchrun, a free port).
// Requires: !WhyNoTorchrun().
cli::Subprocess TorchrunTrain(int ranks, const std::vector<std::string>& args,
                              const std::string& stderr_path);

// The step of a progress line ("step    12/24 | loss ..."), if `line` is one.
std::optional<int64_t> ProgressStep(const std::string& line);

// Reads the child's output until the progress line of step `step`; false if it ended first.
bool ReadUntilStep(cli::Subprocess& child, int64_t step);

// The number after `prefix` in `text` ("preempted at step 9;" -> 9).
std::optional<int64_t> NumberAfter(const std::string& text, const std::string& prefix);

// The run's metrics.jsonl, every step (fails the test if it cannot be read).
std::vector<recipe::StepMetrics> Metrics(const std::string& run_dir);

// The most bytes of live tensors rank 0 held at once over the run's steps, in GiB (the largest
// max_memory_allocated_gib of its metrics); fails the test if no step reported it.
double PeakTensorMemoryGib(const std::string& run_dir);

// The newest checkpoint of a run, every byte verified; fails the test if a newer one was
// skipped (nothing corrupt may ever be committed).
std::string LatestCheckpoint(const std::string& run_dir);

// The trainer on `ranks` ranks: alone (StartTrain) for 1, else under //tools:launch.
cli::Subprocess StartOnRanks(int ranks, const std::vector<std::string>& args,
                             const std::string& stderr_path);

// A configuration the trainer must refuse: SameSamplesRun(run_dir, 4, assignments) on `ranks`
// ranks exits 2 with `message` on stderr.
void ExpectRefused(int ranks, const std::vector<std::string>& assignments,
                   const std::string& message, const std::string& run_dir);

// How far a run of another layout may stray from the one-rank run, relative: its first loss,
// its later losses and its gradient norms (ExpectCloseTrace). The defaults are float32 runs'.
struct TraceBounds {
  double first_loss = 1e-6;
  double loss = 1e-4;
  double grad_norm = 1e-3;
};

// The run at `run_dir` follows the run at `reference` within `bounds` over the reference's
// steps, as a run of another layout must.
void ExpectLayoutInvariant(const std::string& reference, const std::string& run_dir,
                           const TraceBounds& bounds = {});

// One leg of a run that changes its layout at each resume.
struct Leg {
  int ranks = 1;
  // section.field=value assignments beside SameSamplesRun's.
  std::vector<std::string> assignments;
};

// One run (SameSamplesRun in a new temporary directory named after `name`) through `legs`,
// `steps_per_leg` steps each, each leg resuming from the last one's final checkpoint, beside
// an uninterrupted one-rank run of as many steps: every leg after the first says it resumed,
// none warns of a checkpoint, and the whole trace follows the one-rank run's (ExpectCloseTrace,
// 1e-4 and 1e-3). `after_leg(i, run_dir)` runs after leg i. Returns the one-rank run's
// directory.
// `common` assignments go to every run, the one-rank one included.
std::string ExpectResumesAcrossLayouts(
    const std::string& name, const std::vector<Leg>& legs, int64_t steps_per_leg,
    const std::function<void(size_t, const std::string&)>& after_leg,
    const std::vector<std::string>& common = {});

// A run of `steps` steps on `ranks` ranks (under //tools:launch) with the arguments
// `args(run_dir)`, its rank group killed with SIGKILL after step 7 and after step 12 (its
// asynchronous save in flight) and resumed each time, ends as the uninterrupted run does: every
// loss, the weights and the optimizer state to the bit. `name` names the temporary directories.
void ExpectKillNineResumesBitIdentically(
    const std::string& name, int ranks, int64_t steps,
    const std::function<std::vector<std::string>(const std::string&)>& args);

// Every step's loss, learning rate, gradient norm and validation loss are the same doubles.
void ExpectSameTrace(const std::vector<recipe::StepMetrics>& expected,
                     const std::vector<recipe::StepMetrics>& actual);

// The same steps, epochs and learning rates; each loss and validation loss within
// `loss_relative` of the expected one, each gradient norm within `grad_norm_relative` (runs
// whose sums associate differently).
void ExpectCloseTrace(const std::vector<recipe::StepMetrics>& expected,
                      const std::vector<recipe::StepMetrics>& actual, double loss_relative,
                      double grad_norm_relative);

// The two checkpoints hold the same step and bit-identical model weights and optimizer state.
void ExpectSameWeights(const std::string& expected_path, const std::string& actual_path);
// Bit-identical model weights and optimizer state, whatever the checkpoints' steps.
void ExpectSameModelAndOptimizer(const std::string& expected_path, const std::string& actual_path);

// Tensors by name: dtype (as checkpoint::SafetensorsDtype's number) and shape.
using TensorShapes = std::map<std::string, std::pair<int, std::vector<int64_t>>>;

// Every tensor `<ckpt> export-safetensors <checkpoint> <out> <flags...>` writes (fails the test
// if the export fails).
TensorShapes ExportedTensors(const std::string& ckpt, const std::string& checkpoint,
                             const std::string& out, const std::vector<std::string>& flags = {});

}  // namespace keel::tools

#endif  // KEEL_TOOLS_TRAIN_TESTUTIL_H_
