// The consolidated Hugging Face export of a checkpoint saved by two ranks: file split, index
// and tensors, checked against values and sizes worked out by hand; unpadded rows and
// config.json; and a model that transformers' save_pretrained wrote (testdata/hf_parity) comes
// back from a Keel checkpoint byte for byte.
#include "checkpoint/hf_export.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "ATen/CPUGeneratorImpl.h"
#include "absl/strings/str_cat.h"
#include "base/json.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_testutil.h"
#include "checkpoint/manifest.h"
#include "checkpoint/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "parallel/layout.h"
#include "testing/files.h"
#include "testing/ranks.h"
#include "testing/status_matchers.h"

namespace keel::checkpoint {
namespace {

using ::keel::base::Json;
using ::keel::checkpoint::testing::TensorsState;
using ::keel::testing::FlipBit;
using ::keel::testing::NewTempDir;
using ::keel::testing::ReadFileOrFail;
using ::keel::testing::RunOnRanks;
using ::keel::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// The model's whole tensors, made once from their own generator (ranks are threads).
const std::map<std::string, at::Tensor>& ModelTensors() {
  static const auto* const tensors = [] {
    at::Generator generator = at::detail::createCPUGenerator(5);
    return new std::map<std::string, at::Tensor>{
        {"a", at::randn({4, 3}, generator)},                    // F32: 48 bytes
        {"b", at::randn({5}, generator).to(at::kBFloat16)},     // BF16: 10 bytes
        {"big", at::randn({20}, generator)},                    // F32: 80 bytes
        {"c", at::randint(100, {2, 2}, generator, at::kLong)},  // I64: 32 bytes
        {"d", at::randn({8}, generator)},                       // F32: 32 bytes
        {"s", at::scalar_tensor(7, at::kLong)}};                // I64: 8 bytes
  }();
  return *tensors;
}

// Saves step 1 into `dir` from two ranks: "model/a" split by rows between them, the rest
// replicated, plus an "optim" object.
void SaveTwoRankCheckpoint(const std::string& dir) {
  KEEL_ASSERT_OK(RunOnRanks(2, [&](keel::testing::Rank& r) -> absl::Status {
    CheckpointerOptions options;
    options.checkpoint_dir = dir;
    KEEL_ASSIGN_OR_RETURN(auto checkpointer, Checkpointer::Create(options, r.group.get()));
    TensorsState model;
    for (const auto& [key, tensor] : ModelTensors()) model.tensors[key] = {tensor};
    model.tensors["a"] = {ModelTensors().at("a").narrow(0, 2 * r.rank, 2).clone(),
                          parallel::BlockLayout({4, 3}, {2 * r.rank, 0})};
    TensorsState optim;
    optim.tensors["m"] = {at::ones({3})};
    optim.values = {{"lr", 0.5}};
    return checkpointer->Save({{"model", &model}, {"optim", &optim}}, 1, 0);
  }));
}

class HfExportTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    run_dir_ = new std::string(NewTempDir("run"));
    SaveTwoRankCheckpoint(*run_dir_);
  }
  static void TearDownTestSuite() { delete run_dir_; }
  static std::string checkpoint() { return *run_dir_ + "/step_0000000001"; }

  static std::string* run_dir_;
};

std::string* HfExportTest::run_dir_ = nullptr;

TEST_F(HfExportTest, CheckpointHoldsAShardedTensor) {
  KEEL_ASSERT_OK_AND_ASSIGN(Manifest manifest, ReadManifest(checkpoint()));
  ASSERT_EQ(manifest.tensors(0).name(), "model/a");
  EXPECT_EQ(manifest.tensors(0).chunks_size(), 2);
}

