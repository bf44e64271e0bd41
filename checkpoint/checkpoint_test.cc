#include "checkpoint/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/json.h"
#include "checkpoint/checkpoint_testutil.h"
#include "checkpoint/manifest.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/stateful_conformance_testutil.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "parallel/layout.h"
#include "testing/files.h"
#include "testing/status_matchers.h"
#include "xxhash.h"

namespace keel::checkpoint {
namespace {

using ::keel::checkpoint::testing::TensorsState;
using ::keel::testing::FlipBit;
using ::keel::testing::IsOk;
using ::keel::testing::NewTempDir;
using ::keel::testing::ReadFileOrFail;
using ::keel::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using testing::StatefulConformanceTest;

// The messages of the problems Verify finds in `path` (the test fails if Verify itself errs).
std::vector<std::string> Problems(const std::string& path, VerifyLevel level) {
  absl::StatusOr<VerifyReport> report = Verify(path, level);
  EXPECT_THAT(report.status(), IsOk());
  std::vector<std::string> messages;
  if (!report.ok()) return messages;
  for (const VerifyProblem& problem : report->problems) messages.push_back(problem.message);
  return messages;
}

// Tensors of every kind a checkpoint meets, and values of every JSON type.
TensorsState MixedState() {
  at::manual_seed(3);
  TensorsState state;
  state.tensors["w"] = {at::randn({33, 17})};
  state.tensors["half"] = {at::randn({5, 3}).to(at::kBFloat16)};
  state.tensors["ids"] = {at::arange(10, at::kLong)};
  state.tensors["mask"] = {at::rand({7}) > 0.5};
  state.tensors["scalar"] = {at::scalar_tensor(2.5, at::kDouble)};
  state.tensors["empty"] = {at::empty({0, 4})};
  state.tensors["strided"] = {at::randn({6, 4}).t()};  // not contiguous
  state.values = {{"step", 12},
                  {"lr", 0.1},
                  {"name", "gpt"},
                  {"flags", {true, false}},
                  {"nested", {{"a", nullptr}, {"b", -3}}}};
  return state;
}

// TensorsState holding MixedState's tensors and values, offset by its variant.
class TensorsUnderTest : public testing::StatefulUnderTest {
 public:
  explicit TensorsUnderTest(int variant) : state_(MixedState().EmptyLike(variant)) {
    state_.values = {{"variant", variant}};
  }
  Stateful& stateful() override { return state_; }

