// peft's adapter format against Hugging Face peft itself: testdata/hf_parity/llama_gqa_untied_lora
// is an adapter that peft 0.21.2 saved (A and B random) with the logits PeftModel and
// merge_and_unload() computed on llama_gqa_untied (tools/scripts/hf_parity.py). Keel's Llama with
// adapters loaded from it, at one rank and at tp = 2, and the merged base computes them within
// 1e-5 of the logits' largest magnitude (as models/llama_hf_parity_test.cc: about 10 here).
#include "peft/peft_format.h"

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "base/json.h"
#include "checkpoint/hf_import.h"
#include "checkpoint/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/hf_config.h"
#include "models/registry.h"
#include "peft/lora_adapter.h"
#include "peft/module_matcher.h"
#include "testing/files.h"
#include "testing/ranks.h"
#include "testing/status_matchers.h"
#include "torch/utils.h"

ABSL_FLAG(std::string, fixtures, "testdata/hf_parity", "the fixtures' directory");

namespace keel::peft {
namespace {

using ::keel::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr double kTolerance = 1e-5;

std::string Fixture(const std::string& name) {
  return absl::StrCat(absl::GetFlag(FLAGS_fixtures), "/", name);
}
std::string Base() { return Fixture("llama_gqa_untied"); }
std::string Adapter() { return Fixture("llama_gqa_untied_lora"); }

std::map<std::string, at::Tensor> ReadTensors(const std::string& path) {
  std::map<std::string, at::Tensor> tensors;
  absl::StatusOr<std::vector<std::pair<std::string, at::Tensor>>> read =
      checkpoint::ReadSafetensorsFile(path);
  EXPECT_TRUE(read.ok()) << read.status();
  if (read.ok()) {
    for (auto& [name, tensor] : *read) tensors[name] = tensor;
  }
  return tensors;
}

std::map<std::string, at::Tensor> Expected() {
  return ReadTensors(Adapter() + "/expected.safetensors");
}

// What a logits tolerance is relative to: the largest magnitude, or 1.
double Scale(const at::Tensor& t) { return std::max(1.0, t.abs().max().item<double>()); }
double MaxDifference(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

// The fixture's base model on this rank of `groups`, its weights loaded.
absl::StatusOr<std::shared_ptr<models::LanguageModel>> BaseModel(
    const models::ModelGroups& groups) {
  KEEL_ASSIGN_OR_RETURN(const models::ModelOptions options, models::ReadHfConfig(Base()));
  std::shared_ptr<models::LanguageModel> model = models::BuildLanguageModel(options, groups);
  checkpoint::ModelStateOptions state;
  state.layouts = model->Layouts();
  std::map<std::string, int64_t> unpadded_rows;
  for (const std::string& name : model->VocabParameters()) unpadded_rows[name] = options.vocab_size;
  KEEL_RETURN_IF_ERROR(
      checkpoint::LoadHfSafetensors(Base(), *model, state, {}, unpadded_rows).status());
  return model;
}

// Adapters as `directory`'s adapter_config.json describes them, attached to `model` (A drawn
// from the default generator, as AttachLoraAdapters does), and LoadPeftAdapter's result.
absl::StatusOr<checkpoint::HfImportResult> AttachAndLoad(const std::string& directory,
                                                         models::LanguageModel& model) {
  KEEL_ASSIGN_OR_RETURN(const PeftLoraConfig config, ReadPeftConfig(directory));
  const LoraOptions options = LoraOptionsFromPeft(config);
  KEEL_ASSIGN_OR_RETURN(const std::vector<LinearModule> modules,
                        SelectLinearModules(model, options));
  KEEL_RETURN_IF_ERROR(AttachLoraAdapters(model, modules, options));
  return LoadPeftAdapter(directory, model, options);
}

// This rank's logits of the fixture's input_ids: [2, 17, padded vocabulary / tp].
at::Tensor Logits(models::LanguageModel& model) {
  at::NoGradGuard no_grad;
  model.eval();
  return model.Logits(model.StageForward(Expected()["input_ids"], {}, nullptr));
}

// A copy of the fixture adapter's directory, with adapter_config.json's `edit` applied.
std::string AdapterWithConfig(const std::string& name,
                              const std::function<void(base::Json&)>& edit) {
  const std::string dir = keel::testing::NewTempDir(name);
  absl::StatusOr<base::Json> config = base::ReadJsonFile(Adapter() + "/" + kPeftConfigName);
  EXPECT_TRUE(config.ok()) << config.status();
  edit(*config);
  keel::testing::WriteFileOrFail(dir + "/" + kPeftConfigName, config->dump(2));
  keel::testing::WriteFileOrFail(dir + "/" + kPeftWeightsName,
                                 keel::testing::ReadFileOrFail(Adapter() + "/" + kPeftWeightsName));
  return dir;
}

// A copy of the fixture adapter's directory whose tensors are `edit`'s of the fixture's.
std::string AdapterWithTensors(
    const std::string& name, const std::function<void(std::map<std::string, at::Tensor>&)>& edit) {
  const std::string dir = AdapterWithConfig(name, [](base::Json&) {});
  std::map<std::string, at::Tensor> tensors = ReadTensors(Adapter() + "/" + kPeftWeightsName);
  edit(tensors);
  const std::string path = dir + "/" + kPeftWeightsName;
  EXPECT_TRUE(base::RemoveTree(path).ok());
  KEEL_EXPECT_OK(checkpoint::WriteSafetensorsFile(path, {tensors.begin(), tensors.end()}, {}));
  return dir;
}

TEST(PeftFormatTest, NamesMapBothWays) {
  KEEL_ASSERT_OK_AND_ASSIGN(const std::string a,
                            PeftKey("model.layers.0.self_attn.q_proj.adapter.lora_A"));
  EXPECT_EQ(a, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
  KEEL_ASSERT_OK_AND_ASSIGN(const std::string b, PeftKey("lm_head.adapter.lora_B"));
  EXPECT_EQ(b, "base_model.model.lm_head.lora_B.weight");
  for (const std::string& parameter :
       {std::string("model.layers.0.self_attn.q_proj.adapter.lora_A"),
        std::string("h.0.mlp.fc.adapter.lora_B")}) {
    KEEL_ASSERT_OK_AND_ASSIGN(const std::string key, PeftKey(parameter));
    KEEL_ASSERT_OK_AND_ASSIGN(const std::string back, AdapterParameter(key));
    EXPECT_EQ(back, parameter);
  }
  for (const char* bad : {"lm_head.weight", ".adapter.lora_A", "lm_head.adapter.lora_C"}) {
    EXPECT_THAT(PeftKey(bad),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr(bad), HasSubstr("<module>.adapter.lora_A"))));
  }
  for (const char* bad : {"model.q_proj.lora_A.weight", "base_model.model.q_proj.lora_A.bias",
                          "base_model.model..lora_B.weight"}) {
    EXPECT_THAT(AdapterParameter(bad),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr(bad), HasSubstr("base_model.model.<module>.lora_A"))));
  }
}