TEST_F(HfExportTest, SplitsFilesInNameOrderAtTheLimit) {
  const std::string out = NewTempDir("split") + "/nested/export";
  HfExportOptions options;
  options.max_shard_bytes = 64;
  KEEL_ASSERT_OK_AND_ASSIGN(HfExportResult result, ExportHfSafetensors(checkpoint(), out, options));
  // a + b = 58; + big would be 138 > 64. big alone (80 > 64). c + d = 64, not above the
  // limit; + s would be 72. s alone.
  const std::map<std::string, std::vector<std::string>> expected = {
      {"model-00001-of-00004.safetensors", {"a", "b"}},
      {"model-00002-of-00004.safetensors", {"big"}},
      {"model-00003-of-00004.safetensors", {"c", "d"}},
      {"model-00004-of-00004.safetensors", {"s"}}};
  EXPECT_THAT(result.files,
              ElementsAre("model-00001-of-00004.safetensors", "model-00002-of-00004.safetensors",
                          "model-00003-of-00004.safetensors", "model-00004-of-00004.safetensors",
                          "model.safetensors.index.json"));
  EXPECT_EQ(result.num_tensors, 6);
  EXPECT_EQ(result.total_size, 210);  // 48 + 10 + 80 + 32 + 32 + 8

  for (const auto& [file, keys] : expected) {
    SCOPED_TRACE(file);
    KEEL_ASSERT_OK_AND_ASSIGN(auto header, ReadSafetensorsHeader(out + "/" + file));
    EXPECT_EQ(header.metadata, (std::map<std::string, std::string>{{"format", "pt"}}));
    KEEL_ASSERT_OK_AND_ASSIGN(auto tensors, ReadSafetensorsFile(out + "/" + file));
    std::vector<std::string> names;
    for (const auto& [name, tensor] : tensors) {
      names.push_back(name);
      const at::Tensor& original = ModelTensors().at(name);
      EXPECT_EQ(tensor.scalar_type(), original.scalar_type()) << name;
      EXPECT_TRUE(at::equal(tensor, original)) << name;
    }
    EXPECT_EQ(names, keys);
  }

  KEEL_ASSERT_OK_AND_ASSIGN(Json index,
                            base::ParseJson(ReadFileOrFail(out + "/model.safetensors.index.json")));
  const Json expected_index = {{"metadata", {{"total_size", 210}}},
                               {"weight_map",
                                {{"a", "model-00001-of-00004.safetensors"},
                                 {"b", "model-00001-of-00004.safetensors"},
                                 {"big", "model-00002-of-00004.safetensors"},
                                 {"c", "model-00003-of-00004.safetensors"},
                                 {"d", "model-00003-of-00004.safetensors"},
                                 {"s", "model-00004-of-00004.safetensors"}}}};
  EXPECT_EQ(index, expected_index);
  EXPECT_EQ(index.dump(), expected_index.dump());  // key order too
}

TEST_F(HfExportTest, DefaultLimitWritesOneFileAsSavePretrainedDoes) {
  const std::string out = NewTempDir("default");
  KEEL_ASSERT_OK_AND_ASSIGN(HfExportResult result, ExportHfSafetensors(checkpoint(), out));
  EXPECT_THAT(result.files, ElementsAre("model.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(out + "/model.safetensors.index.json"));
  KEEL_ASSERT_OK_AND_ASSIGN(auto tensors, ReadSafetensorsFile(out + "/model.safetensors"));
  ASSERT_EQ(tensors.size(), ModelTensors().size());
  for (const auto& [key, tensor] : tensors) {
    SCOPED_TRACE(key);
    EXPECT_TRUE(at::equal(tensor, ModelTensors().at(key)));
  }
}

TEST_F(HfExportTest, UnpaddedRowsDropTheLastRows) {
  const std::string out = NewTempDir("unpadded");
  HfExportOptions options;
  options.unpadded_rows = {{"a", 3}, {"big", 20}};
  KEEL_ASSERT_OK_AND_ASSIGN(HfExportResult result, ExportHfSafetensors(checkpoint(), out, options));
  EXPECT_EQ(result.total_size, 48 - 12 + 10 + 80 + 32 + 32 + 8);  // a loses one row of 3 floats
  KEEL_ASSERT_OK_AND_ASSIGN(auto tensors, ReadSafetensorsFile(out + "/model.safetensors"));
  ASSERT_EQ(tensors[0].first, "a");
  EXPECT_TRUE(at::equal(tensors[0].second, ModelTensors().at("a").narrow(0, 0, 3)));
  ASSERT_EQ(tensors[2].first, "big");
  EXPECT_TRUE(at::equal(tensors[2].second, ModelTensors().at("big")));
}

TEST_F(HfExportTest, UnpaddedRowsNameAnExportedTensorAndItsRows) {
  HfExportOptions options;
  options.unpadded_rows = {{"a", 5}};
  EXPECT_THAT(ExportHfSafetensors(checkpoint(), NewTempDir("too_many"), options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("\"a\" is 5"), HasSubstr("1 to 4"))));
  options.unpadded_rows = {{"lm_head.weight", 2}};
  EXPECT_THAT(ExportHfSafetensors(checkpoint(), NewTempDir("absent"), options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("\"lm_head.weight\""), HasSubstr("does not hold"))));
}

