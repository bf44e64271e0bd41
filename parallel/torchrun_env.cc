#include "parallel/torchrun_env.h"

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace keel::parallel {
namespace {

absl::StatusOr<int> EnvInt(const Getenv& getenv, const char* name, int fallback) {
  const char* value = getenv(name);
  if (value == nullptr) return fallback;
  int parsed = 0;
  if (!absl::SimpleAtoi(value, &parsed) || parsed < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("environment ", name, "=\"", value, "\" is not a non-negative integer"));
  }
  return parsed;
}

}  // namespace

absl::StatusOr<WorkerEnv> ReadWorkerEnv(const Getenv& getenv_or_null) {
  const Getenv getenv =
      getenv_or_null ? getenv_or_null : [](const char* name) { return std::getenv(name); };
  WorkerEnv env;
  KEEL_ASSIGN_OR_RETURN(env.world_size, EnvInt(getenv, "WORLD_SIZE", 1));
  KEEL_ASSIGN_OR_RETURN(env.rank, EnvInt(getenv, "RANK", 0));
  KEEL_ASSIGN_OR_RETURN(env.local_rank, EnvInt(getenv, "LOCAL_RANK", env.rank));
  KEEL_ASSIGN_OR_RETURN(env.local_world_size, EnvInt(getenv, "LOCAL_WORLD_SIZE", env.world_size));
  KEEL_ASSIGN_OR_RETURN(env.master_port, EnvInt(getenv, "MASTER_PORT", 29500));
  if (env.master_port > 65535) {  // c10d's TCPStore takes a uint16_t: 99999 became 34463
    return absl::InvalidArgumentError(absl::StrCat("environment MASTER_PORT=\"", env.master_port,
                                                   "\" is not a TCP port (0 to 65535)"));
  }
  if (const char* addr = getenv("MASTER_ADDR")) env.master_addr = addr;
  const char* agent_store = getenv("TORCHELASTIC_USE_AGENT_STORE");
  env.agent_store = agent_store != nullptr && std::string(agent_store) == "True";
  KEEL_ASSIGN_OR_RETURN(env.restart_count, EnvInt(getenv, "TORCHELASTIC_RESTART_COUNT", 0));
  KEEL_ASSIGN_OR_RETURN(env.max_restarts, EnvInt(getenv, "TORCHELASTIC_MAX_RESTARTS", 0));
  if (const char* cause = getenv("KEEL_RESTART_CAUSE")) env.restart_cause = cause;
  if (env.world_size < 1 || env.rank >= env.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("RANK (", env.rank, ") must be < WORLD_SIZE (",
                                                   env.world_size, "), which must be >= 1"));
  }
  return env;
}

std::vector<std::pair<std::string, std::string>> WorkerVariables(const WorkerEnv& env) {
  const std::string world = absl::StrCat(env.world_size);
  return {
      {"RANK", absl::StrCat(env.rank)},
      {"LOCAL_RANK", absl::StrCat(env.local_rank)},
      {"GROUP_RANK", "0"},
      {"ROLE_RANK", absl::StrCat(env.rank)},
      {"ROLE_NAME", "default"},
      {"WORLD_SIZE", world},
      {"LOCAL_WORLD_SIZE", absl::StrCat(env.local_world_size)},
      {"ROLE_WORLD_SIZE", world},
      {"GROUP_WORLD_SIZE", "1"},
      {"MASTER_ADDR", env.master_addr},
      {"MASTER_PORT", absl::StrCat(env.master_port)},
      {"TORCHELASTIC_RESTART_COUNT", absl::StrCat(env.restart_count)},
      {"TORCHELASTIC_MAX_RESTARTS", absl::StrCat(env.max_restarts)},
      {"TORCHELASTIC_RUN_ID", "none"},
      {"KEEL_RESTART_CAUSE", env.restart_cause},
  };
}

}  // namespace keel::parallel