// What Keel writes reads back; peft's own file (the fixture) reads as peft wrote it.
TEST(PeftFormatTest, ConfigRoundTripsAndPeftsFileReads) {
  const std::string dir = keel::testing::NewTempDir("round_trip");
  std::map<std::string, at::Tensor> adapter = {
      {"base_model.model.model.layers.0.mlp.down_proj.lora_A.weight", at::ones({2, 6})},
      {"base_model.model.model.layers.0.mlp.down_proj.lora_B.weight", at::ones({4, 2})},
      {"base_model.model.lm_head.lora_A.weight", at::ones({2, 4})},
      {"base_model.model.lm_head.lora_B.weight", at::ones({9, 2})}};
  PeftWriteOptions options;
  options.lora_alpha = 16;
  options.lora_dropout = 0.1;
  options.base_model_name_or_path = "meta-llama/Llama-3.2-1B";
  options.dtype = at::kBFloat16;
  KEEL_ASSERT_OK_AND_ASSIGN(const PeftLoraConfig written, WritePeftAdapter(adapter, dir, options));
  EXPECT_EQ(written.r, 2);
  EXPECT_THAT(written.target_modules, ElementsAre("lm_head", "model.layers.0.mlp.down_proj"));
  KEEL_ASSERT_OK_AND_ASSIGN(const PeftLoraConfig read, ReadPeftConfig(dir));
  EXPECT_EQ(read.r, 2);
  EXPECT_EQ(read.lora_alpha, 16);
  EXPECT_EQ(read.lora_dropout, 0.1);
  EXPECT_EQ(read.target_modules, written.target_modules);
  EXPECT_EQ(read.base_model_name_or_path, "meta-llama/Llama-3.2-1B");
  KEEL_ASSERT_OK_AND_ASSIGN(const base::Json json, base::ReadJsonFile(dir + "/" + kPeftConfigName));
  EXPECT_EQ(json["peft_type"], "LORA");
  EXPECT_EQ(json["task_type"], "CAUSAL_LM");
  EXPECT_EQ(json["bias"], "none");
  EXPECT_EQ(json["use_rslora"], false);
  EXPECT_TRUE(json["lora_alpha"].is_number_integer());  // peft's LoraConfig types it int
  const std::map<std::string, at::Tensor> tensors = ReadTensors(dir + "/" + kPeftWeightsName);
  ASSERT_EQ(tensors.size(), 4u);
  EXPECT_EQ(tensors.at("base_model.model.lm_head.lora_B.weight").scalar_type(), at::kBFloat16);
  EXPECT_THAT(WritePeftAdapter(adapter, dir, options),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr(kPeftWeightsName)));

  KEEL_ASSERT_OK_AND_ASSIGN(const PeftLoraConfig fixture, ReadPeftConfig(Adapter()));
  EXPECT_EQ(fixture.r, 4);
  EXPECT_EQ(fixture.lora_alpha, 8);
  EXPECT_EQ(fixture.lora_dropout, 0.05);
  EXPECT_THAT(fixture.target_modules, ElementsAre("down_proj", "q_proj", "v_proj"));
  const LoraOptions lora = LoraOptionsFromPeft(fixture);
  EXPECT_EQ(lora.dim, 4);
  EXPECT_EQ(lora.alpha, 8);
  EXPECT_EQ(lora.dropout, 0.05);
  EXPECT_EQ(lora.dropout_position, DropoutPosition::kPre);
}