TEST_F(HfExportTest, WritesConfigJsonAsTransformersDoes) {
  const std::string out = NewTempDir("config");
  HfExportOptions options;
  options.config = Json{{"vocab_size", 131},
                        {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 10000.0}}},
                        {"architectures", {"LlamaForCausalLM"}},
                        {"rms_norm_eps", 1e-05},
                        {"pad_token_id", nullptr}};
  KEEL_ASSERT_OK_AND_ASSIGN(HfExportResult result, ExportHfSafetensors(checkpoint(), out, options));
  EXPECT_THAT(result.files, ElementsAre("config.json", "model.safetensors"));
  // json.dumps(config, indent=2, sort_keys=True) + "\n", as Python prints it.
  EXPECT_EQ(ReadFileOrFail(out + "/config.json"),
            "{\n"
            "  \"architectures\": [\n"
            "    \"LlamaForCausalLM\"\n"
            "  ],\n"
            "  \"pad_token_id\": null,\n"
            "  \"rms_norm_eps\": 1e-05,\n"
            "  \"rope_parameters\": {\n"
            "    \"rope_theta\": 10000.0,\n"
            "    \"rope_type\": \"default\"\n"
            "  },\n"
            "  \"vocab_size\": 131\n"
            "}\n");
  EXPECT_THAT(ExportHfSafetensors(checkpoint(), out, options),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("config.json")));
}

// save_pretrained's file, through a two-rank Keel checkpoint (the embedding split by rows), is
// written again byte for byte.
TEST(HfExportRoundTripTest, SavePretrainedFileComesBackByteForByte) {
  for (const std::string name : {"llama_tied", "llama_gqa_untied", "qwen3"}) {
    SCOPED_TRACE(name);
    const std::string original = "testdata/hf_parity/" + name + "/model.safetensors";
    KEEL_ASSERT_OK_AND_ASSIGN(auto tensors, ReadSafetensorsFile(original));
    const std::string run = NewTempDir(name);
    KEEL_ASSERT_OK(RunOnRanks(2, [&](keel::testing::Rank& r) -> absl::Status {
      CheckpointerOptions options;
      options.checkpoint_dir = run;
      KEEL_ASSIGN_OR_RETURN(auto checkpointer, Checkpointer::Create(options, r.group.get()));
      TensorsState model;
      for (const auto& [key, tensor] : tensors) {
        if (tensor.dim() != 2) {
          model.tensors[key] = {tensor};
          continue;
        }
        // Uneven halves (the vocabulary has 131 rows).
        const int64_t first = (tensor.size(0) + 1) / 2;
        const int64_t begin = r.rank == 0 ? 0 : first;
        const int64_t rows = r.rank == 0 ? first : tensor.size(0) - first;
        model.tensors[key] = {tensor.narrow(0, begin, rows).clone(),
                              parallel::BlockLayout(tensor.sizes().vec(), {begin, 0})};
      }
      return checkpointer->Save({{"model", &model}}, 1, 0);
    }));
    const std::string out = NewTempDir(name + "_export");
    KEEL_ASSERT_OK(ExportHfSafetensors(run + "/step_0000000001", out).status());
    EXPECT_EQ(ReadFileOrFail(out + "/model.safetensors"), ReadFileOrFail(original));
  }
}

TEST_F(HfExportTest, ExportsAnotherObject) {
  const std::string out = NewTempDir("optim");
  HfExportOptions options;
  options.object = "optim";
  KEEL_ASSERT_OK_AND_ASSIGN(HfExportResult result, ExportHfSafetensors(checkpoint(), out, options));
  EXPECT_EQ(result.total_size, 12);  // F32 [3]
  KEEL_ASSERT_OK_AND_ASSIGN(auto tensors, ReadSafetensorsFile(out + "/model.safetensors"));
  ASSERT_EQ(tensors.size(), 1u);
  EXPECT_EQ(tensors[0].first, "m");
  EXPECT_TRUE(at::equal(tensors[0].second, at::ones({3})));
}

