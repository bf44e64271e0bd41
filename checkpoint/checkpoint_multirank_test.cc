// Distributed save and load over real c10d Gloo groups (ranks on threads): every rank writes
// its blocks, replicated tensors once, values once or per rank, and any world size loads any
// other's checkpoint.
#include <stdlib.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "ATen/CPUGeneratorImpl.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_testutil.h"
#include "checkpoint/manifest.h"
#include "checkpoint/reader.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "parallel/layout.h"
#include "testing/files.h"
#include "testing/ranks.h"
#include "testing/status_matchers.h"

ABSL_FLAG(std::string, v1_checkpoint, "",
          "manifest.pb of checkpoint/testdata/v1_three_ranks, written by a Keel before values "
          "per rank.");

namespace keel::checkpoint {
namespace {

using ::keel::base::Json;
using ::keel::checkpoint::testing::EachRankValues;
using ::keel::checkpoint::testing::TensorsState;
using ::keel::testing::FlipBit;
using ::keel::testing::IsOk;
using ::keel::testing::NewTempDir;
using ::keel::testing::ReadFileOrFail;
using ::keel::testing::RunOnRanks;
using ::keel::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

// The full tensors of the run, the same on every rank and in every test (made once, from
// their own generator: ranks are threads and must not race on the default one).
const std::map<std::string, at::Tensor>& GlobalTensors() {
  static const auto* const tensors = [] {
    at::Generator generator = at::detail::createCPUGenerator(11);
    return new std::map<std::string, at::Tensor>{
        {"w", at::randn({8, 6}, generator)},
        {"m", at::randn({4, 10}, generator).to(at::kBFloat16)},
        {"b", at::randn({6}, generator)},
        {"s", at::scalar_tensor(7, at::kLong)}};
  }();
  return *tensors;
}

// torch.chunk's split of `n` over `world`: rank r gets [r * c, min(n, (r + 1) * c)).
std::pair<int64_t, int64_t> ChunkOf(int64_t n, int rank, int world) {
  const int64_t size = (n + world - 1) / world;
  const int64_t begin = std::min(n, rank * size);
  return {begin, std::min(n, begin + size) - begin};
}

// This rank's view: "w" sharded on dim 0, "m" on dim 1, "b" and "s" replicated.
TensorsState RankState(int rank, int world, double fill = 0, bool zero = false) {
  TensorsState state;
  for (const auto& [name, full] : GlobalTensors()) {
    at::Tensor local = full;
    std::optional<parallel::TensorLayout> layout;
    if (name == "w" || name == "m") {
      const int64_t dim = name == "w" ? 0 : 1;
      const auto [begin, length] = ChunkOf(full.size(dim), rank, world);
      local = full.narrow(dim, begin, length).clone();
      std::vector<int64_t> offsets(full.dim(), 0);
      offsets[dim] = begin;
      layout = parallel::BlockLayout(full.sizes().vec(), offsets);
    }
    state.tensors[name] = {zero ? at::full_like(local, fill) : local.clone(), layout};
  }
  state.values = {{"world", world}};
  return state;
}

bool SameTensors(const TensorsState& a, const TensorsState& b) {
  for (const auto& [name, ref] : a.tensors) {
    if (!at::equal(ref.tensor, b.tensors.at(name).tensor)) return false;
  }
  return true;
}

TEST(CheckpointMultiRankTest, SavesWithNRanksAndLoadsWithM) {
  for (int saving : {1, 2, 3, 4}) {
    const std::string dir = NewTempDir(absl::StrCat("reshard_", saving));
    KEEL_ASSERT_OK(RunOnRanks(saving, [&](keel::testing::Rank& r) -> absl::Status {
      CheckpointerOptions options;
      options.checkpoint_dir = dir;
      KEEL_ASSIGN_OR_RETURN(auto checkpointer, Checkpointer::Create(options, r.group.get()));
      TensorsState state = RankState(r.rank, r.world_size);
      return checkpointer->Save({{"model", &state}}, 1, 0);
    }));
    const std::string path = dir + "/step_0000000001";
    KEEL_ASSERT_OK_AND_ASSIGN(Manifest manifest, ReadManifest(path));
    EXPECT_EQ(manifest.world_size(), saving);
    for (const TensorEntry& tensor : manifest.tensors()) {
      SCOPED_TRACE(tensor.name());
      // Replicated tensors are written once; sharded ones once per non-empty block.
      const bool sharded = tensor.name() == "model/w" || tensor.name() == "model/m";
      const int64_t rows = tensor.name() == "model/w" ? 8 : 10;
      int expected = 1;
      if (sharded) {
        expected = 0;
        for (int r = 0; r < saving; ++r) expected += ChunkOf(rows, r, saving).second > 0;
      }
      EXPECT_EQ(tensor.chunks_size(), expected);
    }
    KEEL_ASSERT_OK_AND_ASSIGN(VerifyReport report, Verify(path, VerifyLevel::kChecksums));
    EXPECT_TRUE(report.ok()) << report.ToStatus();

    for (int loading : {1, 2, 3, 4}) {
      SCOPED_TRACE(absl::StrCat(saving, " ranks saved, ", loading, " load"));
      std::vector<TensorsState> loaded(loading);
      KEEL_ASSERT_OK(RunOnRanks(loading, [&](keel::testing::Rank& r) -> absl::Status {
        CheckpointerOptions options;
        options.checkpoint_dir = dir;
        KEEL_ASSIGN_OR_RETURN(auto checkpointer, Checkpointer::Create(options, r.group.get()));
        loaded[r.rank] = RankState(r.rank, r.world_size, -1, /*zero=*/true);
        return checkpointer->Load(path, {{"model", &loaded[r.rank]}}).status();
      }));
      for (int r = 0; r < loading; ++r) {
        const TensorsState expected = RankState(r, loading);
        for (const auto& [name, ref] : expected.tensors) {
          SCOPED_TRACE(absl::StrCat("rank ", r, " ", name));
          EXPECT_TRUE(at::equal(loaded[r].tensors.at(name).tensor, ref.tensor));
        }
        EXPECT_EQ(loaded[r].values["world"], saving);  // every saving rank's, saved once
      }
    }
  }
}

// Pipeline stages: each rank holds its own tensors and both a tied one. Every layout that
// reads each saved tensor on some rank loads; a tensor no rank reads is unexpected, and a rank
// asking for a tensor the checkpoint lacks fails every rank.
TEST(CheckpointMultiRankTest, RanksLoadTheirOwnPartAndOnlyTensorsNoRankReadsAreUnexpected) {
  const auto tensor = [](double value) { return at::full({3}, value); };
  // The tensors of each rank by name; an empty name list is a rank holding nothing.
  const auto stage = [&](const std::vector<std::string>& names, double fill) {
    TensorsState state;
    for (const std::string& name : names) {
      const double value = name == "a" ? 1.0 : name == "b" ? 2.0 : 3.0;
      state.tensors[name] = {fill < 0 ? tensor(fill) : tensor(value), std::nullopt};
    }
    return state;
  };
  const std::string dir = NewTempDir("stages");
  KEEL_ASSERT_OK(RunOnRanks(2, [&](keel::testing::Rank& r) -> absl::Status {
    CheckpointerOptions options;
    options.checkpoint_dir = dir;
    KEEL_ASSIGN_OR_RETURN(auto checkpointer, Checkpointer::Create(options, r.group.get()));
    TensorsState state = stage(
        r.rank == 0 ? std::vector<std::string>{"a", "tied"} : std::vector<std::string>{"b", "tied"},
        0);
    return checkpointer->Save({{"model", &state}}, 1, 0);
  }));
  const std::string path = dir + "/step_0000000001";

  // Loads `names` of each rank (as many ranks as entries); each rank's status.
  const auto load = [&](const std::vector<std::vector<std::string>>& names) {
    const int world = static_cast<int>(names.size());
    std::vector<absl::Status> statuses(world);
    std::vector<TensorsState> loaded(world);
    EXPECT_THAT(
        RunOnRanks(
            world,
            [&](keel::testing::Rank& r) -> absl::Status {
              CheckpointerOptions options;
              options.checkpoint_dir = dir;
              KEEL_ASSIGN_OR_RETURN(auto checkpointer,
                                    Checkpointer::Create(options, r.group.get()));
              loaded[r.rank] = stage(names[r.rank], -1);
              statuses[r.rank] = checkpointer->Load(path, {{"model", &loaded[r.rank]}}).status();
              return absl::OkStatus();
            }),
        IsOk());
    for (int r = 0; r < world; ++r) {
      if (!statuses[r].ok()) continue;
      for (const auto& [name, ref] : loaded[r].tensors) {
        EXPECT_TRUE(at::equal(ref.tensor, stage({name}, 0).tensors.at(name).tensor)) << name;
      }
    }
    return statuses;
  };
  for (const absl::Status& status : load({{"a", "tied"}, {"b", "tied"}})) KEEL_EXPECT_OK(status);
  for (const absl::Status& status : load({{"a", "b", "tied"}})) KEEL_EXPECT_OK(status);
  for (const absl::Status& status : load({{"a", "b"}, {"tied"}, {}})) KEEL_EXPECT_OK(status);
  for (const absl::Status& status : load({{"a", "tied"}, {"tied"}})) {
    EXPECT_THAT(status, StatusIs(absl::StatusCode::kInvalidArgument,
                                 AllOf(HasSubstr("unexpected keys: model/b"),
                                       Not(HasSubstr("model/a")), Not(HasSubstr("model/tied")))));
  }
  for (const absl::Status& status : load({{"a", "tied"}, {"b", "c"}})) {
    EXPECT_THAT(status, StatusIs(absl::StatusCode::kInvalidArgument,
                                 AllOf(HasSubstr("rank 1: "), HasSubstr("missing keys: model/c"))));
  }
}

TEST(CheckpointMultiRankTest, ReplicatedTensorsAreBalancedAcrossRanksByBytes) {
  const std::string dir = NewTempDir("balance");
  KEEL_ASSERT_OK(RunOnRanks(2, [&](keel::testing::Rank& r) -> absl::Status {
    CheckpointerOptions options;
    options.checkpoint_dir = dir;
    KEEL_ASSIGN_OR_RETURN(auto checkpointer, Checkpointer::Create(options, r.group.get()));
    TensorsState state;
    // 4 MiB, 3 MiB, 2 MiB and 1 MiB, on both ranks: largest first to the lighter rank gives
    // {4, 1} and {3, 2}: 5 MiB each.
    for (int i = 1; i <= 4; ++i) state.tensors[absl::StrCat("t", i)] = {at::ones({i << 18})};
    return checkpointer->Save({{"model", &state}}, 1, 0);
  }));
  KEEL_ASSERT_OK_AND_ASSIGN(Manifest manifest, ReadManifest(dir + "/step_0000000001"));
  ASSERT_EQ(manifest.files_size(), 2);
  std::vector<uint64_t> bytes(2, 0);
  for (const TensorEntry& tensor : manifest.tensors()) {
    ASSERT_EQ(tensor.chunks_size(), 1) << tensor.name();
    bytes[manifest.files(tensor.chunks(0).file()).rank()] += tensor.chunks(0).byte_length();
  }
  EXPECT_EQ(bytes[0], 5u << 20);
  EXPECT_EQ(bytes[1], 5u << 20);
}

class FailingState : public Stateful {
 public:
  absl::StatusOr<State> StateDict() const override {
    return absl::ResourceExhaustedError("out of host memory for the snapshot");
  }
  absl::Status LoadStateDict(StateReader&) override { return absl::OkStatus(); }
};

TEST(CheckpointMultiRankTest, OneRankFailingFailsEveryRankAndCommitsNothing) {
  const std::string dir = NewTempDir("failure");
  std::vector<absl::Status> statuses(3);
  KEEL_ASSERT_OK(RunOnRanks(3, [&](keel::testing::Rank& r) -> absl::Status {
    CheckpointerOptions options;
    options.checkpoint_dir = dir;
    KEEL_ASSIGN_OR_RETURN(auto checkpointer, Checkpointer::Create(options, r.group.get()));
    TensorsState good = RankState(r.rank, r.world_size);
    FailingState bad;
    Stateful* model = r.rank == 1 ? static_cast<Stateful*>(&bad) : &good;
    statuses[r.rank] = checkpointer->Save({{"model", model}}, 1, 0);
    return absl::OkStatus();
  }));
  for (const absl::Status& status : statuses) {
    EXPECT_THAT(status, StatusIs(absl::StatusCode::kResourceExhausted,
                                 AllOf(HasSubstr("rank 1"), HasSubstr("out of host memory"))));
  }
  KEEL_ASSERT_OK_AND_ASSIGN(FindResult found, FindLatest(dir));
  EXPECT_FALSE(found.latest.has_value());
}

TEST(CheckpointMultiRankTest, RanksDisagreeingOnATensorIsAnError) {
  const std::string dir = NewTempDir("disagree");
  std::vector<absl::Status> statuses(2);
  KEEL_ASSERT_OK(RunOnRanks(2, [&](keel::testing::Rank& r) -> absl::Status {
    CheckpointerOptions options;
    options.checkpoint_dir = dir;
    KEEL_ASSIGN_OR_RETURN(auto checkpointer, Checkpointer::Create(options, r.group.get()));
    TensorsState state;
    state.tensors["x"] = {at::zeros({4 + r.rank})};
    statuses[r.rank] = checkpointer->Save({{"model", &state}}, 1, 0);
    return absl::OkStatus();
  }));
  for (const absl::Status& status : statuses) {
    EXPECT_THAT(status, StatusIs(absl::StatusCode::kInvalidArgument,
                                 AllOf(HasSubstr("\"model/x\""), HasSubstr("[4] on rank 0"),
                                       HasSubstr("[5] on rank 1"))));
  }
}

// A rank's empty block (a shard without rows, here inside rank 0's rows) overlaps nothing and
// is no one's to write: the manifest holds rank 0's one chunk, and both ranks load it.
TEST(CheckpointMultiRankTest, EmptyBlocksOverlapNothingAndAreNotWritten) {
  const std::string dir = NewTempDir("empty_block");
  const at::Tensor full = at::arange(12, at::kFloat).view({4, 3});
  KEEL_ASSERT_OK(RunOnRanks(2, [&](keel::testing::Rank& r) -> absl::Status {
    CheckpointerOptions options;
    options.checkpoint_dir = dir;
    KEEL_ASSIGN_OR_RETURN(auto checkpointer, Checkpointer::Create(options, r.group.get()));
    TensorsState state;
    const int64_t rows = r.rank == 0 ? 4 : 0;
    state.tensors["x"] = {full.narrow(0, r.rank == 0 ? 0 : 2, rows).clone(),
                          parallel::BlockLayout({4, 3}, {r.rank == 0 ? 0 : 2, 0})};
    KEEL_RETURN_IF_ERROR(checkpointer->Save({{"model", &state}}, 1, 0));
    TensorsState loaded = state.EmptyLike();
    KEEL_RETURN_IF_ERROR(
        checkpointer->Load(dir + "/step_0000000001", {{"model", &loaded}}).status());
    EXPECT_TRUE(at::equal(loaded.tensors["x"].tensor, state.tensors["x"].tensor));
    return absl::OkStatus();
  }));
  KEEL_ASSERT_OK_AND_ASSIGN(Manifest manifest, ReadManifest(dir + "/step_0000000001"));
  ASSERT_EQ(manifest.tensors_size(), 1);
  ASSERT_EQ(manifest.tensors(0).chunks_size(), 1);
  EXPECT_EQ(manifest.tensors(0).chunks(0).lengths(0), 4);
}

TEST(CheckpointMultiRankTest, AsyncSaveCommitsOnEveryRank) {
  const std::string dir = NewTempDir("async_ranks");
  KEEL_ASSERT_OK(RunOnRanks(2, [&](keel::testing::Rank& r) -> absl::Status {
    CheckpointerOptions options;
    options.checkpoint_dir = dir;
    options.is_async = true;
    KEEL_ASSIGN_OR_RETURN(auto checkpointer, Checkpointer::Create(options, r.group.get()));
    TensorsState state = RankState(r.rank, r.world_size);
    KEEL_RETURN_IF_ERROR(checkpointer->Save({{"model", &state}}, 1, 0));
    for (auto& [name, ref] : state.tensors) ref.tensor.fill_(0);  // after the snapshot
    KEEL_RETURN_IF_ERROR(checkpointer->Save({{"model", &state}}, 2, 0));
    return checkpointer->Wait();
  }));
  TensorsState loaded = RankState(0, 1, -1, /*zero=*/true);
  KEEL_ASSERT_OK(LoadCheckpoint(dir + "/step_0000000001", {{"model", &loaded}}).status());
  const TensorsState expected = RankState(0, 1);
  for (const auto& [name, ref] : expected.tensors) {
    EXPECT_TRUE(at::equal(loaded.tensors.at(name).tensor, ref.tensor)) << name;
  }
  KEEL_ASSERT_OK_AND_ASSIGN(FindResult found, FindLatest(dir, VerifyLevel::kChecksums));
  EXPECT_EQ(found.latest->step, 2);
}

// Rank 1 alone reads the corrupt chunk of step 2 (its block of "w"): every rank still agrees
// that step 2 does not load, rank 0 moves it aside once, and all load step 1.
TEST(CheckpointMultiRankTest, ResumeFallsBackTogetherWhenOneRanksChunkIsCorrupt) {
  for (int world : {2, 3}) {
    SCOPED_TRACE(absl::StrCat("world_size=", world));
    const std::string dir = NewTempDir(absl::StrCat("resume_", world));
    KEEL_ASSERT_OK(RunOnRanks(world, [&](keel::testing::Rank& r) -> absl::Status {
      CheckpointerOptions options;
      options.checkpoint_dir = dir;
      KEEL_ASSIGN_OR_RETURN(auto checkpointer, Checkpointer::Create(options, r.group.get()));
      TensorsState state = RankState(r.rank, r.world_size);
      KEEL_RETURN_IF_ERROR(checkpointer->Save({{"model", &state}}, 1, 0));
      state.values = {{"world", world}, {"step", 2}};
      return checkpointer->Save({{"model", &state}}, 2, 0);
    }));
    KEEL_ASSERT_OK_AND_ASSIGN(Manifest manifest, ReadManifest(dir + "/step_0000000002"));
    const int64_t rank1_begin = ChunkOf(8, 1, world).first;
    for (const TensorEntry& tensor : manifest.tensors()) {
      if (tensor.name() != "model/w") continue;
      for (const Chunk& chunk : tensor.chunks()) {
        if (chunk.offsets(0) != rank1_begin) continue;
        FlipBit(absl::StrCat(dir, "/step_0000000002/", manifest.files(chunk.file()).name()),
                chunk.byte_offset() + 2);
      }
    }
    std::vector<absl::StatusOr<ResumeResult>> results(world);
    KEEL_ASSERT_OK(RunOnRanks(world, [&](keel::testing::Rank& r) -> absl::Status {
      CheckpointerOptions options;
      options.checkpoint_dir = dir;
      KEEL_ASSIGN_OR_RETURN(auto checkpointer, Checkpointer::Create(options, r.group.get()));
      TensorsState target = RankState(r.rank, r.world_size, -1, /*zero=*/true);
      ResumeOptions resume;
      resume.reset = [&] {
        target = RankState(r.rank, r.world_size, -1, /*zero=*/true);
        return absl::OkStatus();
      };
      results[r.rank] = checkpointer->LoadLatest({{"model", &target}}, resume);
      if (results[r.rank].ok() && !SameTensors(target, RankState(r.rank, r.world_size))) {
        return absl::InternalError("step 1 was not what got loaded");
      }
      return absl::OkStatus();
    }));
    for (const auto& result : results) {
      ASSERT_THAT(result.status(), IsOk());
      ASSERT_TRUE(result->loaded.has_value());
      EXPECT_EQ(result->loaded->step, 1);
      ASSERT_EQ(result->warnings.size(), 1u);
      EXPECT_THAT(result->warnings[0], AllOf(HasSubstr("rank 1: "), HasSubstr("checksum")));
      EXPECT_EQ(result->warnings, results[0]->warnings);
      EXPECT_THAT(result->quarantined, ::testing::ElementsAre(dir + "/quarantine/step_0000000002"));
    }
    EXPECT_TRUE(std::filesystem::is_directory(dir + "/quarantine/step_0000000002"));
    EXPECT_FALSE(std::filesystem::exists(dir + "/step_0000000002"));
  }
}

// A step directory that already exists fails the save on every rank, and an error reading one
// rank's part fails the load on every rank: the same status everywhere, and no rank waits.
TEST(CheckpointMultiRankTest, EveryRankReturnsTheSameErrorForACheckpointDecision) {
  for (int world : {2, 3}) {
    SCOPED_TRACE(absl::StrCat("world_size=", world));
    const std::string dir = NewTempDir(absl::StrCat("decisions_", world));
    std::vector<absl::Status> saves(world), loads(world);
    KEEL_ASSERT_OK(RunOnRanks(world, [&](keel::testing::Rank& r) -> absl::Status {
      CheckpointerOptions options;
      options.checkpoint_dir = dir;
      KEEL_ASSIGN_OR_RETURN(auto checkpointer, Checkpointer::Create(options, r.group.get()));
      TensorsState state = RankState(r.rank, r.world_size);
      KEEL_RETURN_IF_ERROR(checkpointer->Save({{"model", &state}}, 1, 0));
      saves[r.rank] = checkpointer->Save({{"model", &state}}, 1, 0);  // exists already
      // The last rank loads into a tensor of another shape: only it finds the mismatch.
      TensorsState target = RankState(r.rank, r.world_size, -1, /*zero=*/true);
      if (r.rank == r.world_size - 1) target.tensors["b"] = {at::zeros({5})};
      loads[r.rank] = checkpointer->Load(dir + "/step_0000000001", {{"model", &target}}).status();
      return absl::OkStatus();
    }));
    for (int rank = 0; rank < world; ++rank) {
      SCOPED_TRACE(absl::StrCat("rank ", rank));
      EXPECT_THAT(saves[rank], StatusIs(absl::StatusCode::kAlreadyExists,
                                        HasSubstr("rank 0: checkpoint " + dir +
                                                  "/step_0000000001 already exists")));
      EXPECT_THAT(loads[rank],
                  StatusIs(absl::StatusCode::kInvalidArgument,
                           AllOf(HasSubstr(absl::StrCat("rank ", world - 1, ": ")),
                                 HasSubstr("model/b: shape [6] in the checkpoint, [5] here"))));
    }
  }
}

// Values per rank. The states of rank `rank` in these tests: "model", rows [2 * rank, 2 *
// rank + 2) of a [6, 2] tensor, with values every rank shares; "stage", values of its own, as
// a pipeline stage's param groups are. checkpoint/testdata/v1_three_ranks was saved from them
// on 3 ranks by a Keel before values per rank, which kept rank 0's "stage" values only.
const Json& ModelValues() {
  static const Json* const values = new Json{{"layers", 3}, {"name", "v1"}};
  return *values;
}

Json StageValues(int rank) { return {{"stage", rank}, {"params", {10 * rank, 10 * rank + 1}}}; }

// Rank `rank` of `world`'s block of the [6, 2] tensor, arange(12) when `fill` is false.
TensorsState ModelOf(int rank, int world, bool fill = false) {
  const auto [begin, rows] = ChunkOf(6, rank, world);
  TensorsState model;
  const at::Tensor block = at::arange(12, at::kFloat).view({6, 2}).narrow(0, begin, rows);
  model.tensors["w"] = {fill ? at::full_like(block, -1) : block.clone(),
                        parallel::BlockLayout({6, 2}, {begin, 0})};
  model.values = ModelValues();
  return model;
}

std::string V1Checkpoint() {
  return std::filesystem::path(absl::GetFlag(FLAGS_v1_checkpoint)).parent_path().string();
}

// Saves "model" and "stage" (each rank's stage values, or rank 0's on every rank) as step 7
// on 3 ranks; returns the checkpoint's path.
std::string SaveThreeStages(const std::string& name, bool rank0_stage_everywhere = false) {
  const std::string dir = NewTempDir(name);
  EXPECT_THAT(RunOnRanks(3,
                         [&](keel::testing::Rank& r) -> absl::Status {
                           CheckpointerOptions options;
                           options.checkpoint_dir = dir;
                           KEEL_ASSIGN_OR_RETURN(auto checkpointer,
                                                 Checkpointer::Create(options, r.group.get()));
                           TensorsState model = ModelOf(r.rank, 3);
                           TensorsState stage;
                           stage.values = StageValues(rank0_stage_everywhere ? 0 : r.rank);
                           return checkpointer->Save({{"model", &model}, {"stage", &stage}}, 7,
                                                     /*epoch=*/1);
                         }),
              IsOk());
  return dir + "/step_0000000007";
}

// What one of the ranks loading a checkpoint got: "model", and "stage" read as one rank's values
// (`stage`, the load's status in `one_rank`) and then, in a second load, as every rank's.
struct Loaded {
  absl::Status one_rank;
  TensorsState model;
  TensorsState stage;
  EachRankValues each_rank;
};

std::vector<Loaded> LoadOnRanks(const std::string& path, int loading) {
  std::vector<Loaded> loaded(loading);
  const std::string unused = NewTempDir("unused");
  EXPECT_THAT(
      RunOnRanks(
          loading,
          [&](keel::testing::Rank& r) -> absl::Status {
            CheckpointerOptions options;
            options.checkpoint_dir = unused;
            KEEL_ASSIGN_OR_RETURN(auto checkpointer, Checkpointer::Create(options, r.group.get()));
            Loaded& mine = loaded[r.rank];
            mine.model = ModelOf(r.rank, loading, /*fill=*/true);
            mine.model.values = Json::object();
            mine.stage.values = {{"untouched", true}};
            mine.one_rank =
                checkpointer->Load(path, {{"model", &mine.model}, {"stage", &mine.stage}}).status();
            return checkpointer->Load(path, {{"model", &mine.model}, {"stage", &mine.each_rank}})
                .status();
          }),
      IsOk());
  return loaded;
}

// Rank `rank` of `loading` got its block of the tensor and the values saved once.
void ExpectModel(const Loaded& loaded, int rank, int loading) {
  EXPECT_EQ(loaded.model.values, ModelValues());
  EXPECT_TRUE(at::equal(loaded.model.tensors.at("w").tensor,
                        ModelOf(rank, loading).tensors.at("w").tensor));
}

TEST(CheckpointValuesTest, ValuesThatDifferAreSavedPerRankAndEqualOnesOnce) {
  const std::string path = SaveThreeStages("per_rank");
  KEEL_ASSERT_OK_AND_ASSIGN(Manifest manifest, ReadManifest(path));
  EXPECT_EQ(manifest.format_version(), 2u);  // a Keel reading versions up to 1 refuses it
  ASSERT_EQ(manifest.objects_size(), 2);
  const ObjectEntry& model = manifest.objects(0);  // sorted by name
  EXPECT_EQ(model.name(), "model");
  EXPECT_TRUE(model.has_value());
  EXPECT_EQ(model.rank_values_size(), 0);
  const ObjectEntry& stage = manifest.objects(1);
  EXPECT_FALSE(stage.has_value());
  ASSERT_EQ(stage.rank_values_size(), 3);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(stage.rank_values(r).rank(), r);
  KEEL_ASSERT_OK_AND_ASSIGN(VerifyReport report, Verify(path, VerifyLevel::kChecksums));
  EXPECT_TRUE(report.ok()) << report.ToStatus();
  EXPECT_EQ(report.objects, 2);
  EXPECT_EQ(report.objects_with_values_per_rank, 1);

  KEEL_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(path));
  KEEL_ASSERT_OK_AND_ASSIGN(Json model_values, reader->ReadValues("model"));
  EXPECT_EQ(model_values, ModelValues());
  EXPECT_THAT(reader->ReadValues("stage"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("\"stage\" holds different values on each of its 3 ranks")));
  KEEL_ASSERT_OK_AND_ASSIGN(std::vector<Json> stage_each, reader->ReadValuesOfEachRank("stage"));
  EXPECT_THAT(stage_each, ElementsAre(StageValues(0), StageValues(1), StageValues(2)));
  KEEL_ASSERT_OK_AND_ASSIGN(std::vector<Json> model_each, reader->ReadValuesOfEachRank("model"));
  EXPECT_THAT(model_each, ElementsAre(ModelValues(), ModelValues(), ModelValues()));
  EXPECT_THAT(reader->ReadValuesOfEachRank("absent"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no object \"absent\"")));

