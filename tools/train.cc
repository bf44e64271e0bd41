// bazel run //tools:train [-- --config=FILE --set section.field=value ...]
//
// Trains the default GPT on the default corpus (tools/recipe/default.textproto) or what the
// config says, single-process or under the torchrun contract (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT: `torchrun --no_python --nproc_per_node=2
// bazel-bin/tools/train ...` or `bazel run //tools:launch -- --nproc_per_node=2 -- ...`).
// --dry_run prints the schedule the config gives on that many ranks and trains nothing.
// Exit codes (tools/cli/exit_code.h): 0 done, or preempted after a checkpoint; 1 training
// failed; 2 bad usage or configuration.
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ATen/Parallel.h"
#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/status.h"
#include "parallel/torchrun_env.h"
#include "tools/cli/exit_code.h"
#include "tools/cli/flags.h"
#include "tools/recipe/config.pb.h"
#include "tools/recipe/dry_run.h"
#include "tools/recipe/options.h"
#include "tools/recipe/run.h"
#include "tools/recipe/runtime.h"
#include "tools/recipe/tool_config.h"

ABSL_FLAG(bool, dry_run, false,
          "Prints the schedule the config gives (steps, epochs, checkpoint and validation "
          "steps, learning rate and weight decay) and writes <run_dir>/schedule.svg; trains, "
          "loads and checkpoints nothing.");
ABSL_FLAG(std::string, config, "",
          "Config in protobuf text format (tools/recipe/config.proto); default: "
          "tools/recipe/default.textproto.");

namespace keel::tools {
namespace {

// Intra-op threads: the cores divided among the local ranks, unless OMP_NUM_THREADS says.
void SetThreads(const parallel::WorkerEnv& env) {
  if (std::getenv("OMP_NUM_THREADS") != nullptr) return;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  at::set_num_threads(std::max(1, cores / std::max(1, env.local_world_size)));
}

// Reads the config (with paths as the user typed them) and checks it for this world size.
absl::StatusOr<recipe::TrainOptions> ReadTrainOptions(const char* argv0,
                                                      const std::vector<std::string>& overrides,
                                                      const parallel::WorkerEnv& env) {
  KEEL_ASSIGN_OR_RETURN(recipe::TrainConfig config,
                        recipe::LoadToolConfig(argv0, absl::GetFlag(FLAGS_config), overrides));
  KEEL_ASSIGN_OR_RETURN(recipe::TrainOptions options, recipe::ReadOptions(config));
  KEEL_RETURN_IF_ERROR(recipe::CheckGeometry(options, env.world_size).status());
  return options;
}

absl::Status Main(int argc, char** argv) {
  std::vector<std::string> overrides = recipe::TakeOverrides(argc, argv);
  absl::SetProgramUsageMessage(
      "trains a GPT on the default corpus, a Megatron indexed dataset or Megatron's GPT "
      "datasets of data.paths.\n"
      "  train [--config=FILE] [--set section.field=value]... [--dry_run]");
  cli::ParseFlags(argc, argv);
  KEEL_ASSIGN_OR_RETURN(const parallel::WorkerEnv env, parallel::ReadWorkerEnv());
  KEEL_ASSIGN_OR_RETURN(const recipe::TrainOptions options,
                        ReadTrainOptions(argv[0], overrides, env));
  if (absl::GetFlag(FLAGS_dry_run)) {
    // For the world size of the launch; one rank prints it.
    if (env.rank != 0) return absl::OkStatus();
    return recipe::DryRun(options, env.world_size, std::cout);
  }
  SetThreads(env);
  KEEL_ASSIGN_OR_RETURN(const recipe::ProcessGroups groups,
                        recipe::ProcessGroups::Connect(env, options.distributed, &std::cout));
  recipe::TrainRuntime runtime;
  groups.Attach(runtime);
  runtime.log = &std::cout;
  runtime.local_world_size = env.local_world_size;
  runtime.restart_count = env.restart_count;
  runtime.restart_cause = env.restart_cause;
  return recipe::Train(options, std::move(runtime)).status();
}

}  // namespace
}  // namespace keel::tools

int main(int argc, char** argv) {
  // OpenMP threads that spin between ATen's parallel regions take the cores OpenBLAS's own
  // threads need for the matrix products: on 2 cores a step ran 3-4x slower (docs/
  // performance.md). libgomp reads OMP_WAIT_POLICY as it loads, before main, so an unset
  // policy is set to PASSIVE and the binary restarts itself once; a user's value is kept.
  if (std::getenv("OMP_WAIT_POLICY") == nullptr) {
    setenv("OMP_WAIT_POLICY", "PASSIVE", /*overwrite=*/1);
    execv("/proc/self/exe", argv);  // returns only on failure: then run on as we are
  }
  // LibTorch's CPU tensors come from malloc, and glibc serves those above its mmap threshold
  // with fresh mappings that fault in, zero-filled, page by page on every step. A fixed
  // threshold keeps activation buffers in the heap for reuse: 13x fewer page faults and a step
  // 10% faster on the default model (docs/performance.md).
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  return keel::tools::cli::Exit("train", keel::tools::Main(argc, argv));
}
