#include "checkpoint/hf_import.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/hf_export.h"
#include "checkpoint/model_state.h"
#include "checkpoint/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "parallel/layout.h"
#include "testing/files.h"
#include "testing/status_matchers.h"
#include "torch/nn/module.h"
#include "torch/types.h"

namespace keel::checkpoint {
namespace {

using ::absl::StatusCode;
using ::keel::testing::NewTempDir;
using ::keel::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// An embedding, a projection with a bias, a buffer and an lm_head tied to the embedding.
struct TinyModel : torch::nn::Module {
  struct Head : torch::nn::Module {
    explicit Head(const at::Tensor& tied) { register_parameter("weight", tied); }
  };
  explicit TinyModel(uint64_t seed) {
    at::Generator generator = at::detail::createCPUGenerator(seed);
    wte = register_parameter("wte", at::randn({10, 4}, generator));
    w = register_parameter("proj_w", at::randn({4, 4}, generator), /*requires_grad=*/true);
    b = register_parameter("proj_b", at::randn({4}, generator));
    register_buffer("scale", at::full({1}, static_cast<double>(seed), at::kDouble));
    register_module("lm_head", std::make_shared<Head>(wte));
  }
  at::Tensor wte, w, b;
};

std::map<std::string, at::Tensor> Weights(torch::nn::Module& model) {
  std::map<std::string, at::Tensor> weights;
  for (const auto& item : model.named_parameters()) weights[item.key()] = item.value().clone();
  for (const auto& item : model.named_buffers()) weights[item.key()] = item.value().clone();
  return weights;
}

// `model` saved as a Keel checkpoint and exported with ExportHfSafetensors into `out`, one
// tensor per file (an index and four shards).
void Export(torch::nn::Module& model, const std::string& dir, const std::string& out) {
  CheckpointerOptions options;
  options.checkpoint_dir = dir;
  KEEL_ASSERT_OK_AND_ASSIGN(auto checkpointer, Checkpointer::Create(options, nullptr));
  ModelState state(model);
  KEEL_ASSERT_OK(checkpointer->Save({{"model", &state}}, 1, 0));
  HfExportOptions export_options;
  export_options.max_shard_bytes = 1;
  KEEL_ASSERT_OK(ExportHfSafetensors(dir + "/step_0000000001", out, export_options).status());
}

TEST(HfImportTest, AnExportLoadsBackIntoTheSameModelBitForBit) {
  const std::string dir = NewTempDir("hf_roundtrip");
  TinyModel source(1);
  Export(source, dir + "/ckpt", dir + "/hf");
  TinyModel target(2);
  KEEL_ASSERT_OK_AND_ASSIGN(HfImportResult result, LoadHfSafetensors(dir + "/hf", target));
  EXPECT_EQ(result.num_tensors, 4);
  EXPECT_EQ(result.files.size(), 4u);
  const auto expected = Weights(source);
  const auto loaded = Weights(target);
  ASSERT_EQ(loaded.size(), expected.size());
  for (const auto& [name, tensor] : expected) {
    EXPECT_TRUE(at::equal(loaded.at(name), tensor)) << name;
  }
  EXPECT_TRUE(target.named_parameters()["lm_head.weight"].is_alias_of(target.wte));
}

// Tensors from memory (ExportHfTensors) under other names in files of another stem load
// through HfFileNames, and read back whole (ReadHfSafetensors); a renaming that gives two keys
// one name is refused.
TEST(HfImportTest, OtherFileNamesAndTensorNamesLoadThroughHfFileNames) {
  const std::string dir = NewTempDir("hf_names");
  TinyModel source(1);
  std::map<std::string, at::Tensor> renamed;
  for (const auto& [key, tensor] : Weights(source)) {
    if (key != "lm_head.weight") renamed["x." + key] = tensor;
  }
  HfExportOptions options;
  options.max_shard_bytes = 1;  // an index and shards
  KEEL_ASSERT_OK_AND_ASSIGN(const HfExportResult exported,
                            ExportHfTensors(renamed, dir + "/model", options));
  EXPECT_EQ(exported.num_tensors, 4);
  EXPECT_EQ(exported.files.back(), "model.safetensors.index.json");
  ASSERT_TRUE(base::RenameDurably(dir + "/model/model.safetensors.index.json",
                                  dir + "/model/adapter.safetensors.index.json")
                  .ok());
  HfFileNames names;
  names.stem = "adapter";
  names.name_in_files = [](const std::string& key) { return "x." + key; };
  KEEL_ASSERT_OK_AND_ASSIGN(const auto read, ReadHfSafetensors(dir + "/model", names));
  ASSERT_EQ(read.size(), renamed.size());
  for (const auto& [name, tensor] : renamed) EXPECT_TRUE(at::equal(read.at(name), tensor)) << name;

  TinyModel target(2);
  KEEL_ASSERT_OK_AND_ASSIGN(const HfImportResult loaded,
                            LoadHfSafetensors(dir + "/model", target, {}, {}, {}, names));
  EXPECT_EQ(loaded.num_tensors, 4);
  for (const auto& [name, tensor] : Weights(source)) {
    EXPECT_TRUE(at::equal(Weights(target).at(name), tensor)) << name;
  }
  EXPECT_THAT(LoadHfSafetensors(dir + "/model", target, {}, {}, {}, {}),
              StatusIs(StatusCode::kNotFound, HasSubstr("model.safetensors.index.json")));
  names.name_in_files = [](const std::string&) { return std::string("same"); };
  EXPECT_THAT(LoadHfSafetensors(dir + "/model", target, {}, {}, {}, names),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("both have the name \"same\"")));
  EXPECT_THAT(ExportHfTensors({}, dir + "/empty"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("no tensors")));
}

TEST(HfImportTest, ASingleFileWithTheTiedHeadLoadsAndTheHeadIsChecked) {
  const std::string dir = NewTempDir("hf_single");
  TinyModel source(3);
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& [name, tensor] : Weights(source)) tensors.emplace_back(name, tensor);
  KEEL_ASSERT_OK(WriteSafetensorsFile(dir + "/model.safetensors", tensors, {}));
  TinyModel target(4);
  KEEL_ASSERT_OK_AND_ASSIGN(HfImportResult result, LoadHfSafetensors(dir, target));
  EXPECT_THAT(result.tied_checked, ElementsAre("lm_head.weight"));
  EXPECT_TRUE(at::equal(target.wte, source.wte));