  // As many ranks load as saved: each gets its own.
  const std::vector<Loaded> loaded = LoadOnRanks(path, 3);
  for (int r = 0; r < 3; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    KEEL_EXPECT_OK(loaded[r].one_rank);
    EXPECT_EQ(loaded[r].stage.values, StageValues(r));
    EXPECT_THAT(loaded[r].each_rank.each_rank,
                ElementsAre(StageValues(0), StageValues(1), StageValues(2)));
    ExpectModel(loaded[r], r, 3);
  }
}

// Another number of ranks: values saved once still go to every rank; values saved per rank
// reach an object only as every rank's (ValuesOfEachRank), and one that reads a single rank's
// is refused on every rank before anything changes.
TEST(CheckpointValuesTest, OtherWorldSizesGetValuesPerRankOnlyAsEveryRanks) {
  const std::string path = SaveThreeStages("per_rank_reshard");
  for (int loading : {1, 2}) {
    SCOPED_TRACE(absl::StrCat(loading, " ranks load"));
    const std::vector<Loaded> loaded = LoadOnRanks(path, loading);
    for (int r = 0; r < loading; ++r) {
      SCOPED_TRACE(absl::StrCat("rank ", r));
      EXPECT_THAT(loaded[r].one_rank,
                  StatusIs(absl::StatusCode::kInvalidArgument,
                           HasSubstr(absl::StrCat("stage: its values differ per rank, saved by 3 "
                                                  "ranks and loaded by ",
                                                  loading))));
      EXPECT_EQ(loaded[r].stage.values, (Json{{"untouched", true}}));
      EXPECT_THAT(loaded[r].each_rank.each_rank,
                  ElementsAre(StageValues(0), StageValues(1), StageValues(2)));
      EXPECT_EQ(loaded[r].each_rank.saved_world_size, 3);
      ExpectModel(loaded[r], r, loading);
    }
  }
  // A load in one process is one rank's of one.
  TensorsState model = ModelOf(0, 1, /*fill=*/true);
  EachRankValues stage;
  KEEL_ASSERT_OK(LoadCheckpoint(path, {{"model", &model}, {"stage", &stage}}).status());
  EXPECT_THAT(stage.each_rank, ElementsAre(StageValues(0), StageValues(1), StageValues(2)));
}