 private:
  TensorsState state_;
};

INSTANTIATE_TEST_SUITE_P(
    TensorsState, StatefulConformanceTest,
    ::testing::Values(testing::StatefulCase{
        "mixed", [](int variant) { return std::make_unique<TensorsUnderTest>(variant); }}),
    testing::StatefulCaseName);

void ExpectSameTensors(const TensorsState& a, const TensorsState& b) {
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (const auto& [key, ref] : a.tensors) {
    SCOPED_TRACE(key);
    EXPECT_TRUE(at::equal(ref.tensor, b.tensors.at(key).tensor));
  }
}

// A partial sum is not a block of the whole tensor: saving one is an error naming it and its
// mesh dimension, and nothing is committed.
TEST(CheckpointTest, APartialSumIsNotSaved) {
  CheckpointerOptions options;
  options.checkpoint_dir = NewTempDir("partial");
  KEEL_ASSERT_OK_AND_ASSIGN(auto checkpointer, Checkpointer::Create(options, nullptr));
  TensorsState state;
  state.tensors["g"] = {
      at::ones({4}),
      parallel::TensorLayout{{4}, {0}, {{"tp", nullptr, parallel::Placement::Partial()}}}};
  EXPECT_THAT(checkpointer->Save({{"model", &state}}, 1, 0),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("tensor \"model/g\" is a partial sum over \"tp\"")));
  KEEL_ASSERT_OK_AND_ASSIGN(FindResult found, FindLatest(options.checkpoint_dir));
  EXPECT_FALSE(found.latest.has_value());
}

class CheckpointFormatTest : public ::testing::TestWithParam<SerializationFormat> {};

TEST_P(CheckpointFormatTest, RoundTripsEveryDtypeAndValue) {
  const std::string dir = NewTempDir("round_trip");
  CheckpointerOptions options;
  options.checkpoint_dir = dir;
  options.model_save_format = GetParam();
  KEEL_ASSERT_OK_AND_ASSIGN(auto checkpointer, Checkpointer::Create(options, nullptr));
  TensorsState saved = MixedState();
  KEEL_ASSERT_OK(checkpointer->Save({{"model", &saved}}, /*step=*/100, /*epoch=*/2));

  const std::string path = dir + "/step_0000000100";
  EXPECT_EQ(checkpointer->last_saved(), path);
  EXPECT_EQ(ReadFileOrFail(dir + "/latest"), "step_0000000100\n");
  EXPECT_THAT(Problems(path, VerifyLevel::kChecksums), IsEmpty());

  TensorsState loaded = saved.EmptyLike();
  KEEL_ASSERT_OK_AND_ASSIGN(LoadReport report,
                            checkpointer->Load(path, {{"model", &loaded}}, LoadOptions{}));
  EXPECT_TRUE(report.clean()) << report.ToString();
  ExpectSameTensors(saved, loaded);
  EXPECT_EQ(loaded.values, saved.values);

  KEEL_ASSERT_OK_AND_ASSIGN(Manifest manifest, ReadManifest(path));
  EXPECT_EQ(manifest.format_version(), 1u);
  EXPECT_EQ(manifest.step(), 100);
  EXPECT_EQ(manifest.epoch(), 2);
  EXPECT_EQ(manifest.world_size(), 1);
  ASSERT_EQ(manifest.files_size(), 1);
  EXPECT_EQ(manifest.tensors_size(), 7);
  EXPECT_EQ(manifest.tensors(0).name(), "model/empty");  // sorted by name
}

// Shard files are written in 16 MiB blocks with O_DIRECT where the filesystem has it (the
// test's disk), through plain writes where it does not (tmpfs): several whole blocks and an
// unaligned tail round-trip byte for byte on both.
TEST_P(CheckpointFormatTest, LargeStateRoundTripsWithAndWithoutDirectIo) {
  at::manual_seed(7);
  TensorsState saved;
  saved.tensors["a"] = {at::randn({5 << 20})};               // 20 MiB
  saved.tensors["b"] = {at::randn({12345})};                 // 49380 bytes: no multiple of 4096
  saved.tensors["c"] = {at::randn({3 << 20}, at::kDouble)};  // 24 MiB
  std::vector<std::string> roots = {""};                     // the test's temporary directory
  if (std::filesystem::is_directory("/dev/shm")) roots.push_back("/dev/shm");
  for (const std::string& root : roots) {
    SCOPED_TRACE(root);
    const std::string dir = NewTempDir("keel_large", root);
    CheckpointerOptions options;
    options.checkpoint_dir = dir;
    options.model_save_format = GetParam();
    KEEL_ASSERT_OK_AND_ASSIGN(auto checkpointer, Checkpointer::Create(options, nullptr));
    KEEL_ASSERT_OK(checkpointer->Save({{"model", &saved}}, /*step=*/1, /*epoch=*/0));
    const std::string path = dir + "/step_0000000001";
    EXPECT_THAT(Problems(path, VerifyLevel::kChecksums), IsEmpty());
    TensorsState loaded = saved.EmptyLike();
    KEEL_ASSERT_OK(checkpointer->Load(path, {{"model", &loaded}}, LoadOptions{}).status());
    ExpectSameTensors(saved, loaded);
    std::filesystem::remove_all(dir);
  }
}

TEST_P(CheckpointFormatTest, ShardFilesFollowTheirFormat) {
  const std::string dir = NewTempDir("shard_format");
  CheckpointerOptions options;
  options.checkpoint_dir = dir;
  options.model_save_format = GetParam();
  KEEL_ASSERT_OK_AND_ASSIGN(auto checkpointer, Checkpointer::Create(options, nullptr));
  TensorsState saved = MixedState();
  KEEL_ASSERT_OK(checkpointer->Save({{"model", &saved}}, 1, 0));
  KEEL_ASSERT_OK_AND_ASSIGN(Manifest manifest, ReadManifest(dir + "/step_0000000001"));
  if (GetParam() == SerializationFormat::kKeel) {
    EXPECT_EQ(manifest.shard_format(), ShardFormat::KEEL);
    EXPECT_EQ(manifest.files(0).name(), "__0.keel");
    for (const TensorEntry& tensor : manifest.tensors()) {
      EXPECT_EQ(tensor.chunks(0).byte_offset() % 4096, 0u) << tensor.name();  // direct-I/O aligned
    }
    return;
  }
  EXPECT_EQ(manifest.shard_format(), ShardFormat::SAFETENSORS);
  ASSERT_EQ(manifest.files(0).name(), "__0.safetensors");
  // Any safetensors reader opens the shard: every tensor under its full name.
  KEEL_ASSERT_OK_AND_ASSIGN(auto tensors,
                            ReadSafetensorsFile(dir + "/step_0000000001/__0.safetensors"));
  ASSERT_EQ(tensors.size(), saved.tensors.size());
  for (const auto& [name, tensor] : tensors) {
    SCOPED_TRACE(name);
    ASSERT_EQ(name.rfind("model/", 0), 0u);
    EXPECT_TRUE(at::equal(tensor, saved.tensors.at(name.substr(6)).tensor));
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, CheckpointFormatTest,
                         ::testing::Values(SerializationFormat::kKeel,
                                           SerializationFormat::kSafetensors),
                         [](const auto& info) {
                           return info.param == SerializationFormat::kKeel ? "Keel" : "Safetensors";
                         });

TEST(CheckpointTest, RefusesToOverwriteAStep) {
  const std::string dir = NewTempDir("overwrite");
  CheckpointerOptions options;
  options.checkpoint_dir = dir;
  KEEL_ASSERT_OK_AND_ASSIGN(auto checkpointer, Checkpointer::Create(options, nullptr));
  TensorsState state = MixedState();
  KEEL_ASSERT_OK(checkpointer->Save({{"model", &state}}, 5, 0));
  EXPECT_THAT(checkpointer->Save({{"model", &state}}, 5, 0),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("step_0000000005")));
}

TEST(CheckpointTest, CreateRejectsBadOptions) {
  CheckpointerOptions options;
  EXPECT_THAT(Checkpointer::Create(options, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("checkpoint_dir")));
  options.checkpoint_dir = "/tmp/x";
  options.keep_last_k = -1;
  EXPECT_THAT(Checkpointer::Create(options, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("keep_last_k (-1)")));
  options.keep_last_k = 0;
  options.keep_every_n_steps = -2;
  EXPECT_THAT(Checkpointer::Create(options, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("keep_every_n_steps (-2)")));
}

// Replaces the manifest of the checkpoint at `path` with `manifest`, framed as manifest.pb is:
// "KEELMFST", the body length and the body's XXH3-64 (uint64 little-endian each), the body.
void RewriteManifest(const std::string& path, const Manifest& manifest) {
  std::string body;
  manifest.SerializeToString(&body);
  std::string bytes = "KEELMFST";
  auto put = [&](uint64_t v) {
    for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  };
  put(body.size());
  put(XXH3_64bits(body.data(), body.size()));
  bytes += body;
  std::ofstream(path + "/manifest.pb", std::ios::trunc | std::ios::binary) << bytes;
}

class SavedCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = NewTempDir("saved");
    CheckpointerOptions options;
    options.checkpoint_dir = dir_;
    KEEL_ASSERT_OK_AND_ASSIGN(checkpointer_, Checkpointer::Create(options, nullptr));
    state_ = MixedState();
    KEEL_ASSERT_OK(checkpointer_->Save({{"model", &state_}}, 10, 0));
    KEEL_ASSERT_OK(checkpointer_->Save({{"model", &state_}}, 20, 0));
    path_ = dir_ + "/step_0000000020";
    KEEL_ASSERT_OK_AND_ASSIGN(manifest_, ReadManifest(path_));
  }

  const TensorEntry& Tensor(const std::string& name) {
    for (const TensorEntry& tensor : manifest_.tensors()) {
      if (tensor.name() == name) return tensor;
    }
    ADD_FAILURE() << name;
    return manifest_.tensors(0);
  }

  std::string dir_, path_;
  std::unique_ptr<Checkpointer> checkpointer_;
  TensorsState state_;
  Manifest manifest_;
};