// peft's rule: a listed name is the module's full name or the part after one of its '.'.
TEST(PeftFormatTest, TargetModulesSelectWhatPeftSelects) {
  PeftLoraConfig config;
  config.r = 1;
  config.lora_alpha = 1;
  config.target_modules = {"q_proj", "layers.1.mlp.down_proj", "model.layers.0.self_attn.v_proj"};
  const LoraOptions options = LoraOptionsFromPeft(config);
  const auto selects = [&](const std::string& name) {
    for (const std::string& pattern : options.target_modules) {
      absl::StatusOr<bool> match = PatternMatches(pattern, name);
      EXPECT_TRUE(match.ok()) << match.status();
      if (match.ok() && *match) return true;
    }
    return false;
  };
  EXPECT_TRUE(selects("q_proj"));
  EXPECT_TRUE(selects("model.layers.0.self_attn.q_proj"));
  EXPECT_TRUE(selects("model.layers.1.mlp.down_proj"));
  EXPECT_TRUE(selects("model.layers.0.self_attn.v_proj"));
  EXPECT_FALSE(selects("model.layers.0.self_attn.kq_proj"));
  EXPECT_FALSE(selects("model.layers.0.mlp.down_proj"));
  EXPECT_FALSE(selects("model.layers.1.self_attn.v_proj"));
  EXPECT_FALSE(selects("model.layers.11.mlp.down_proj"));
}