TEST_F(HfExportTest, UnknownObjectListsTheObjects) {
  HfExportOptions options;
  options.object = "ema";
  EXPECT_THAT(ExportHfSafetensors(checkpoint(), NewTempDir("unknown"), options),
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr("\"ema\""), HasSubstr("model, optim"))));
}

TEST_F(HfExportTest, RefusesADirectoryHoldingAnExport) {
  const std::string out = NewTempDir("twice");
  KEEL_ASSERT_OK(ExportHfSafetensors(checkpoint(), out).status());
  EXPECT_THAT(ExportHfSafetensors(checkpoint(), out),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr(out)));

  const std::string shard_only = NewTempDir("shard_only");
  std::ofstream(shard_only + "/model-00001-of-00002.safetensors") << "x";
  EXPECT_THAT(
      ExportHfSafetensors(checkpoint(), shard_only),
      StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("model-00001-of-00002.safetensors")));
}

TEST_F(HfExportTest, RejectsANonPositiveLimit) {
  HfExportOptions options;
  options.max_shard_bytes = 0;
  EXPECT_THAT(ExportHfSafetensors(checkpoint(), NewTempDir("limit"), options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("max_shard_bytes (0)"), HasSubstr(">= 1"))));
}

TEST_F(HfExportTest, CorruptChunkIsDataLossAndWritesNoIndex) {
  const std::string copy = NewTempDir("corrupt") + "/step";
  std::filesystem::copy(checkpoint(), copy);
  KEEL_ASSERT_OK_AND_ASSIGN(Manifest manifest, ReadManifest(copy));
  const Chunk& chunk = manifest.tensors(0).chunks(1);  // "model/a", rows 2-3
  FlipBit(copy + "/" + manifest.files(chunk.file()).name(), chunk.byte_offset() + 5);
  const std::string out = NewTempDir("corrupt_out");
  EXPECT_THAT(ExportHfSafetensors(copy, out),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("model/a")));
  EXPECT_FALSE(std::filesystem::exists(out + "/model.safetensors.index.json"));
}

// An export that fails half-way (config.json written, a chunk corrupt) removes what it wrote:
// the retry finds no export in the way.
TEST_F(HfExportTest, AFailedExportLeavesNothingAndTheRetryWrites) {
  const std::string copy = NewTempDir("half") + "/step";
  std::filesystem::copy(checkpoint(), copy);
  KEEL_ASSERT_OK_AND_ASSIGN(Manifest manifest, ReadManifest(copy));
  const Chunk& chunk = manifest.tensors(0).chunks(1);  // "model/a"
  FlipBit(copy + "/" + manifest.files(chunk.file()).name(), chunk.byte_offset() + 5);
  const std::string out = NewTempDir("half_out");
  HfExportOptions options;
  options.config = Json{{"model_type", "llama"}};
  EXPECT_THAT(ExportHfSafetensors(copy, out, options),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("model/a")));
  EXPECT_TRUE(std::filesystem::is_empty(out));
  KEEL_EXPECT_OK(ExportHfSafetensors(checkpoint(), out, options).status());
}

// A link planted where the temporary file goes is replaced, never written through.
TEST_F(HfExportTest, TheTemporaryFileIsNeverFollowed) {
  const std::string out = NewTempDir("planted");
  const std::string victim = NewTempDir("victim") + "/precious";
  std::ofstream(victim) << "keep me";
  std::filesystem::create_symlink(victim, out + "/model.safetensors.tmp");
  KEEL_ASSERT_OK(ExportHfSafetensors(checkpoint(), out).status());
  EXPECT_EQ(ReadFileOrFail(victim), "keep me");
  EXPECT_TRUE(std::filesystem::is_regular_file(
      std::filesystem::symlink_status(out + "/model.safetensors")));
  EXPECT_FALSE(std::filesystem::exists(out + "/model.safetensors.tmp"));
}

TEST_F(HfExportTest, MissingCheckpointIsNotFound) {
  EXPECT_THAT(ExportHfSafetensors(*run_dir_ + "/step_0000000099", NewTempDir("missing")),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("step_0000000099")));
}

}  // namespace
}  // namespace keel::checkpoint
