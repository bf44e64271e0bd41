// Every number of the configuration at its edges, one at a time over the default
// configuration, through what `train --dry_run` does (ReadOptions, CheckGeometry, DryRun):
// each is run or refused with an error that names its field, never a crash, a hang or an
// error about another field. The fields come from the schema itself, so a new field is
// covered the day it is added.
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "google/protobuf/descriptor.h"
#include "gtest/gtest.h"
#include "testing/files.h"
#include "tools/recipe/config.h"
#include "tools/recipe/dry_run.h"
#include "tools/recipe/options.h"

ABSL_FLAG(std::string, config, "", "Path of tools/recipe/default.textproto.");

namespace keel::tools::recipe {
namespace {

using ::google::protobuf::FieldDescriptor;

std::vector<std::string> EdgesOf(const FieldDescriptor& field) {
  switch (field.cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT64:
      return {"0", "-1", "2147483647", "2147483648", "4611686018427387904", "-4611686018427387904"};
    case FieldDescriptor::CPPTYPE_INT32:
      return {"0", "-1", "2147483647", "-2147483648"};
    case FieldDescriptor::CPPTYPE_DOUBLE:
    case FieldDescriptor::CPPTYPE_FLOAT:
      return {"0", "-1", "nan", "inf", "-inf", "1e308"};
    default:
      return {};
  }
}

// What `train --dry_run --set <assignment>...` would end with.
absl::Status DryRunWith(std::vector<std::string> assignments, const std::string& run_dir) {
  assignments.insert(assignments.begin(), "run_dir=" + run_dir);
  KEEL_ASSIGN_OR_RETURN(TrainConfig config,
                        LoadTrainConfig(absl::GetFlag(FLAGS_config), assignments));
  KEEL_ASSIGN_OR_RETURN(const TrainOptions options, ReadOptions(config));
  KEEL_RETURN_IF_ERROR(CheckGeometry(options, 1).status());
  std::ostringstream out;
  return DryRun(options, 1, out);
}

TEST(ConfigEdgesTest, EveryNumberAtItsEdgesRunsOrIsRefusedByName) {
  const std::string run_dir = keel::testing::NewTempDir("config_edges_test") + "/run";
  const google::protobuf::Descriptor& top = *TrainConfig::descriptor();
  int tried = 0;
  for (int s = 0; s < top.field_count(); ++s) {
    const FieldDescriptor& section = *top.field(s);
    if (section.message_type() == nullptr) continue;
    for (int f = 0; f < section.message_type()->field_count(); ++f) {
      const FieldDescriptor& field = *section.message_type()->field(f);
      if (field.is_repeated()) continue;
      const std::string name = absl::StrCat(section.name(), ".", field.name());
      for (const std::string& value : EdgesOf(field)) {
        const absl::Status status = DryRunWith({absl::StrCat(name, "=", value)}, run_dir);
        ++tried;
        if (status.ok()) continue;
        EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << name << "=" << value;
        EXPECT_TRUE(absl::StrContains(status.message(), field.name()))
            << name << "=" << value << ": " << status.message();
      }
    }
  }
  EXPECT_GT(tried, 200);  // the schema's numbers were found
}

// The edges that crashed or wrapped around before, with what is said now.
TEST(ConfigEdgesTest, WhatCrashedBeforeIsRefusedWithItsReason) {
  const std::string run_dir = keel::testing::NewTempDir("config_edges_test") + "/run";
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"step_scheduler.start_step=200"},
       "step_scheduler.start_step (200) leaves no step to train: the run ends at max_steps (200)"},
      {{"step_scheduler.start_epoch=100"},
       "step_scheduler.start_epoch (100) leaves no step to train: the run ends after num_epochs "
       "(100)"},
      {{"step_scheduler.local_batch_size=4611686018427387904"},
       "step_scheduler.local_batch_size (4611686018427387904) is beyond 2147483647"},
      {{"model.num_layers=4611686018427387904"},
       "model.num_layers (4611686018427387904) is beyond 2147483647"},
      {{"model.hidden_size=2147483647"}, "parameters; allowed: at most 2^53"},
      {{"clip_grad.max_norm=0"}, "clip_grad.max_norm (0) must be > 0 (unset: no clipping)"},
      {{"clip_grad.max_norm=-1"}, "clip_grad.max_norm (-1) must be > 0"},
      {{"step_scheduler.max_steps=0"}, "step_scheduler: max_steps must be greater than 0"},
      {{"model.hidden_size=65536", "peft.dim=2147483647"}, "peft.dim (2147483647) gives up to"},
      {{"checkpoint.keep_last_k=-1"}, "checkpoint: keep_last_k (-1) must be >= 0 (0 keeps all)"},
  };
  for (const auto& [assignments, message] : cases) {
    const absl::Status status = DryRunWith(assignments, run_dir);
    EXPECT_TRUE(absl::StrContains(status.message(), message))
        << absl::StrJoin(assignments, " ") << ": " << status.message();
  }
}

}  // namespace
}  // namespace keel::tools::recipe
