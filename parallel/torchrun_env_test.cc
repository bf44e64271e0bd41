#include "parallel/torchrun_env.h"

#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace keel::parallel {
namespace {

using ::keel::testing::StatusIs;
using ::testing::HasSubstr;

// An environment made of `variables` only.
Getenv Environment(const std::map<std::string, std::string>& variables) {
  return [variables](const char* name) -> const char* {
    auto it = variables.find(name);
    return it == variables.end() ? nullptr : it->second.c_str();
  };
}

TEST(ReadWorkerEnvTest, NothingSetIsALoneProcess) {
  KEEL_ASSERT_OK_AND_ASSIGN(WorkerEnv env, ReadWorkerEnv(Environment({})));
  EXPECT_EQ(env.rank, 0);
  EXPECT_EQ(env.world_size, 1);
  EXPECT_EQ(env.local_world_size, 1);
  EXPECT_EQ(env.master_addr, "127.0.0.1");
  EXPECT_EQ(env.master_port, 29500);
  EXPECT_FALSE(env.agent_store);
}

// What launch writes for a rank is what train reads back.
TEST(ReadWorkerEnvTest, ReadsWhatWorkerVariablesWrite) {
  WorkerEnv written;
  written.rank = 2;
  written.local_rank = 2;
  written.world_size = 3;
  written.local_world_size = 3;
  written.master_addr = "10.0.0.7";
  written.master_port = 1234;
  written.restart_count = 4;
  written.max_restarts = 5;
  written.restart_cause = "rank 1 killed by signal 9";
  std::map<std::string, std::string> variables;
  for (const auto& [name, value] : WorkerVariables(written)) variables[name] = value;
  EXPECT_EQ(variables.at("GROUP_WORLD_SIZE"), "1");
  KEEL_ASSERT_OK_AND_ASSIGN(WorkerEnv read, ReadWorkerEnv(Environment(variables)));
  EXPECT_EQ(read.rank, 2);
  EXPECT_EQ(read.local_rank, 2);
  EXPECT_EQ(read.world_size, 3);
  EXPECT_EQ(read.local_world_size, 3);
  EXPECT_EQ(read.master_addr, "10.0.0.7");
  EXPECT_EQ(read.master_port, 1234);
  EXPECT_EQ(read.restart_count, 4);
  EXPECT_EQ(read.max_restarts, 5);
  EXPECT_EQ(read.restart_cause, "rank 1 killed by signal 9");
  EXPECT_FALSE(read.agent_store);
}

TEST(ReadWorkerEnvTest, TorchrunsAgentStore) {
  KEEL_ASSERT_OK_AND_ASSIGN(WorkerEnv env,
                            ReadWorkerEnv(Environment({{"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                                       {"TORCHELASTIC_RESTART_COUNT", "1"}})));
  EXPECT_TRUE(env.agent_store);
  EXPECT_EQ(env.restart_count, 1);
}

TEST(ReadWorkerEnvTest, BadValuesNameTheVariable) {
  EXPECT_THAT(ReadWorkerEnv(Environment({{"WORLD_SIZE", "two"}})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("WORLD_SIZE=\"two\" is not a non-negative integer")));
  EXPECT_THAT(ReadWorkerEnv(Environment({{"MASTER_PORT", "-1"}})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("MASTER_PORT")));
  EXPECT_THAT(ReadWorkerEnv(Environment({{"MASTER_PORT", "99999"}})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("MASTER_PORT=\"99999\" is not a TCP port (0 to 65535)")));
  KEEL_ASSERT_OK_AND_ASSIGN(WorkerEnv highest,
                            ReadWorkerEnv(Environment({{"MASTER_PORT", "65535"}})));
  EXPECT_EQ(highest.master_port, 65535);
  EXPECT_THAT(
      ReadWorkerEnv(Environment({{"RANK", "2"}, {"WORLD_SIZE", "2"}})),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("RANK (2) must be < WORLD_SIZE (2)")));
}

}  // namespace
}  // namespace keel::parallel