TEST_F(SavedCheckpointTest, StrictLoadListsMissingAndUnexpectedKeys) {
  TensorsState other = state_.EmptyLike();
  other.tensors.erase("w");
  other.tensors["extra"] = {at::zeros({2})};
  EXPECT_THAT(
      LoadCheckpoint(path_, {{"model", &other}}),
      StatusIs(absl::StatusCode::kInvalidArgument, AllOf(HasSubstr("missing keys: model/extra"),
                                                         HasSubstr("unexpected keys: model/w"))));
  TensorsState sampler;
  EXPECT_THAT(LoadCheckpoint(path_, {{"model", &other}, {"sampler", &sampler}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("sampler")));
}

TEST_F(SavedCheckpointTest, MismatchesNameTheTensorAndBothValues) {
  TensorsState other = state_.EmptyLike();
  other.tensors["w"] = {at::zeros({33, 18})};
  other.tensors["ids"] = {at::zeros({10}, at::kInt)};
  EXPECT_THAT(LoadCheckpoint(path_, {{"model", &other}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("model/w: shape [33, 17] in the checkpoint, [33, 18] here"),
                             HasSubstr("model/ids: dtype Long in the checkpoint, Int here"))));
}

TEST_F(SavedCheckpointTest, NonStrictLoadReportsAndLoadsTheRest) {
  TensorsState other = state_.EmptyLike();
  other.tensors["w"] = {at::zeros({1})};
  other.tensors.erase("ids");
  LoadOptions options;
  options.strict = false;
  KEEL_ASSERT_OK_AND_ASSIGN(LoadReport report, LoadCheckpoint(path_, {{"model", &other}}, options));
  EXPECT_THAT(report.missing_keys, IsEmpty());
  EXPECT_THAT(report.unexpected_keys, ElementsAre("model/ids"));
  ASSERT_EQ(report.mismatches.size(), 1u);
  EXPECT_THAT(report.mismatches[0], HasSubstr("model/w"));
  EXPECT_TRUE(at::equal(other.tensors["half"].tensor, state_.tensors["half"].tensor));
  EXPECT_TRUE(at::equal(other.tensors["w"].tensor, at::zeros({1})));  // left untouched
}

TEST_F(SavedCheckpointTest, FlippedBitIsCaughtNamingFileAndTensor) {
  FlipBit(path_ + "/__0.keel", Tensor("model/w").chunks(0).byte_offset() + 5);
  TensorsState other = state_.EmptyLike();
  EXPECT_THAT(
      LoadCheckpoint(path_, {{"model", &other}}),
      StatusIs(absl::StatusCode::kDataLoss,
               AllOf(HasSubstr("__0.keel"), HasSubstr("\"model/w\""), HasSubstr("checksum"))));
  KEEL_ASSERT_OK_AND_ASSIGN(VerifyReport report, Verify(path_, VerifyLevel::kChecksums));
  ASSERT_EQ(report.problems.size(), 1u);
  EXPECT_EQ(report.problems[0].file, path_ + "/__0.keel");
  EXPECT_EQ(report.problems[0].tensor, "model/w");
  EXPECT_THAT(report.problems[0].message, AllOf(HasSubstr("__0.keel"), HasSubstr("\"model/w\"")));
  EXPECT_EQ(report.checkpoint.step, 20);
  // Structure alone cannot see it; checksums can, and FindLatest then falls back.
  EXPECT_THAT(Problems(path_, VerifyLevel::kStructure), IsEmpty());
  KEEL_ASSERT_OK_AND_ASSIGN(FindResult found, FindLatest(dir_, VerifyLevel::kChecksums));
  ASSERT_TRUE(found.latest.has_value());
  EXPECT_EQ(found.latest->step, 10);
  ASSERT_EQ(found.warnings.size(), 1u);
  EXPECT_THAT(found.warnings[0], AllOf(HasSubstr("step_0000000020"), HasSubstr("checksum")));
}

TEST_F(SavedCheckpointTest, TruncatedShardIsSkippedByFindLatest) {
  ASSERT_EQ(::truncate((path_ + "/__0.keel").c_str(), 4096), 0);
  TensorsState other = state_.EmptyLike();
  EXPECT_THAT(LoadCheckpoint(path_, {{"model", &other}}),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("truncated")));
  KEEL_ASSERT_OK_AND_ASSIGN(FindResult found, FindLatest(dir_));
  ASSERT_TRUE(found.latest.has_value());
  EXPECT_EQ(found.latest->path, dir_ + "/step_0000000010");
  ASSERT_EQ(found.warnings.size(), 1u);
  EXPECT_THAT(found.warnings[0], HasSubstr("__0.keel: 4096 bytes, the manifest says"));
}