TEST(PeftFormatTest, RefusesConfigsKeelCannotRepresent) {
  struct Case {
    std::string key;
    std::string value;  // JSON; empty: the key removed
  };
  const std::vector<Case> cases = {
      {"peft_type", R"("LOHA")"},
      {"task_type", R"("SEQ_CLS")"},
      {"bias", R"("all")"},
      {"use_rslora", "true"},
      {"use_dora", "true"},
      {"fan_in_fan_out", "true"},
      {"lora_bias", "true"},
      {"modules_to_save", R"(["lm_head"])"},
      {"exclude_modules", R"(["q_proj"])"},
      {"rank_pattern", R"({"q_proj":8})"},
      {"alpha_pattern", R"({"q_proj":2})"},
      {"layers_to_transform", "[0]"},
      {"layers_pattern", R"("layers")"},
      {"target_parameters", R"(["w"])"},
      {"trainable_token_indices", "[1]"},
      {"layer_replication", "[[0,1]]"},
      {"r", "0"},
      {"r", "2.5"},
      {"r", ""},
      {"lora_alpha", "0"},
      {"lora_alpha", R"("8")"},
      {"lora_dropout", "1"},
      {"target_modules", R"(".*_proj")"},
      {"target_modules", "[]"},
      {"target_modules", ""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat(c.key, "=", c.value));
    const std::string dir = AdapterWithConfig("refused", [&](base::Json& config) {
      if (c.value.empty()) {
        config.erase(c.key);
      } else {
        config[c.key] = *base::ParseJson(c.value);
      }
    });
    EXPECT_THAT(ReadPeftConfig(dir),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr(kPeftConfigName), HasSubstr(c.key),
                               HasSubstr(c.value.empty() ? "missing" : c.value),
                               ::testing::AnyOf(HasSubstr("allowed"), HasSubstr("only")))));
  }
  EXPECT_THAT(ReadPeftConfig(keel::testing::NewTempDir("empty")),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(kPeftConfigName)));
  // A number past a double's range: nlohmann's exception for it once ended the process.
  const std::string overflow = keel::testing::NewTempDir("overflow");
  keel::testing::WriteFileOrFail(overflow + "/" + kPeftConfigName,
                                 R"({"peft_type": "LORA", "r": 4, "lora_alpha": 1e400})");
  EXPECT_THAT(ReadPeftConfig(overflow),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(overflow + "/" + kPeftConfigName),
                             HasSubstr("number overflow parsing '1e400'"))));
}

// An r that the tensors do not have is named from the file's header, before any adapter of that
// r is allocated: with r = 2^40 the allocation itself once failed first, naming only r.
TEST(PeftFormatTest, RefusesAConfigWhoseRIsNotTheTensors) {
  const std::string down_a = "base_model.model.model.layers.1.mlp.down_proj.lora_A.weight";
  const std::string down_b = "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight";
  for (const int64_t r : {int64_t{2}, int64_t{1} << 40}) {
    SCOPED_TRACE(r);
    const std::string dir = AdapterWithConfig(absl::StrCat("other_r_", r),
                                              [&](base::Json& config) { config["r"] = r; });
    // The fixture's r is 4; its tensors come in header order, the first an A or a B.
    EXPECT_THAT(
        ReadPeftConfig(dir),
        StatusIs(absl::StatusCode::kFailedPrecondition,
                 AllOf(HasSubstr(dir + "/" + kPeftWeightsName),
                       HasSubstr(absl::StrCat("the r ", r, " of ", dir, "/", kPeftConfigName)),
                       AnyOf(HasSubstr("[4, "), HasSubstr(", 4]")),
                       HasSubstr("the config is not the adapter's"))));
  }
  // One tensor off: B of rank 3, A of rank 4, the config's 4.
  const std::string b_off = AdapterWithTensors(
      "b_of_rank_3", [&](auto& t) { t[down_b] = t[down_b].narrow(1, 0, 3).contiguous(); });
  EXPECT_THAT(ReadPeftConfig(b_off), StatusIs(absl::StatusCode::kFailedPrecondition,
                                              AllOf(HasSubstr(down_b), HasSubstr("[64, 3]"),
                                                    HasSubstr("needs [out, 4]"))));
  const std::string flat =
      AdapterWithTensors("flat_a", [&](auto& t) { t[down_a] = t[down_a].flatten().contiguous(); });
  EXPECT_THAT(ReadPeftConfig(flat),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr(down_a), HasSubstr("[384]"), HasSubstr("needs [4, in]"))));
}

