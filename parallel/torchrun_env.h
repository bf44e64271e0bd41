// torchrun's worker environment (torch/distributed/run.py and the elastic agent's
// _start_workers in torch/distributed/elastic/agent/server/local_elastic_agent.py): the one
// place that knows its variables. //tools:launch writes them for each rank; //tools:train, or
// a third party's own loop, reads them with ReadWorkerEnv, the only environment read in Keel's
// distributed setup (DeviceMesh::Connect takes the WorkerEnv, which a caller may also fill).
//
//   KEEL_ASSIGN_OR_RETURN(keel::parallel::WorkerEnv env, keel::parallel::ReadWorkerEnv());
//   // env.rank, env.world_size, env.master_addr, env.master_port, ...
#ifndef KEEL_PARALLEL_TORCHRUN_ENV_H_
#define KEEL_PARALLEL_TORCHRUN_ENV_H_

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace keel::parallel {

// One worker's view of a single-node torchrun launch; the defaults are a lone process.
struct WorkerEnv {
  // RANK, LOCAL_RANK (defaults to RANK), WORLD_SIZE, LOCAL_WORLD_SIZE (defaults to
  // WORLD_SIZE).
  int rank = 0;
  int local_rank = 0;
  int world_size = 1;
  int local_world_size = 1;
  // MASTER_ADDR, MASTER_PORT: where rank 0's (or the agent's) TCPStore listens.
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // TORCHELASTIC_USE_AGENT_STORE=True: torchrun's agent hosts the store and every rank is a
  // client under the prefix /worker/attempt_<restart_count>, as PyTorch's env:// rendezvous
  // does (torch/distributed/rendezvous.py).
  bool agent_store = false;
  // TORCHELASTIC_RESTART_COUNT and TORCHELASTIC_MAX_RESTARTS: how many times the launcher
  // has restarted the workers, and may.
  int restart_count = 0;
  int max_restarts = 0;
  // KEEL_RESTART_CAUSE, Keel's own: why //tools:launch restarted the workers ("rank 1 was
  // killed by signal 9"); empty on a first start and under torchrun, which does not say.
  std::string restart_cause;
};

// Looks up one environment variable (nullptr when unset); std::getenv by default.
using Getenv = std::function<const char*(const char*)>;

// Reads the worker environment. Errors: kInvalidArgument naming the variable for a value that
// is not a non-negative integer, or a RANK not below WORLD_SIZE.
[[nodiscard]] absl::StatusOr<WorkerEnv> ReadWorkerEnv(const Getenv& getenv = nullptr);

// The variables torchrun's agent sets for the worker `env` describes on a single node, in
// its order. The agent store is never announced: the caller's rank 0 hosts the store.
std::vector<std::pair<std::string, std::string>> WorkerVariables(const WorkerEnv& env);

// Variables of an outer launch that a worker environment must not inherit.
inline constexpr const char* kOuterVariables[] = {"TORCHELASTIC_USE_AGENT_STORE"};

}  // namespace keel::parallel

#endif  // KEEL_PARALLEL_TORCHRUN_ENV_H_