TEST_F(SavedCheckpointTest, MissingShardIsDataLoss) {
  ASSERT_EQ(::unlink((path_ + "/__0.keel").c_str()), 0);
  TensorsState other = state_.EmptyLike();
  EXPECT_THAT(LoadCheckpoint(path_, {{"model", &other}}),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("__0.keel")));
  EXPECT_THAT(Problems(path_, VerifyLevel::kStructure),
              ElementsAre(HasSubstr("__0.keel: missing")));
}

TEST_F(SavedCheckpointTest, GarbageManifestIsDataLoss) {
  const std::string manifest = path_ + "/manifest.pb";
  FlipBit(manifest, 30);
  EXPECT_THAT(ReadManifest(path_),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("manifest.pb"), HasSubstr("checksum"))));
  // Verify reports a corrupt manifest as a problem of the checkpoint, not as an error.
  EXPECT_THAT(Problems(path_, VerifyLevel::kStructure),
              ElementsAre(AllOf(HasSubstr("manifest.pb"), HasSubstr("checksum"))));
  std::ofstream(manifest, std::ios::trunc) << "not a manifest at all";
  EXPECT_THAT(ReadManifest(path_),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("is not a Keel manifest")));
  EXPECT_THAT(ReadManifest(dir_ + "/nowhere"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no checkpoint at")));
}

TEST_F(SavedCheckpointTest, ManifestFromTheFutureIsRefused) {
  // Rewrite the manifest as a later Keel would: same content, format version 3 (this Keel
  // reads 1, and 2 for values per rank).
  Manifest future = manifest_;
  future.set_format_version(3);
  future.set_keel_version("9.0.0");
  RewriteManifest(path_, future);
  EXPECT_THAT(ReadManifest(path_), StatusIs(absl::StatusCode::kFailedPrecondition,
                                            AllOf(HasSubstr("format version 3"), HasSubstr("9.0.0"),
                                                  HasSubstr("reads versions up to 2"))));
}

// Values per rank: one entry per rank of world_size, in rank order, never beside values saved
// once, and only from format version 2 (a Keel of version 1 refuses them rather than reading
// the shared entry alone).
TEST_F(SavedCheckpointTest, ValuesPerRankMustBeOnePerRankInOrder) {
  auto per_rank = [&](int world_size, std::vector<int> ranks, uint32_t version) {
    Manifest manifest = manifest_;
    manifest.set_format_version(version);
    manifest.set_world_size(world_size);
    ObjectEntry& object = *manifest.mutable_objects(0);
    for (int rank : ranks) {
      RankValue* entry = object.add_rank_values();
      entry->set_rank(rank);
      *entry->mutable_value() = object.value();
    }
    object.clear_value();
    return manifest;
  };
  Manifest both = per_rank(2, {0, 1}, 2);
  *both.mutable_objects(0)->mutable_value() = manifest_.objects(0).value();
  Manifest twice = manifest_;
  *twice.add_objects() = manifest_.objects(0);
  Manifest no_world = manifest_;
  no_world.set_world_size(0);
  const std::vector<std::pair<Manifest, std::string>> cases = {
      {per_rank(2, {0, 1}, 1), "object \"model\" has values per rank, which format version 1"},
      {per_rank(3, {0, 1}, 2), "object \"model\" has the values of 2 ranks, the world size is 3"},
      {per_rank(2, {1, 0}, 2), "object \"model\": entry 0 of its per-rank values is rank 1, not 0"},
      {both, "object \"model\" has values both once and per rank"},
      {twice, "object \"model\" appears twice"},
      {no_world, "has world size 0; it must be >= 1"}};
  for (const auto& [manifest, message] : cases) {
    SCOPED_TRACE(message);
    RewriteManifest(path_, manifest);
    EXPECT_THAT(ReadManifest(path_), StatusIs(absl::StatusCode::kDataLoss, HasSubstr(message)));
  }
  RewriteManifest(path_, per_rank(2, {0, 1}, 2));
  KEEL_EXPECT_OK(ReadManifest(path_).status());
}

// States held in memory are one rank's: each object's values are its one saving rank's.
TEST(StateReaderTest, ValuesOfEachRankInMemoryAreTheOneSavingRanks) {
  testing::EachRankValues source;
  source.values = {{"step", 3}};
  KEEL_ASSERT_OK_AND_ASSIGN(State saved, source.StateDict());
  testing::EachRankValues target, absent;
  LoadOptions options;
  options.strict = false;
  KEEL_ASSERT_OK_AND_ASSIGN(LoadReport report, LoadFromMemory({{"a", &target}, {"b", &absent}},
                                                              {{"a", std::move(saved)}}, options));
  EXPECT_THAT(target.each_rank, ElementsAre(base::Json{{"step", 3}}));
  EXPECT_EQ(target.saved_world_size, 1);
  EXPECT_THAT(absent.each_rank, IsEmpty());
  EXPECT_THAT(report.missing_keys, ElementsAre("b"));
}

TEST(FindLatestTest, IgnoresUnfinishedSavesAndEmptyDirectories) {
  const std::string dir = NewTempDir("find");
  KEEL_ASSERT_OK_AND_ASSIGN(FindResult none, FindLatest(dir));
  EXPECT_FALSE(none.latest.has_value());
  EXPECT_THAT(FindLatest(dir + "/absent"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("absent")));

  CheckpointerOptions options;
  options.checkpoint_dir = dir;
  KEEL_ASSERT_OK_AND_ASSIGN(auto checkpointer, Checkpointer::Create(options, nullptr));
  TensorsState state = MixedState();
  KEEL_ASSERT_OK(checkpointer->Save({{"model", &state}}, 3, 1));
  // An interrupted save of step 4 (temporary name) and a step directory without a manifest.
  ASSERT_EQ(::mkdir((dir + "/.step_0000000004.tmp").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((dir + "/step_0000000005").c_str(), 0755), 0);
  KEEL_ASSERT_OK_AND_ASSIGN(FindResult found, FindLatest(dir));
  ASSERT_TRUE(found.latest.has_value());
  EXPECT_EQ(found.latest->step, 3);
  EXPECT_EQ(found.latest->epoch, 1);
  ASSERT_EQ(found.warnings.size(), 1u);
  EXPECT_THAT(found.warnings[0], HasSubstr("step_0000000005: no checkpoint at"));
}

TEST(RetentionTest, KeepsLastKEveryNthTheLoadedAndTheNewestGood) {
  const std::string dir = NewTempDir("retention");
  CheckpointerOptions options;
  options.checkpoint_dir = dir;
  options.keep_last_k = 2;
  options.keep_every_n_steps = 4;
  KEEL_ASSERT_OK_AND_ASSIGN(auto checkpointer, Checkpointer::Create(options, nullptr));
  TensorsState state = MixedState();
  KEEL_ASSERT_OK(checkpointer->Save({{"model", &state}}, 1, 0));
  TensorsState loaded = state.EmptyLike();
  KEEL_ASSERT_OK(checkpointer->Load(dir + "/step_0000000001", {{"model", &loaded}}).status());
  for (int64_t step = 2; step <= 7; ++step) {
    KEEL_ASSERT_OK(checkpointer->Save({{"model", &state}}, step, 0));
  }
  auto listing = [&] {
    std::vector<std::string> names;
    for (int64_t step = 1; step <= 7; ++step) {
      const std::string name = absl::StrFormat("step_%010d", step);
      if (::access((dir + "/" + name).c_str(), F_OK) == 0) names.push_back(name);
    }
    return names;
  };
  // 6 and 7: the last two; 4: a multiple of 4; 1: loaded by this checkpointer.
  EXPECT_THAT(listing(), ElementsAre("step_0000000001", "step_0000000004", "step_0000000006",
                                     "step_0000000007"));

  // When the newest checkpoints are corrupt, the newest good one survives retention.
  ASSERT_EQ(::truncate((dir + "/step_0000000007/__0.keel").c_str(), 1), 0);
  ASSERT_EQ(::truncate((dir + "/step_0000000006/__0.keel").c_str(), 1), 0);
  options.keep_every_n_steps = 0;
  options.keep_last_k = 2;
  KEEL_ASSERT_OK(ApplyRetention(dir, options, {}));
  EXPECT_THAT(listing(), ElementsAre("step_0000000004", "step_0000000006", "step_0000000007"));
}

TEST(AsyncSaveTest, SnapshotsAtSaveAndCommitsInTheBackground) {
  const std::string dir = NewTempDir("async");
  CheckpointerOptions options;
  options.checkpoint_dir = dir;
  options.is_async = true;
  KEEL_ASSERT_OK_AND_ASSIGN(auto checkpointer, Checkpointer::Create(options, nullptr));
  TensorsState state = MixedState();
  const at::Tensor before = state.tensors["w"].tensor.clone();
  KEEL_ASSERT_OK(checkpointer->Save({{"model", &state}}, 1, 0));
  state.tensors["w"].tensor.add_(1);  // training goes on while the save is written
  KEEL_ASSERT_OK(checkpointer->Wait());
  EXPECT_EQ(checkpointer->last_saved(), dir + "/step_0000000001");
  TensorsState loaded = state.EmptyLike();
  KEEL_ASSERT_OK(LoadCheckpoint(dir + "/step_0000000001", {{"model", &loaded}}).status());
  EXPECT_TRUE(at::equal(loaded.tensors["w"].tensor, before));

  // The next Save finishes the previous one first; its error surfaces there.
  KEEL_ASSERT_OK(checkpointer->Save({{"model", &state}}, 2, 0));
  KEEL_ASSERT_OK(checkpointer->Save({{"model", &state}}, 3, 0));
  KEEL_ASSERT_OK(checkpointer->Wait());
  KEEL_ASSERT_OK_AND_ASSIGN(FindResult found, FindLatest(dir, VerifyLevel::kChecksums));
  EXPECT_EQ(found.latest->step, 3);
  EXPECT_THAT(checkpointer->Save({{"model", &state}}, 3, 0),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("step_0000000003")));
}

// Steps 10, 20 and 30, each a MixedState filled with its step (so every step differs).
class LoadLatestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = NewTempDir("latest");
    CheckpointerOptions options;
    options.checkpoint_dir = dir_;
    KEEL_ASSERT_OK_AND_ASSIGN(checkpointer_, Checkpointer::Create(options, nullptr));
    for (int step : {10, 20, 30}) KEEL_ASSERT_OK(SaveStep(step));
  }

  absl::Status SaveStep(int step) {
    TensorsState state = StateAt(step);
    return checkpointer_->Save({{"model", &state}}, step, 0);
  }

  static TensorsState StateAt(int step) {
    TensorsState state = MixedState().EmptyLike(step);
    state.values = {{"step", step}};
    return state;
  }

  std::string StepDir(int step) const { return absl::StrFormat("%s/step_%010d", dir_, step); }
  std::string Shard(int step) const { return StepDir(step) + "/__0.keel"; }

  std::string dir_;
  std::unique_ptr<Checkpointer> checkpointer_;
};

