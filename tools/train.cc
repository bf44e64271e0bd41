// bazel run //tools:train [-- --config=FILE --set section.field=value ...]
//
// Trains the default GPT on the default corpus (tools/train_default.textproto) or what the
// config says, single-process or under the torchrun contract (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT: `torchrun --no_python --nproc_per_node=2
// bazel-bin/tools/train ...` or `bazel run //tools:launch -- --nproc_per_node=2 -- ...`).
// Exit codes: 0 done or preempted after a checkpoint, 1 training failed, 2 bad usage.
#include <malloc.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ATen/Parallel.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "base/torch_compat.h"
#include "base/torch_status.h"
#include "tools/cpp/runfiles/runfiles.h"
#include "tools/train_config.h"
#include "tools/trainer.h"
#include "tools/user_path.h"
#include "torch/csrc/distributed/c10d/HashStore.hpp"
#include "torch/csrc/distributed/c10d/PrefixStore.hpp"
#include "torch/cuda.h"

ABSL_FLAG(std::string, config, "",
          "Config in protobuf text format (tools/train_config.proto); default: "
          "tools/train_default.textproto.");

namespace keel::tools {
namespace {

using bazel::tools::cpp::runfiles::Runfiles;

// The torchrun contract, read once here (components never read the environment).
struct Launch {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // torchrun's agent hosts the store (TORCHELASTIC_USE_AGENT_STORE=True) and every rank is a
  // client under the prefix /worker/attempt_<TORCHELASTIC_RESTART_COUNT>, as PyTorch's env://
  // rendezvous does (torch/distributed/rendezvous.py); otherwise rank 0 hosts it.
  bool agent_store = false;
  int restart_count = 0;
};

absl::StatusOr<int> EnvInt(const char* name, int fallback) {
  const char* value = std::getenv(name);
  if (value == nullptr) return fallback;
  int parsed = 0;
  if (!absl::SimpleAtoi(value, &parsed) || parsed < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("environment ", name, "=\"", value, "\" is not a non-negative integer"));
  }
  return parsed;
}

absl::StatusOr<Launch> ReadLaunch() {
  Launch launch;
  KEEL_ASSIGN_OR_RETURN(launch.world_size, EnvInt("WORLD_SIZE", 1));
  KEEL_ASSIGN_OR_RETURN(launch.rank, EnvInt("RANK", 0));
  KEEL_ASSIGN_OR_RETURN(launch.local_rank, EnvInt("LOCAL_RANK", launch.rank));
  KEEL_ASSIGN_OR_RETURN(launch.local_world_size, EnvInt("LOCAL_WORLD_SIZE", launch.world_size));
  KEEL_ASSIGN_OR_RETURN(launch.master_port, EnvInt("MASTER_PORT", 29500));
  if (const char* addr = std::getenv("MASTER_ADDR")) launch.master_addr = addr;
  const char* agent_store = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  launch.agent_store = agent_store != nullptr && std::string(agent_store) == "True";
  KEEL_ASSIGN_OR_RETURN(launch.restart_count, EnvInt("TORCHELASTIC_RESTART_COUNT", 0));
  if (launch.world_size < 1 || launch.rank >= launch.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("RANK (", launch.rank,
                                                   ") must be < WORLD_SIZE (", launch.world_size,
                                                   "), which must be >= 1"));
  }
  return launch;
}

// Splits "--set X" / "--set=X" out of argv (values may hold commas, which absl's list flags
// would split).
std::vector<std::string> TakeOverrides(int& argc, char** argv) {
  std::vector<std::string> overrides;
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--set" && i + 1 < argc) {
      overrides.push_back(argv[++i]);
    } else if (absl::StartsWith(arg, "--set=")) {
      overrides.push_back(arg.substr(6));
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  return overrides;
}

absl::StatusOr<std::string> ConfigPath(const char* argv0) {
  const std::string flag = absl::GetFlag(FLAGS_config);
  if (!flag.empty()) return UserPath(flag);
  std::string error;
  std::unique_ptr<Runfiles> runfiles(Runfiles::Create(argv0, &error));
  if (runfiles == nullptr) return absl::NotFoundError(absl::StrCat("runfiles: ", error));
  return runfiles->Rlocation("keel/tools/train_default.textproto");
}