TEST(PeftFormatTest, RefusesAdaptersThatAreNotPairsOfOneRank) {
  const std::string dir = keel::testing::NewTempDir("refused_write");
  const std::string a = "base_model.model.lm_head.lora_A.weight";
  const std::string b = "base_model.model.lm_head.lora_B.weight";
  EXPECT_THAT(WritePeftAdapter({{a, at::ones({2, 4})}}, dir, {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("\"lm_head\" has lora_A without lora_B")));
  EXPECT_THAT(WritePeftAdapter({{a, at::ones({2, 4})}, {b, at::ones({9, 3})}}, dir, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("[9, 3]")));
  EXPECT_THAT(WritePeftAdapter({{"lm_head.weight", at::ones({2, 4})}}, dir, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("lm_head.weight")));
  EXPECT_THAT(WritePeftAdapter({}, dir, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no LoRA")));
  EXPECT_FALSE(base::PathExists(dir + "/" + kPeftConfigName));
}

// The adapter peft made evaluates in Keel as in peft.
TEST(PeftFormatTest, PeftsAdapterComputesPeftsLogits) {
  at::set_num_threads(1);
  torch::manual_seed(0);
  KEEL_ASSERT_OK_AND_ASSIGN(const std::shared_ptr<models::LanguageModel> model, BaseModel({}));
  KEEL_ASSERT_OK_AND_ASSIGN(const checkpoint::HfImportResult loaded,
                            AttachAndLoad(Adapter(), *model));
  EXPECT_EQ(loaded.num_tensors, 12);  // q, v and down of 2 layers, A and B
  const at::Tensor expected = Expected()["logits"];
  EXPECT_LE(MaxDifference(Logits(*model).narrow(-1, 0, expected.size(-1)), expected),
            kTolerance * Scale(expected));
}

// At tp = 2 each rank loads its blocks (q and v: B split by rows; down: A split by columns)
// and the gathered logits are peft's.
TEST(PeftFormatTest, PeftsAdapterComputesPeftsLogitsAtTensorParallelism2) {
  at::set_num_threads(1);
  std::vector<at::Tensor> slices(2);
  std::mutex generator;  // ranks are threads sharing the default generator
  KEEL_ASSERT_OK(keel::testing::RunOnRanks(2, [&](keel::testing::Rank& r) -> absl::Status {
    std::shared_ptr<models::LanguageModel> model;
    {
      std::lock_guard<std::mutex> lock(generator);
      KEEL_ASSIGN_OR_RETURN(model, BaseModel(models::ModelGroups{r.group.get()}));
      KEEL_RETURN_IF_ERROR(AttachAndLoad(Adapter(), *model).status());
    }
    slices[r.rank] = Logits(*model);
    return absl::OkStatus();
  }));
  const at::Tensor expected = Expected()["logits"];
  const at::Tensor logits = at::cat(slices, -1).narrow(-1, 0, expected.size(-1));
  EXPECT_LE(MaxDifference(logits, expected), kTolerance * Scale(expected));
}

TEST(PeftFormatTest, LoadRefusesFilesThatDoNotFitTheAdapters) {
  torch::manual_seed(0);
  const std::string down_a = "base_model.model.model.layers.1.mlp.down_proj.lora_A.weight";
  struct Case {
    std::string name;
    std::string dir;
    absl::StatusCode code;
    std::vector<std::string> message;
  };
  const std::vector<Case> cases = {
      {"mis-shaped",
       AdapterWithTensors("mis_shaped",
                          [&](auto& t) { t[down_a] = t[down_a].narrow(1, 0, 95).contiguous(); }),
       absl::StatusCode::kFailedPrecondition,
       {down_a, "[4, 95] in the files, [4, 96] in the model"}},
      {"missing",
       AdapterWithTensors("missing", [&](auto& t) { t.erase(down_a); }),
       absl::StatusCode::kFailedPrecondition,
       {"missing tensor", down_a}},
      {"unexpected",
       AdapterWithTensors("unexpected",
                          [&](auto& t) {
                            t["base_model.model.model.layers.1.mlp.up_proj.lora_A.weight"] =
                                t[down_a];
                          }),
       absl::StatusCode::kFailedPrecondition,
       {"unexpected tensor", "up_proj.lora_A.weight"}},
      {"no file",
       AdapterWithTensors("no_file", [&](auto&) {}),
       absl::StatusCode::kNotFound,
       {"adapter_model.safetensors"}},
  };
  ASSERT_TRUE(base::RemoveTree(cases.back().dir + "/" + kPeftWeightsName).ok());
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    KEEL_ASSERT_OK_AND_ASSIGN(const std::shared_ptr<models::LanguageModel> model, BaseModel({}));
    absl::StatusOr<checkpoint::HfImportResult> loaded = AttachAndLoad(c.dir, *model);
    for (const std::string& part : c.message) {
      EXPECT_THAT(loaded, StatusIs(c.code, HasSubstr(part)));
    }
  }
  // Adapters built with other options than the file's.
  KEEL_ASSERT_OK_AND_ASSIGN(const std::shared_ptr<models::LanguageModel> model, BaseModel({}));
  KEEL_ASSERT_OK_AND_ASSIGN(const PeftLoraConfig config, ReadPeftConfig(Adapter()));
  LoraOptions options = LoraOptionsFromPeft(config);
  options.alpha = 16;
  KEEL_ASSERT_OK_AND_ASSIGN(const auto modules, SelectLinearModules(*model, options));
  KEEL_ASSERT_OK(AttachLoraAdapters(*model, modules, options));
  EXPECT_THAT(LoadPeftAdapter(Adapter(), *model, options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("peft.alpha 16"), HasSubstr("lora_alpha 8"))));
}

// W + (lora_alpha / r) B A computes the adapted model's logits, and peft's merge_and_unload's.
TEST(PeftFormatTest, MergeComputesTheAdaptedModelsLogits) {
  at::set_num_threads(1);
  torch::manual_seed(0);
  KEEL_ASSERT_OK_AND_ASSIGN(const std::shared_ptr<models::LanguageModel> adapted, BaseModel({}));
  KEEL_ASSERT_OK(AttachAndLoad(Adapter(), *adapted).status());
  const at::Tensor expected = Expected()["merged_logits"];
  const int64_t vocab = expected.size(-1);
  const at::Tensor adapted_logits = Logits(*adapted).narrow(-1, 0, vocab);

  KEEL_ASSERT_OK_AND_ASSIGN(const std::shared_ptr<models::LanguageModel> merged, BaseModel({}));
  std::map<std::string, at::Tensor> weights;
  for (const auto& item : merged->named_parameters()) weights[item.key()] = item.value().detach();
  const std::map<std::string, at::Tensor> adapter = ReadTensors(Adapter() + "/" + kPeftWeightsName);
  std::map<std::string, at::Tensor> before = weights;
  KEEL_ASSERT_OK(MergePeftAdapter(adapter, /*lora_alpha=*/8, weights));
  int64_t changed = 0;
  {
    at::NoGradGuard no_grad;
    for (const auto& item : merged->named_parameters()) {
      changed += !at::equal(weights[item.key()], before[item.key()]);
      item.value().copy_(weights[item.key()]);
    }
  }
  EXPECT_EQ(changed, 6);  // q, v and down of 2 layers
  const at::Tensor merged_logits = Logits(*merged).narrow(-1, 0, vocab);
  EXPECT_LE(MaxDifference(merged_logits, expected), kTolerance * Scale(expected));
  EXPECT_LE(MaxDifference(merged_logits, adapted_logits), kTolerance * Scale(expected));

  weights.erase("model.layers.1.mlp.down_proj.weight");
  before = weights;
  EXPECT_THAT(MergePeftAdapter(adapter, 8, weights),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("model.layers.1.mlp.down_proj.weight"),
                             HasSubstr("[64, 96]"), HasSubstr("missing"))));
  for (const auto& [name, tensor] : before) EXPECT_TRUE(at::equal(weights[name], tensor)) << name;
}

}  // namespace
}  // namespace keel::peft