TEST_F(LoadLatestTest, LoadsTheNewestWhenItIsGood) {
  TensorsState target = StateAt(0);
  KEEL_ASSERT_OK_AND_ASSIGN(ResumeResult result, checkpointer_->LoadLatest({{"model", &target}}));
  ASSERT_TRUE(result.loaded.has_value());
  EXPECT_EQ(result.loaded->step, 30);
  EXPECT_EQ(result.loaded->path, StepDir(30));
  EXPECT_THAT(result.warnings, IsEmpty());
  EXPECT_FALSE(result.partial);
  EXPECT_EQ(target.values["step"], 30);
}

// Step 30's shard fails its checksum part-way through the load; step 20's shard is truncated
// (caught before anything is read); step 10 loads. The two bad ones are moved aside, not
// deleted, and their steps can be saved again.
TEST_F(LoadLatestTest, FallsBackPastCorruptCheckpointsAndMovesThemAside) {
  KEEL_ASSERT_OK_AND_ASSIGN(Manifest manifest, ReadManifest(StepDir(30)));
  FlipBit(Shard(30), manifest.tensors(manifest.tensors_size() - 1).chunks(0).byte_offset() + 1);
  ASSERT_EQ(::truncate(Shard(20).c_str(), 4096), 0);

  TensorsState target = StateAt(0);
  int resets = 0;
  ResumeOptions options;
  options.reset = [&] {
    ++resets;
    target = StateAt(0);
    return absl::OkStatus();
  };
  KEEL_ASSERT_OK_AND_ASSIGN(ResumeResult result,
                            checkpointer_->LoadLatest({{"model", &target}}, options));
  ASSERT_TRUE(result.loaded.has_value());
  EXPECT_EQ(result.loaded->step, 10);
  EXPECT_FALSE(result.partial);
  EXPECT_EQ(resets, 1);  // after step 30's load failed part-way; step 20 failed before any read
  ExpectSameTensors(StateAt(10), target);
  EXPECT_EQ(target.values["step"], 10);
  ASSERT_EQ(result.warnings.size(), 2u);
  EXPECT_THAT(result.warnings[0],
              AllOf(HasSubstr(StepDir(30)), HasSubstr("checksum"),
                    HasSubstr("moved to " + dir_ + "/quarantine/step_0000000030")));
  EXPECT_THAT(result.warnings[1],
              AllOf(HasSubstr(StepDir(20)), HasSubstr("4096 bytes, the manifest says"),
                    HasSubstr("moved to " + dir_ + "/quarantine/step_0000000020")));
  EXPECT_THAT(result.quarantined, ElementsAre(dir_ + "/quarantine/step_0000000030",
                                              dir_ + "/quarantine/step_0000000020"));
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/quarantine/step_0000000030/__0.keel"));
  EXPECT_FALSE(std::filesystem::exists(StepDir(30)));
  EXPECT_EQ(ReadFileOrFail(dir_ + "/latest"), "step_0000000010\n");
  KEEL_ASSERT_OK_AND_ASSIGN(FindResult found, FindLatest(dir_, VerifyLevel::kChecksums));
  EXPECT_EQ(found.latest->step, 10);
  EXPECT_THAT(found.warnings, IsEmpty());

  // Training goes on and saves steps 20 and 30 again; a second bad step 30 goes beside the
  // first one in the quarantine.
  KEEL_ASSERT_OK(SaveStep(20));
  KEEL_ASSERT_OK(SaveStep(30));
  ASSERT_EQ(::unlink((StepDir(30) + "/manifest.pb").c_str()), 0);
  KEEL_ASSERT_OK_AND_ASSIGN(result, checkpointer_->LoadLatest({{"model", &target}}, options));
  EXPECT_EQ(result.loaded->step, 20);
  EXPECT_THAT(result.quarantined, ElementsAre(dir_ + "/quarantine/step_0000000030.1"));
  EXPECT_THAT(result.warnings[0], HasSubstr("no checkpoint at"));
}

