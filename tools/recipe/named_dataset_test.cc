#include "tools/recipe/named_dataset.h"

#include <filesystem>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sampling/indexed_dataset_writer.h"
#include "testing/files.h"
#include "testing/status_matchers.h"
#include "tools/recipe/tokenizer_info.h"

namespace keel::tools::recipe {
namespace {

using ::keel::testing::IsOk;
using ::keel::testing::StatusIs;
using ::keel::testing::WriteFileOrFail;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr absl::StatusCode kInvalidArgument = absl::StatusCode::kInvalidArgument;

// A dataset of a few tokens at <dir>/data, recording `info` unless its vocab_size is 0.
std::string Dataset(const std::string& dir, const TokenizerInfo& info) {
  const std::string prefix = dir + "/data";
  absl::StatusOr<sampling::IndexedDatasetWriter> writer =
      sampling::IndexedDatasetWriter::Create(prefix, sampling::TokenDtype::kUint16);
  EXPECT_THAT(writer.status(), IsOk());
  EXPECT_THAT(writer->AddDocument({1, 2, 3}, {3}), IsOk());
  EXPECT_THAT(writer->Finalize(), IsOk());
  if (info.vocab_size > 0) {
    EXPECT_THAT(WriteTokenizerInfo(prefix, info), IsOk());
  }
  return prefix;
}

// A Hugging Face directory holding only tokenizer files with the given contents ("" : absent).
std::string HfDirectory(const std::string& path, const std::string& tokenizer_json,
                        const std::string& tokenizer_model = "") {
  std::filesystem::create_directories(path);
  if (!tokenizer_json.empty()) WriteFileOrFail(path + "/tokenizer.json", tokenizer_json);
  if (!tokenizer_model.empty()) WriteFileOrFail(path + "/tokenizer.model", tokenizer_model);
  return path;
}

TEST(OpenNamedDatasetTest, AMissingDatasetNamesTheField) {
  const std::string dir = keel::testing::NewTempDir("named_missing");
  EXPECT_THAT(OpenNamedDataset("data.prefix", dir + "/nothing"),
              StatusIs(kInvalidArgument,
                       AllOf(HasSubstr("data.prefix names \"" + dir + "/nothing\""),
                             HasSubstr("not an indexed dataset"), HasSubstr("nothing.idx"))));
  const std::string prefix = Dataset(dir, {});
  EXPECT_THAT(OpenNamedDataset("data.prefix", prefix).status(), IsOk());
  EXPECT_THAT(OpenNamedDataset("data.prefix", prefix + ".bin"),
              StatusIs(kInvalidArgument, HasSubstr("without .bin or .idx: \"" + prefix + "\"")));
}

// A model built fresh: only its vocabulary size is checked, and it can be set.
TEST(CheckDataFitsModelTest, AFreshModelMustCoverTheVocabulary) {
  const std::string dir = keel::testing::NewTempDir("named_fresh");
  const std::string prefix =
      Dataset(dir, {"/m/spm.model", 300, 2, true, TokenizerType::kSentencePiece});
  EXPECT_THAT(CheckDataFitsModel(prefix, {256, ""}),
              StatusIs(kInvalidArgument,
                       AllOf(HasSubstr("model.vocab_size (256) is smaller than the vocabulary of " +
                                       prefix + " (300 ids of /m/spm.model"),
                             HasSubstr("set model.vocab_size to at least 300"))));
  EXPECT_THAT(CheckDataFitsModel(prefix, {300, ""}), IsOk());
  EXPECT_THAT(CheckDataFitsModel(Dataset(keel::testing::NewTempDir("none"), {}), {2, ""}),
              IsOk());  // no record: nothing to check
}

// Bytes never feed a Hugging Face model, whatever its size.
TEST(CheckDataFitsModelTest, ByteDataIsRefusedForAHuggingFaceModel) {
  const std::string dir = keel::testing::NewTempDir("named_bytes");
  const std::string prefix = Dataset(dir, {"bytes", 256, 0, true, TokenizerType::kBytes});
  const std::string model = HfDirectory(dir + "/model", "{}");
  EXPECT_THAT(CheckDataFitsModel(prefix, {32000, model}),
              StatusIs(kInvalidArgument,
                       AllOf(HasSubstr(prefix + " holds byte values, not token ids"),
                             HasSubstr("not ids of the tokenizer of " + model),
                             HasSubstr("tools/scripts/hf_tokenize.py --model=" + model))));
  EXPECT_THAT(CheckDataFitsModel(prefix, {256, ""}), IsOk());  // a fresh byte-level model
  // A byte-level model's export holds no tokenizer: nothing to compare.
  std::filesystem::create_directories(dir + "/byte_model");
  EXPECT_THAT(CheckDataFitsModel(prefix, {256, dir + "/byte_model"}), IsOk());
  for (const char* file : {"tokenizer.model", "tokenizer_config.json", "vocab.json"}) {
    const std::string other = HfDirectory(dir + "/" + file, "");
    WriteFileOrFail(other + "/" + file, "{}");
    EXPECT_THAT(CheckDataFitsModel(prefix, {256, other}),
                StatusIs(kInvalidArgument, HasSubstr("holds byte values")))
        << file;
  }
}

// Ids of the model's own tokenizer pass: the directory itself, or a copy of its tokenizer.json.
TEST(CheckDataFitsModelTest, AHuggingFaceModelTakesItsOwnTokenizersIds) {
  const std::string dir = keel::testing::NewTempDir("named_hf");
  const std::string model = HfDirectory(dir + "/model", "{\"vocab\": \"a\"}");
  const std::string copy = HfDirectory(dir + "/copy", "{\"vocab\": \"a\"}");
  const std::string other = HfDirectory(dir + "/other", "{\"vocab\": \"b\"}");
  const auto data = [&](const std::string& name, const std::string& tokenizer) {
    return Dataset(keel::testing::NewTempDir(name),
                   {tokenizer, 120, 1, true, TokenizerType::kHuggingFace});
  };
  EXPECT_THAT(CheckDataFitsModel(data("own", model), {128, model}), IsOk());
  EXPECT_THAT(CheckDataFitsModel(data("copy", copy), {128, model}), IsOk());
  EXPECT_THAT(CheckDataFitsModel(data("gone", dir + "/gone"), {128, model}),
              IsOk());  // not on this machine: nothing to compare
  const std::string foreign = data("other", other);
  EXPECT_THAT(
      CheckDataFitsModel(foreign, {128, model}),
      StatusIs(kInvalidArgument, AllOf(HasSubstr("ids of the tokenizer in " + other +
                                                 ", whose tokenizer.json differs from the model's"),
                                       HasSubstr("hf_tokenize.py --model=" + model))));
  // The model's config.json cannot be changed: the advice is the data, not model.vocab_size.
  EXPECT_THAT(
      CheckDataFitsModel(data("large", model), {100, model}),
      StatusIs(kInvalidArgument, AllOf(HasSubstr("is larger than the model's (vocab_size 100 in " +
                                                 model + "/config.json)"),
                                       HasSubstr("hf_tokenize.py --model=" + model),
                                       ::testing::Not(HasSubstr("set model.vocab_size")))));
}

// SentencePiece ids feed a Hugging Face model whose tokenizer.model is that same file.
TEST(CheckDataFitsModelTest, SentencePieceIdsNeedTheModelsOwnTokenizerModel) {
  const std::string dir = keel::testing::NewTempDir("named_spm");
  WriteFileOrFail(dir + "/spm.model", "pieces");
  const std::string prefix =
      Dataset(dir, {dir + "/spm.model", 120, 2, true, TokenizerType::kSentencePiece});
  EXPECT_THAT(CheckDataFitsModel(prefix, {128, HfDirectory(dir + "/same", "{}", "pieces")}),
              IsOk());
  EXPECT_THAT(CheckDataFitsModel(prefix, {128, HfDirectory(dir + "/differs", "{}", "other")}),
              StatusIs(kInvalidArgument, HasSubstr("which differs from the model's "
                                                   "tokenizer.model")));
  EXPECT_THAT(CheckDataFitsModel(prefix, {128, HfDirectory(dir + "/json_only", "{}")}),
              StatusIs(kInvalidArgument, HasSubstr("and the model has no tokenizer.model")));
  // A model Keel trained on these ids and exported holds no tokenizer: nothing to compare.
  std::filesystem::create_directories(dir + "/exported");
  EXPECT_THAT(CheckDataFitsModel(prefix, {128, dir + "/exported"}), IsOk());
}

}  // namespace
}  // namespace keel::tools::recipe