  for (auto& [name, tensor] : tensors) {
    if (name == "lm_head.weight") tensor = tensor + 1;
  }
  KEEL_ASSERT_OK(WriteSafetensorsFile(dir + "/model.safetensors", tensors, {}));
  EXPECT_THAT(LoadHfSafetensors(dir, target),
              StatusIs(StatusCode::kFailedPrecondition,
                       HasSubstr("\"lm_head.weight\" is tied to \"wte\" in the model, but the "
                                 "files hold different values")));
}

// A sharded model (rows 6..9 of the embedding and its tied head, columns 2..3 of the
// projection) reads its blocks of the whole tensors the files hold.
TEST(HfImportTest, ALaidOutParameterReadsItsBlockOfTheWholeTensor) {
  const std::string dir = NewTempDir("hf_blocks");
  TinyModel source(5);
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& [name, tensor] : Weights(source)) tensors.emplace_back(name, tensor);
  KEEL_ASSERT_OK(WriteSafetensorsFile(dir + "/model.safetensors", tensors, {}));
  torch::nn::Module part;
  const at::Tensor wte = part.register_parameter("wte", at::zeros({4, 4}));
  const at::Tensor w = part.register_parameter("proj_w", at::zeros({4, 2}));
  const at::Tensor b = part.register_parameter("proj_b", at::zeros({4}));
  part.register_buffer("scale", at::zeros({1}, at::kDouble));
  part.register_module("lm_head", std::make_shared<TinyModel::Head>(wte));
  ModelStateOptions options;
  options.layouts = {{"wte", parallel::BlockLayout({10, 4}, {6, 0})},
                     {"lm_head.weight", parallel::BlockLayout({10, 4}, {6, 0})},
                     {"proj_w", parallel::BlockLayout({4, 4}, {0, 2})}};
  KEEL_ASSERT_OK_AND_ASSIGN(HfImportResult result, LoadHfSafetensors(dir, part, options));
  EXPECT_THAT(result.tied_checked, ElementsAre("lm_head.weight"));
  EXPECT_TRUE(at::equal(wte, source.wte.narrow(0, 6, 4)));
  EXPECT_TRUE(at::equal(w, source.w.narrow(1, 2, 2)));
  EXPECT_TRUE(at::equal(b, source.b));
}