// Checkpoints whose ranks' values are all equal (every single-rank and data-parallel one) are
// written exactly as before values per rank: the same bytes as the older Keel's, whose "stage"
// held rank 0's values.
TEST(CheckpointValuesTest, EqualValuesAreWrittenByteForByteAsByAnOlderKeel) {
  const std::string path = SaveThreeStages("as_before", /*rank0_stage_everywhere=*/true);
  for (const char* file : {"manifest.pb", "__0.keel", "__1.keel", "__2.keel"}) {
    SCOPED_TRACE(file);
    const std::string expected = ReadFileOrFail(absl::StrCat(V1Checkpoint(), "/", file));
    ASSERT_FALSE(expected.empty());
    EXPECT_EQ(ReadFileOrFail(absl::StrCat(path, "/", file)), expected);
  }
}

// The older Keel saved one "stage" entry, rank 0's: every rank gets it, as before.
TEST(CheckpointValuesTest, ACheckpointOfAnOlderKeelLoadsAsBefore) {
  KEEL_ASSERT_OK_AND_ASSIGN(Manifest manifest, ReadManifest(V1Checkpoint()));
  EXPECT_EQ(manifest.format_version(), 1u);
  for (int loading : {1, 3}) {
    SCOPED_TRACE(absl::StrCat(loading, " ranks load"));
    const std::vector<Loaded> loaded = LoadOnRanks(V1Checkpoint(), loading);
    for (int r = 0; r < loading; ++r) {
      SCOPED_TRACE(absl::StrCat("rank ", r));
      KEEL_EXPECT_OK(loaded[r].one_rank);
      EXPECT_EQ(loaded[r].stage.values, StageValues(0));
      EXPECT_THAT(loaded[r].each_rank.each_rank,
                  ElementsAre(StageValues(0), StageValues(0), StageValues(0)));
      ExpectModel(loaded[r], r, loading);
    }
  }
  KEEL_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(V1Checkpoint()));
  KEEL_ASSERT_OK_AND_ASSIGN(Json stage_values, reader->ReadValues("stage"));
  EXPECT_EQ(stage_values, StageValues(0));
}

