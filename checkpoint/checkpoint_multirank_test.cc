// Distributed save and load over real c10d Gloo groups (ranks on threads): every rank writes
// its blocks, replicated tensors once, and any world size loads any other's checkpoint.
#include <stdlib.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "ATen/CPUGeneratorImpl.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_testutil.h"
#include "checkpoint/manifest.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "parallel/layout.h"
#include "testing/files.h"
#include "testing/ranks.h"
#include "testing/status_matchers.h"

namespace keel::checkpoint {
namespace {

using ::keel::checkpoint::testing::TensorsState;
using ::keel::testing::FlipBit;
using ::keel::testing::IsOk;
using ::keel::testing::NewTempDir;
using ::keel::testing::RunOnRanks;
using ::keel::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

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
        EXPECT_EQ(loaded[r].values["world"], saving);  // values come from saving rank 0
      }
    }
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

}  // namespace
}  // namespace keel::checkpoint