// Hugging Face's unpadded vocabulary into a model that pads it: the embedding of 10 rows (and
// its tied head) into 12, laid out over two ranks (rows 6..11 here: 4 of the file's, then the
// 2 padding rows, zeros). A file that holds all 12 rows loads too; another count is named.
TEST(HfImportTest, AnUnpaddedVocabularyFillsThePaddedRowsWithZeros) {
  const std::string dir = NewTempDir("hf_unpadded");
  TinyModel source(6);
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& [name, tensor] : Weights(source)) {
    if (name != "lm_head.weight") tensors.emplace_back(name, tensor);  // HF omits a tied head
  }
  KEEL_ASSERT_OK(WriteSafetensorsFile(dir + "/model.safetensors", tensors, {}));
  torch::nn::Module part;
  const at::Tensor wte = part.register_parameter("wte", at::full({6, 4}, 7.0));
  part.register_parameter("proj_w", at::zeros({4, 4}));
  part.register_parameter("proj_b", at::zeros({4}));
  part.register_buffer("scale", at::zeros({1}, at::kDouble));
  part.register_module("lm_head", std::make_shared<TinyModel::Head>(wte));
  ModelStateOptions options;
  options.layouts = {{"wte", parallel::BlockLayout({12, 4}, {6, 0})},
                     {"lm_head.weight", parallel::BlockLayout({12, 4}, {6, 0})}};
  const std::map<std::string, int64_t> vocab = {{"wte", 10}, {"lm_head.weight", 10}};
  EXPECT_THAT(LoadHfSafetensors(dir, part, options),
              StatusIs(StatusCode::kFailedPrecondition,
                       HasSubstr("\"wte\": shape [10, 4] in the files, [12, 4] in the model")));
  KEEL_ASSERT_OK(LoadHfSafetensors(dir, part, options, {}, vocab));
  EXPECT_TRUE(at::equal(wte.narrow(0, 0, 4), source.wte.narrow(0, 6, 4)));
  EXPECT_TRUE(at::equal(wte.narrow(0, 4, 2), at::zeros({2, 4})));

  for (auto& [name, tensor] : tensors) {
    if (name == "wte") tensor = at::cat({tensor, at::ones({2, 4})});
  }
  KEEL_ASSERT_OK(WriteSafetensorsFile(dir + "/model.safetensors", tensors, {}));
  KEEL_ASSERT_OK(LoadHfSafetensors(dir, part, options, {}, vocab));
  EXPECT_TRUE(at::equal(wte.narrow(0, 4, 2), at::ones({2, 4})));
  for (auto& [name, tensor] : tensors) {
    if (name == "wte") tensor = tensor.narrow(0, 0, 11);
  }
  KEEL_ASSERT_OK(WriteSafetensorsFile(dir + "/model.safetensors", tensors, {}));
  EXPECT_THAT(LoadHfSafetensors(dir, part, options, {}, vocab),
              StatusIs(StatusCode::kFailedPrecondition,
                       HasSubstr("\"wte\": shape [11, 4] in the files, [12, 4] in the model")));
}

// A pipeline stage holding the projection only: the embedding and its tied head belong to
// another stage (held elsewhere), which they are left to; without saying so they are
// unexpected.
TEST(HfImportTest, APartOfAModelLeavesTheOtherPartsTensorsToThem) {
  const std::string dir = NewTempDir("hf_part");
  TinyModel source(7);
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& [name, tensor] : Weights(source)) tensors.emplace_back(name, tensor);
  KEEL_ASSERT_OK(WriteSafetensorsFile(dir + "/model.safetensors", tensors, {}));
  torch::nn::Module part;
  const at::Tensor w = part.register_parameter("proj_w", at::zeros({4, 4}));
  const at::Tensor b = part.register_parameter("proj_b", at::zeros({4}));
  part.register_buffer("scale", at::zeros({1}, at::kDouble));
  EXPECT_THAT(LoadHfSafetensors(dir, part),
              StatusIs(StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("2 problem(s)"), HasSubstr("unexpected tensor \"wte\""),
                             HasSubstr("unexpected tensor \"lm_head.weight\""))));
  EXPECT_TRUE(at::equal(w, at::zeros({4, 4})));
  KEEL_ASSERT_OK_AND_ASSIGN(HfImportResult result,
                            LoadHfSafetensors(dir, part, {}, {"wte", "lm_head.weight"}));
  EXPECT_EQ(result.num_tensors, 3);
  EXPECT_TRUE(result.tied_checked.empty());
  EXPECT_TRUE(at::equal(w, source.w));
  EXPECT_TRUE(at::equal(b, source.b));
}