// Without a reset, a load that failed part-way ends the search: the objects hold part of it.
// The caller resets them and asks again; the bad checkpoint is out of the way by then.
TEST_F(LoadLatestTest, WithoutResetAPartialLoadStopsTheSearch) {
  KEEL_ASSERT_OK_AND_ASSIGN(Manifest manifest, ReadManifest(StepDir(30)));
  FlipBit(Shard(30), manifest.tensors(manifest.tensors_size() - 1).chunks(0).byte_offset());
  TensorsState target = StateAt(0);
  KEEL_ASSERT_OK_AND_ASSIGN(ResumeResult result, checkpointer_->LoadLatest({{"model", &target}}));
  EXPECT_FALSE(result.loaded.has_value());
  EXPECT_TRUE(result.partial);
  EXPECT_THAT(result.quarantined, ElementsAre(dir_ + "/quarantine/step_0000000030"));
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/latest"));
  target = StateAt(0);
  KEEL_ASSERT_OK_AND_ASSIGN(result, checkpointer_->LoadLatest({{"model", &target}}));
  EXPECT_EQ(result.loaded->step, 20);
  EXPECT_FALSE(result.partial);
}

TEST_F(LoadLatestTest, WhenNothingLoadsTheObjectsAreResetAndNothingIsLoaded) {
  for (int step : {10, 20, 30}) {
    KEEL_ASSERT_OK_AND_ASSIGN(Manifest manifest, ReadManifest(StepDir(step)));
    FlipBit(Shard(step), manifest.tensors(manifest.tensors_size() - 1).chunks(0).byte_offset());
  }
  TensorsState target = StateAt(0);
  ResumeOptions options;
  options.reset = [&] {
    target = StateAt(0);
    return absl::OkStatus();
  };
  KEEL_ASSERT_OK_AND_ASSIGN(ResumeResult result,
                            checkpointer_->LoadLatest({{"model", &target}}, options));
  EXPECT_FALSE(result.loaded.has_value());
  EXPECT_FALSE(result.partial);
  EXPECT_EQ(result.quarantined.size(), 3u);
  ExpectSameTensors(StateAt(0), target);
}