absl::Status Main(int argc, char** argv) {
  std::vector<std::string> overrides = TakeOverrides(argc, argv);
  absl::SetProgramUsageMessage(
      "trains a GPT on the default corpus or a Megatron indexed dataset.\n"
      "  train [--config=FILE] [--set section.field=value]...");
  absl::ParseCommandLine(argc, argv);
  KEEL_ASSIGN_OR_RETURN(const std::string config_path, ConfigPath(argv[0]));
  KEEL_ASSIGN_OR_RETURN(TrainConfig config, LoadTrainConfig(config_path, overrides));
  config.set_run_dir(UserPath(config.run_dir()));
  if (!config.data().prefix().empty()) {
    config.mutable_data()->set_prefix(UserPath(config.data().prefix()));
  }
  KEEL_ASSIGN_OR_RETURN(const Launch launch, ReadLaunch());
  // Intra-op threads: the cores divided among the local ranks, unless OMP_NUM_THREADS says.
  if (std::getenv("OMP_NUM_THREADS") == nullptr) {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    at::set_num_threads(std::max(1, cores / std::max(1, launch.local_world_size)));
  }

  TrainRuntime runtime;
  runtime.rank = launch.rank;
  runtime.world_size = launch.world_size;
  runtime.log = &std::cout;
  // Gloo on the CPU; NCCL on this rank's GPU (LOCAL_RANK), which needs a CUDA build.
  const std::string backend =
      config.distributed().has_backend() ? config.distributed().backend() : "gloo";
  const bool nccl = backend == "nccl";
  if (!nccl && backend != "gloo") {
    return absl::InvalidArgumentError(
        absl::StrCat("distributed.backend \"", backend, "\" is not one of \"gloo\", \"nccl\""));
  }
  if (nccl) {
    if (!base::HasNccl()) {
      return absl::InvalidArgumentError(
          "distributed.backend \"nccl\" needs a CUDA build: bazel build --config=cuda with "
          "KEEL_LIBTORCH at a CUDA LibTorch");
    }
    const int gpus = static_cast<int>(torch::cuda::device_count());
    if (launch.local_rank >= gpus) {
      return absl::FailedPreconditionError(absl::StrCat("distributed.backend \"nccl\": LOCAL_RANK ",
                                                        launch.local_rank, " has no GPU (", gpus,
                                                        " visible)"));
    }
    KEEL_RETURN_IF_ERROR(base::CallTorch(absl::StatusCode::kUnavailable, "selecting the GPU",
                                         [&] { base::SetCudaDevice(launch.local_rank); }));
    runtime.device = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(launch.local_rank));
  }
  // Gradients go over `group`; host scalars over a Gloo `control` group (the same one when
  // training on Gloo); checkpoint exchanges, which async saves run on a thread of their own,
  // over a third. NCCL builds them for a single process too, on an in-process store.
  c10::intrusive_ptr<c10d::ProcessGroup> group, control_group, checkpoint_group;
  if (launch.world_size > 1 || nccl) {
    const std::chrono::seconds timeout(
        config.distributed().has_timeout_seconds() ? config.distributed().timeout_seconds() : 60);
    KEEL_RETURN_IF_ERROR(base::CallTorch(
        absl::StatusCode::kUnavailable,
        absl::StrCat("rendezvous at ", launch.master_addr, ":", launch.master_port), [&] {
          c10::intrusive_ptr<c10d::Store> store;
          if (launch.world_size == 1) {
            store = c10::make_intrusive<c10d::HashStore>();
          } else {
            store = base::CreateTcpStore(launch.master_addr, launch.master_port,
                                         /*is_server=*/launch.rank == 0 && !launch.agent_store,
                                         launch.world_size, timeout);
          }
          if (launch.agent_store) {
            store = c10::make_intrusive<c10d::PrefixStore>(
                absl::StrCat("/worker/attempt_", launch.restart_count), store);
          }
          auto gloo = [&](const char* name) {
            return base::CreateGlooProcessGroup(c10::make_intrusive<c10d::PrefixStore>(name, store),
                                                launch.rank, launch.world_size, timeout);
          };
          if (nccl) {
            group = base::CreateNcclProcessGroup(
                c10::make_intrusive<c10d::PrefixStore>("default", store), launch.rank,
                launch.world_size, timeout);
            control_group = gloo("control");
          } else {
            group = gloo("default");
            control_group = group;
          }
          checkpoint_group = gloo("checkpoint");
        }));
    runtime.group = group.get();
    runtime.control_group = control_group.get();
    runtime.checkpoint_group = checkpoint_group.get();
  }
  KEEL_ASSIGN_OR_RETURN(TrainResult result, Train(config, std::move(runtime)));
  (void)result;
  return absl::OkStatus();
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
  const absl::Status status = keel::tools::Main(argc, argv);
  if (!status.ok()) {
    std::cerr << "train: " << status.message() << "\n";
    return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}