TEST(HfImportTest, EveryMismatchIsNamedAndNothingIsCopied) {
  const std::string dir = NewTempDir("hf_mismatch");
  TinyModel source(5);
  std::vector<std::pair<std::string, at::Tensor>> tensors = {
      {"wte", source.wte},                   // fine
      {"proj_w", source.w.narrow(0, 0, 3)},  // shape
      {"scale", at::ones({1}, at::kLong)},   // dtype: the buffer is float64
      {"extra", at::zeros({2})},             // unexpected
  };                                         // "proj_b" missing
  KEEL_ASSERT_OK(WriteSafetensorsFile(dir + "/model.safetensors", tensors, {}));
  TinyModel target(6);
  const auto before = Weights(target);
  EXPECT_THAT(LoadHfSafetensors(dir, target),
              StatusIs(StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("4 problem(s)"),
                             HasSubstr("missing tensor \"proj_b\" (the model's is [4] Float)"),
                             HasSubstr("\"proj_w\": shape [3, 4] in the files, [4, 4] in the "
                                       "model"),
                             HasSubstr("\"scale\": dtype Long in the files, Double in the "
                                       "model (a floating dtype loads into any floating dtype)"),
                             HasSubstr("unexpected tensor \"extra\" ([2] Float)"))));
  for (const auto& [name, tensor] : Weights(target)) {
    EXPECT_TRUE(at::equal(tensor, before.at(name))) << name;
  }
}

// Most checkpoints on the Hub are bf16: they load into a float32 model (and a float32 file
// into a bf16 one) converted on the copy, the tied head checked after the same conversion.
TEST(HfImportTest, FloatingDtypesLoadConverted) {
  const std::string dir = NewTempDir("hf_bf16");
  TinyModel source(8);
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& [name, tensor] : Weights(source)) {
    tensors.emplace_back(name, name == "scale" ? tensor : tensor.to(at::kBFloat16));
  }
  KEEL_ASSERT_OK(WriteSafetensorsFile(dir + "/model.safetensors", tensors, {}));
  TinyModel target(9);
  KEEL_ASSERT_OK_AND_ASSIGN(HfImportResult result, LoadHfSafetensors(dir, target));
  EXPECT_THAT(result.tied_checked, ElementsAre("lm_head.weight"));
  EXPECT_EQ(target.wte.scalar_type(), at::kFloat);
  EXPECT_TRUE(at::equal(target.wte, source.wte.to(at::kBFloat16).to(at::kFloat)));
  EXPECT_TRUE(at::equal(target.w, source.w.to(at::kBFloat16).to(at::kFloat)));
}

// A tied head of another shape than what it is tied to (here a 0-d tensor, once a crash) is a
// mismatch like any other, named with what it is tied to.
TEST(HfImportTest, ATiedHeadOfAnotherShapeIsNamed) {
  const std::string dir = NewTempDir("hf_tied_shape");
  TinyModel source(10);
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& [name, tensor] : Weights(source)) {
    tensors.emplace_back(name, name == "lm_head.weight" ? at::zeros({}) : tensor);
  }
  KEEL_ASSERT_OK(WriteSafetensorsFile(dir + "/model.safetensors", tensors, {}));
  TinyModel target(11);
  EXPECT_THAT(LoadHfSafetensors(dir, target),
              StatusIs(StatusCode::kFailedPrecondition,
                       HasSubstr("\"lm_head.weight\" (tied to \"wte\"): shape [] in the files, "
                                 "[10, 4] in the model")));
}

// A tensor in two shards is refused naming both files (transformers refuses it too), whatever
// its shape in the second (a [2, 4] copy once loaded silently, clamped and zero-padded).
TEST(HfImportTest, ATensorInTwoFilesIsRefusedNamingBoth) {
  const std::string dir = NewTempDir("hf_duplicate");
  TinyModel source(12);
  KEEL_ASSERT_OK(WriteSafetensorsFile(dir + "/a.safetensors",
                                      {{"wte", source.wte}, {"proj_w", source.w}}, {}));
  KEEL_ASSERT_OK(WriteSafetensorsFile(dir + "/b.safetensors",
                                      {{"proj_b", source.b},
                                       {"scale", at::ones({1}, at::kDouble)},
                                       {"wte", source.wte.narrow(0, 0, 2)}},
                                      {}));
  keel::testing::WriteFileOrFail(
      dir + "/model.safetensors.index.json",
      R"({"weight_map": {"wte": "a.safetensors", "proj_w": "a.safetensors",
                                     "proj_b": "b.safetensors", "scale": "b.safetensors"}})");
  TinyModel target(13);
  const auto before = Weights(target);
  EXPECT_THAT(LoadHfSafetensors(dir, target),
              StatusIs(StatusCode::kDataLoss,
                       HasSubstr("tensor \"wte\" is in both " + dir + "/a.safetensors and " + dir +
                                 "/b.safetensors; a tensor may be in one file only")));
  EXPECT_TRUE(at::equal(target.wte, before.at("wte")));
}