// A checkpoint that does not fit the objects (a changed model) is not corrupt: the search
// stops with the error and nothing is moved.
TEST_F(LoadLatestTest, ACheckpointThatDoesNotFitStopsTheSearch) {
  TensorsState target = StateAt(0);
  target.tensors["w"] = {at::zeros({2, 2})};
  EXPECT_THAT(checkpointer_->LoadLatest({{"model", &target}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("model/w")));
  EXPECT_TRUE(std::filesystem::exists(StepDir(30)));
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/quarantine"));
}

// Loads its tensors, then refuses its values (as a scheduler refuses a saved state) once it
// is past the checking pass: the failure comes after the object changed.
class RefusingState : public testing::TensorsState {
 public:
  absl::Status LoadStateDict(StateReader& reader) override {
    KEEL_RETURN_IF_ERROR(TensorsState::LoadStateDict(reader));
    if (reader.checking()) return absl::OkStatus();
    return absl::InvalidArgumentError("the saved step is not one this object takes");
  }
};

// An error after the objects began to change (not corruption: nothing is moved aside) is
// returned after reset put them back as they were.
TEST_F(LoadLatestTest, AFailureAfterTheObjectsChangedResetsThemBeforeReturning) {
  RefusingState target;
  static_cast<TensorsState&>(target) = StateAt(0);
  int resets = 0;
  ResumeOptions options;
  options.reset = [&] {
    ++resets;
    static_cast<TensorsState&>(target) = StateAt(0);
    return absl::OkStatus();
  };
  EXPECT_THAT(checkpointer_->LoadLatest({{"model", &target}}, options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("the saved step is not one this object takes")));
  EXPECT_EQ(resets, 1);
  ExpectSameTensors(StateAt(0), target);
  EXPECT_EQ(target.values["step"], 0);
  EXPECT_TRUE(std::filesystem::exists(StepDir(30)));
}

TEST_F(LoadLatestTest, BeforeLoadSeesTheCandidateAndItsErrorStopsTheSearch) {
  TensorsState target = StateAt(0);
  std::vector<int64_t> seen;
  ResumeOptions options;
  options.before_load = [&](const CheckpointInfo& info) {
    seen.push_back(info.step);
    return absl::InvalidArgumentError("model.hidden_size differs");
  };
  EXPECT_THAT(checkpointer_->LoadLatest({{"model", &target}}, options),
              StatusIs(absl::StatusCode::kInvalidArgument, "model.hidden_size differs"));
  EXPECT_THAT(seen, ElementsAre(30));
  EXPECT_EQ(target.values["step"], 0);  // nothing was read
}

TEST(LoadLatestEmptyTest, AnEmptyCheckpointDirLoadsNothing) {
  CheckpointerOptions options;
  options.checkpoint_dir = NewTempDir("empty");
  KEEL_ASSERT_OK_AND_ASSIGN(auto checkpointer, Checkpointer::Create(options, nullptr));
  TensorsState target = MixedState();
  KEEL_ASSERT_OK_AND_ASSIGN(ResumeResult result, checkpointer->LoadLatest({{"model", &target}}));
  EXPECT_FALSE(result.loaded.has_value());
  EXPECT_FALSE(result.partial);
}

}  // namespace
}  // namespace keel::checkpoint