TEST(CheckpointValuesTest, RanksSavingDifferentObjectsIsAnError) {
  const std::string dir = NewTempDir("different_objects");
  std::vector<absl::Status> statuses(3);
  KEEL_ASSERT_OK(RunOnRanks(3, [&](keel::testing::Rank& r) -> absl::Status {
    CheckpointerOptions options;
    options.checkpoint_dir = dir;
    KEEL_ASSIGN_OR_RETURN(auto checkpointer, Checkpointer::Create(options, r.group.get()));
    TensorsState model = ModelOf(r.rank, 3);
    TensorsState stage;
    Statefuls statefuls = {{"model", &model}};
    if (r.rank != 1) statefuls["stage"] = &stage;
    statuses[r.rank] = checkpointer->Save(statefuls, 1, 0);
    return absl::OkStatus();
  }));
  for (const absl::Status& status : statuses) {
    EXPECT_THAT(status, StatusIs(absl::StatusCode::kInvalidArgument,
                                 HasSubstr("object \"stage\" is saved by ranks 0, 2 of 3, not by "
                                           "every rank: every rank must save the same objects")));
  }
  KEEL_ASSERT_OK_AND_ASSIGN(FindResult found, FindLatest(dir));
  EXPECT_FALSE(found.latest.has_value());
}

}  // namespace
}  // namespace keel::checkpoint