// A directory holding both forms loads the single file, as transformers' from_pretrained does.
TEST(HfImportTest, TheSingleFileWinsOverAnIndex) {
  const std::string dir = NewTempDir("hf_both");
  TinyModel single(14), sharded(15);
  Export(sharded, dir + "/ckpt", dir + "/hf");
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& [name, tensor] : Weights(single)) tensors.emplace_back(name, tensor);
  KEEL_ASSERT_OK(WriteSafetensorsFile(dir + "/hf/model.safetensors", tensors, {}));
  TinyModel target(16);
  KEEL_ASSERT_OK_AND_ASSIGN(HfImportResult result, LoadHfSafetensors(dir + "/hf", target));
  EXPECT_THAT(result.files, ElementsAre(dir + "/hf/model.safetensors"));
  EXPECT_TRUE(at::equal(target.w, single.w));
}

// Names from the files are quoted as JSON strings (a newline as \n, nothing raw), cut after 200
// characters, and at most 20 problems are listed.
TEST(HfImportTest, NamesFromTheFilesAreQuotedAndTheListIsCut) {
  const std::string dir = NewTempDir("hf_names");
  TinyModel source(17);
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& [name, tensor] : Weights(source)) tensors.emplace_back(name, tensor);
  for (int i = 0; i < 29; ++i)
    tensors.emplace_back(absl::StrCat("x", i, "\n\x1b[2J"), at::zeros({1}));
  tensors.emplace_back(std::string(5000, 'y'), at::zeros({1}));
  KEEL_ASSERT_OK(WriteSafetensorsFile(dir + "/model.safetensors", tensors, {}));
  TinyModel target(18);
  const absl::Status status = LoadHfSafetensors(dir, target).status();
  EXPECT_THAT(status, StatusIs(StatusCode::kFailedPrecondition,
                               AllOf(HasSubstr("(30 problem(s))"), HasSubstr("; and 10 more"),
                                     HasSubstr("unexpected tensor \"x0\\n\\u001b[2J\""))));
  EXPECT_EQ(status.message().find('\n'), absl::string_view::npos);
  EXPECT_EQ(status.message().find('\x1b'), absl::string_view::npos);
  EXPECT_LT(status.message().size(), 3000u);
}

TEST(HfImportTest, MissingFilesAndBadIndexesAreNamed) {
  const std::string dir = NewTempDir("hf_files");
  TinyModel model(7);
  EXPECT_THAT(LoadHfSafetensors(dir + "/absent", model),
              StatusIs(StatusCode::kNotFound, HasSubstr("absent: no such directory")));
  EXPECT_THAT(LoadHfSafetensors(dir, model),
              StatusIs(StatusCode::kNotFound, HasSubstr("holds neither model.safetensors nor "
                                                        "model.safetensors.index.json")));
  keel::testing::WriteFileOrFail(dir + "/model.safetensors.index.json",
                                 R"({"weight_map": {"wte": "model-00001-of-00001.safetensors"}})");
  EXPECT_THAT(LoadHfSafetensors(dir, model),
              StatusIs(StatusCode::kNotFound,
                       HasSubstr("maps \"wte\" to " + dir +
                                 "/model-00001-of-00001.safetensors, which does not exist")));
  keel::testing::WriteFileOrFail(dir + "/model.safetensors.index.json", R"({"metadata": {}})");
  EXPECT_THAT(LoadHfSafetensors(dir, model),
              StatusIs(StatusCode::kDataLoss, HasSubstr("no \"weight_map\" object")));
  // A number past a double's range: nlohmann's exception for it once ended the process.
  keel::testing::WriteFileOrFail(dir + "/model.safetensors.index.json",
                                 R"({"metadata": {"total_size": 1e400}, "weight_map": {}})");
  EXPECT_THAT(
      LoadHfSafetensors(dir, model),
      StatusIs(StatusCode::kDataLoss, AllOf(HasSubstr(dir + "/model.safetensors.index.json"),
                                            HasSubstr("number overflow parsing '1e400'"))));
  KEEL_ASSERT_OK(WriteSafetensorsFile(dir + "/shard.safetensors", {{"wte", model.wte}}, {}));
  keel::testing::WriteFileOrFail(dir + "/model.safetensors.index.json",
                                 R"({"weight_map": {"proj_w": "shard.safetensors"}})");
  EXPECT_THAT(
      LoadHfSafetensors(dir, model),
      StatusIs(StatusCode::kDataLoss, HasSubstr("puts \"proj_w\" in " + dir +
                                                "/shard.safetensors, which does not hold it")));
}

}  // namespace
}  // namespace keel::checkpoint
