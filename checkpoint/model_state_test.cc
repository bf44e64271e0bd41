#include "checkpoint/model_state.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "absl/status/status.h"
#include "checkpoint/state_dict.h"
#include "checkpoint/stateful_conformance_testutil.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "parallel/layout.h"
#include "testing/status_matchers.h"
#include "torch/nn/module.h"
#include "torch/nn/modules/embedding.h"
#include "torch/nn/modules/linear.h"

namespace keel::checkpoint {
namespace {

using ::absl::StatusCode;
using ::keel::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using testing::StatefulConformanceTest;

// A module holding one given tensor as its "weight" (a tied lm_head, or a plain one).
struct HeadImpl : torch::nn::Module {
  explicit HeadImpl(const at::Tensor& w) { weight = register_parameter("weight", w); }
  at::Tensor weight;
};

struct BodyImpl : torch::nn::Module {
  BodyImpl() {
    embed_tokens = register_module("embed_tokens", torch::nn::Embedding(10, 4));
    proj = register_module("proj", torch::nn::Linear(4, 4));
    running = register_buffer("running", at::zeros({3}));
  }
  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::Linear proj{nullptr};
  at::Tensor running;
};

// Laid out like a Hugging Face causal LM: "model.*" plus a top-level "lm_head.weight".
struct TinyLm : torch::nn::Module {
  explicit TinyLm(bool tie) {
    model = register_module("model", std::make_shared<BodyImpl>());
    lm_head = register_module(
        "lm_head", std::make_shared<HeadImpl>(tie ? model->embed_tokens->weight
                                                  : at::zeros({10, 4}).set_requires_grad(true)));
  }
  std::shared_ptr<BodyImpl> model;
  std::shared_ptr<HeadImpl> lm_head;
};

// Sets every parameter and buffer to distinct values derived from `base`, so two models
// filled with different bases differ everywhere.
void Fill(torch::nn::Module& module, double base) {
  at::NoGradGuard no_grad;
  double offset = base;
  for (auto& item : module.named_parameters()) {
    at::Tensor& t = item.value();
    t.copy_(at::arange(t.numel(), t.options()).reshape(t.sizes()) * 0.25 + offset);
    offset += 100;
  }
  for (auto& item : module.named_buffers()) {
    at::Tensor& t = item.value();
    t.copy_(at::arange(t.numel(), t.options()).reshape(t.sizes()) - offset);
    offset += 100;
  }
}

std::vector<std::string> Keys(const State& state) {
  std::vector<std::string> keys;
  for (const auto& [key, ref] : state.tensors) keys.push_back(key);
  return keys;
}

// Whether every parameter and buffer of `a` equals `b`'s of the same name.
void ExpectSameTensors(torch::nn::Module& a, torch::nn::Module& b) {
  auto b_params = b.named_parameters();
  for (const auto& item : a.named_parameters()) {
    SCOPED_TRACE(item.key());
    ASSERT_NE(b_params.find(item.key()), nullptr);
    EXPECT_TRUE(at::equal(item.value(), b_params[item.key()]));
  }
  auto b_buffers = b.named_buffers();
  for (const auto& item : a.named_buffers()) {
    SCOPED_TRACE(item.key());
    ASSERT_NE(b_buffers.find(item.key()), nullptr);
    EXPECT_TRUE(at::equal(item.value(), b_buffers[item.key()]));
  }
}

absl::StatusOr<LoadReport> Load(ModelState& target, const State& saved, bool strict = true) {
  return testing::LoadInMemory({{"model", &target}}, {{"model", saved}}, strict);
}

// ModelState over a tied or untied TinyLm, filled from its variant.
class ModelStateUnderTest : public testing::StatefulUnderTest {
 public:
  ModelStateUnderTest(bool tie, int variant) : lm_(tie), state_(lm_) { Fill(lm_, variant * 1000); }
  Stateful& stateful() override { return state_; }

 private:
  TinyLm lm_;
  ModelState state_;
};

INSTANTIATE_TEST_SUITE_P(
    ModelState, StatefulConformanceTest,
    ::testing::Values(testing::StatefulCase{"tied_lm_head",
                                            [](int variant) {
                                              return std::make_unique<ModelStateUnderTest>(true,
                                                                                           variant);
                                            }},
                      testing::StatefulCase{"untied_lm_head",
                                            [](int variant) {
                                              return std::make_unique<ModelStateUnderTest>(false,
                                                                                           variant);
                                            }}),
    testing::StatefulCaseName);

TEST(OuterPrefixTest, DropRemovesOnlyTheLeadingOccurrence) {
  EXPECT_THAT(DropOuterPrefix({"model.model.x", "model.y", "lm_head.weight", "xmodel.z", "model."},
                              "model."),
              ElementsAre("model.x", "y", "lm_head.weight", "xmodel.z", ""));
}

TEST(OuterPrefixTest, AddSkipsPrefixedAndSkippedKeys) {
  EXPECT_THAT(
      AddOuterPrefix({"x", "model.y", "lm_head.weight", "a.model.b"}, "model.", {"lm_head.weight"}),
      ElementsAre("model.x", "model.y", "lm_head.weight", "model.a.model.b"));
  EXPECT_THAT(AddOuterPrefix({"base_model.model.x", "y"}, kPeftPrefix),
              ElementsAre("base_model.model.x", "base_model.model.y"));
  EXPECT_THAT(AddOuterPrefix({}, "model."), IsEmpty());
}

TEST(ModelStateTest, SavesParametersAndBuffersByQualifiedName) {
  TinyLm lm(/*tie=*/false);
  Fill(lm, 1);
  ModelState state(lm);
  KEEL_ASSERT_OK_AND_ASSIGN(State saved, state.StateDict());
  EXPECT_THAT(Keys(saved), ElementsAre("lm_head.weight", "model.embed_tokens.weight",
                                       "model.proj.bias", "model.proj.weight", "model.running"));
  EXPECT_TRUE(saved.values.empty());
  // The saved tensors alias the live ones and carry no layout.
  EXPECT_TRUE(saved.tensors["model.proj.weight"].tensor.is_alias_of(lm.model->proj->weight));
  EXPECT_FALSE(saved.tensors["model.proj.weight"].layout.has_value());
}

TEST(ModelStateTest, RoundTripIntoAFreshModelCopiesInPlace) {
  TinyLm source(/*tie=*/false);
  Fill(source, 1);
  KEEL_ASSERT_OK_AND_ASSIGN(State saved, ModelState(source).StateDict());

  TinyLm fresh(/*tie=*/false);
  Fill(fresh, -7);
  void* const proj_storage = fresh.model->proj->weight.data_ptr();
  ModelState target(fresh);
  KEEL_ASSERT_OK_AND_ASSIGN(LoadReport report, Load(target, saved));
  EXPECT_TRUE(report.clean()) << report.ToString();
  ExpectSameTensors(source, fresh);
  EXPECT_EQ(fresh.model->proj->weight.data_ptr(), proj_storage);
}

// Tying is by tensor, not by name: any parameter registered again under a later name is
// saved once, under its first name, whatever the names; TiedKeys maps the later one to it.
TEST(ModelStateTest, AnyParameterRegisteredTwiceIsSavedOnceUnderItsFirstName) {
  struct Twice : torch::nn::Module {
    Twice() {
      encoder = register_module("encoder", std::make_shared<HeadImpl>(at::ones({3, 2})));
      decoder = register_module("decoder", std::make_shared<HeadImpl>(encoder->weight));
    }
    std::shared_ptr<HeadImpl> encoder, decoder;
  } model;
  ModelState state(model);
  KEEL_ASSERT_OK_AND_ASSIGN(State saved, state.StateDict());
  EXPECT_THAT(Keys(saved), ElementsAre("encoder.weight"));
  EXPECT_THAT(state.TiedKeys(), ElementsAre(std::pair<const std::string, std::string>(
                                    "decoder.weight", "encoder.weight")));
}

TEST(ModelStateTest, TiedLmHeadIsNotSavedAndStaysTiedAfterLoad) {
  TinyLm source(/*tie=*/true);
  Fill(source, 1);
  ASSERT_TRUE(source.lm_head->weight.is_alias_of(source.model->embed_tokens->weight));
  KEEL_ASSERT_OK_AND_ASSIGN(State saved, ModelState(source).StateDict());
  EXPECT_THAT(Keys(saved), ElementsAre("model.embed_tokens.weight", "model.proj.bias",
                                       "model.proj.weight", "model.running"));

  TinyLm fresh(/*tie=*/true);
  Fill(fresh, -7);
  ModelState target(fresh);
  KEEL_ASSERT_OK_AND_ASSIGN(LoadReport report, Load(target, saved));
  EXPECT_TRUE(report.clean()) << report.ToString();
  EXPECT_TRUE(fresh.lm_head->weight.is_alias_of(fresh.model->embed_tokens->weight));
  EXPECT_TRUE(at::equal(fresh.lm_head->weight, source.model->embed_tokens->weight));
  ExpectSameTensors(source, fresh);
}

TEST(ModelStateTest, UntiedLmHeadIsSaved) {
  TinyLm lm(/*tie=*/false);
  KEEL_ASSERT_OK_AND_ASSIGN(State saved, ModelState(lm).StateDict());
  EXPECT_EQ(saved.tensors.count("lm_head.weight"), 1);
}

// PEFT: frozen base weights plus a trainable adapter.
struct PeftLm : TinyLm {
  PeftLm() : TinyLm(/*tie=*/true) {
    lora = register_module("lora", std::make_shared<HeadImpl>(at::zeros({2, 4})));
    for (auto& item : named_parameters()) {
      item.value().set_requires_grad(item.key() == "lora.weight" ||
                                     item.key() == "model.proj.bias");
    }
  }
  std::shared_ptr<HeadImpl> lora;
};

TEST(ModelStateTest, PeftSavesOnlyTrainableParametersUnderThePeftPrefix) {
  PeftLm source;
  Fill(source, 1);
  ModelStateOptions options;
  options.is_peft = true;
  KEEL_ASSERT_OK_AND_ASSIGN(State saved, ModelState(source, options).StateDict());
  EXPECT_THAT(Keys(saved),
              ElementsAre("base_model.model.lora.weight", "base_model.model.model.proj.bias"));

  PeftLm fresh;
  Fill(fresh, -7);
  const at::Tensor frozen_before = fresh.model->proj->weight.clone();
  ModelState target(fresh, options);
  KEEL_ASSERT_OK_AND_ASSIGN(LoadReport report, Load(target, saved));
  EXPECT_TRUE(report.clean()) << report.ToString();
  EXPECT_TRUE(at::equal(fresh.lora->weight, source.lora->weight));
  EXPECT_TRUE(at::equal(fresh.model->proj->bias, source.model->proj->bias));
  // Frozen parameters keep their own values.
  EXPECT_TRUE(at::equal(fresh.model->proj->weight, frozen_before));
  EXPECT_FALSE(at::equal(fresh.model->proj->weight, source.model->proj->weight));
}

TEST(ModelStateTest, PeftReportsAMissingTrainableParameter) {
  PeftLm source;
  ModelStateOptions options;
  options.is_peft = true;
  KEEL_ASSERT_OK_AND_ASSIGN(State saved, ModelState(source, options).StateDict());
  saved.tensors.erase("base_model.model.lora.weight");
  PeftLm fresh;
  ModelState target(fresh, options);
  EXPECT_THAT(Load(target, saved), StatusIs(StatusCode::kInvalidArgument,
                                            HasSubstr("model/base_model.model.lora.weight")));
}

TEST(ModelStateTest, SafetensorsDropsTheOuterModelPrefixAndAddsItBack) {
  TinyLm source(/*tie=*/false);
  Fill(source, 1);
  ModelStateOptions options;
  options.model_save_format = SerializationFormat::kSafetensors;
  KEEL_ASSERT_OK_AND_ASSIGN(State saved, ModelState(source, options).StateDict());
  EXPECT_THAT(Keys(saved), ElementsAre("embed_tokens.weight", "lm_head.weight", "proj.bias",
                                       "proj.weight", "running"));

  TinyLm fresh(/*tie=*/false);
  Fill(fresh, -7);
  ModelState target(fresh, options);
  KEEL_ASSERT_OK_AND_ASSIGN(LoadReport report, Load(target, saved));
  EXPECT_TRUE(report.clean()) << report.ToString();
  ExpectSameTensors(source, fresh);
}

TEST(ModelStateTest, SafetensorsWithPeftKeepsThePeftLayout) {
  PeftLm source;
  ModelStateOptions options;
  options.model_save_format = SerializationFormat::kSafetensors;
  options.is_peft = true;
  KEEL_ASSERT_OK_AND_ASSIGN(State saved, ModelState(source, options).StateDict());
  EXPECT_THAT(Keys(saved),
              ElementsAre("base_model.model.lora.weight", "base_model.model.model.proj.bias"));
}

// "model.model.weight" is saved as "model.weight" and must come back to the same tensor.
struct NestedModel : torch::nn::Module {
  NestedModel() {
    auto inner = std::make_shared<torch::nn::Module>();
    head = inner->register_module("model", std::make_shared<HeadImpl>(at::zeros({2, 2})));
    register_module("model", inner);
  }
  std::shared_ptr<HeadImpl> head;
};

TEST(ModelStateTest, SafetensorsRoundTripsARepeatedModelPrefix) {
  NestedModel source;
  Fill(source, 1);
  ModelStateOptions options;
  options.model_save_format = SerializationFormat::kSafetensors;
  KEEL_ASSERT_OK_AND_ASSIGN(State saved, ModelState(source, options).StateDict());
  EXPECT_THAT(Keys(saved), ElementsAre("model.weight"));
  NestedModel fresh;
  ModelState target(fresh, options);
  KEEL_ASSERT_OK_AND_ASSIGN(LoadReport report, Load(target, saved));
  EXPECT_TRUE(report.clean()) << report.ToString();
  EXPECT_TRUE(at::equal(fresh.head->weight, source.head->weight));
}

TEST(ModelStateTest, SafetensorsRejectsTwoNamesWithTheSameKey) {
  torch::nn::Module root;
  auto inner = std::make_shared<torch::nn::Module>();
  inner->register_parameter("x", at::zeros({1}));
  root.register_module("model", inner);
  root.register_parameter("x", at::zeros({1}));
  ModelStateOptions options;
  options.model_save_format = SerializationFormat::kSafetensors;
  EXPECT_THAT(ModelState(root, options).StateDict(),
              StatusIs(StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("'x'"), HasSubstr("'model.x'"), HasSubstr("safetensors"))));
}

TEST(ModelStateTest, StrictLoadListsMissingAndUnexpectedKeys) {
  TinyLm source(/*tie=*/false);
  KEEL_ASSERT_OK_AND_ASSIGN(State saved, ModelState(source).StateDict());
  saved.tensors.erase("model.proj.bias");
  saved.tensors["model.extra"] = TensorRef{at::zeros({2})};
  TinyLm fresh(/*tie=*/false);
  ModelState target(fresh);
  EXPECT_THAT(Load(target, saved),
              StatusIs(StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("model/model.proj.bias"), HasSubstr("model/model.extra"))));

  KEEL_ASSERT_OK_AND_ASSIGN(LoadReport report, Load(target, saved, /*strict=*/false));
  EXPECT_THAT(report.missing_keys, ElementsAre("model/model.proj.bias"));
  EXPECT_THAT(report.unexpected_keys, ElementsAre("model/model.extra"));
}

TEST(ModelStateTest, ShapeAndDtypeMismatchesNameTheTensorAndBothValues) {
  TinyLm source(/*tie=*/false);
  KEEL_ASSERT_OK_AND_ASSIGN(State saved, ModelState(source).StateDict());
  saved.tensors["model.proj.weight"] = TensorRef{at::zeros({3, 4})};
  saved.tensors["model.proj.bias"] = TensorRef{at::zeros({4}, at::kDouble)};
  TinyLm fresh(/*tie=*/false);
  Fill(fresh, -7);
  const at::Tensor weight_before = fresh.model->proj->weight.clone();
  ModelState target(fresh);
  EXPECT_THAT(
      Load(target, saved),
      StatusIs(StatusCode::kInvalidArgument,
               AllOf(HasSubstr("model/model.proj.weight"), HasSubstr("[3, 4]"), HasSubstr("[4, 4]"),
                     HasSubstr("model/model.proj.bias"), HasSubstr("Double"), HasSubstr("Float"))));
  // A tensor that does not fit is left as it was.
  EXPECT_TRUE(at::equal(fresh.model->proj->weight, weight_before));
}

TEST(ModelStateTest, ShardedParameterSavesAndLoadsItsBlock) {
  // This rank holds rows [2, 4) of a [6, 4] parameter.
  struct Shard : torch::nn::Module {
    Shard() { w = register_parameter("w", at::zeros({2, 4})); }
    at::Tensor w;
  };
  Shard source;
  Fill(source, 1);
  ModelStateOptions options;
  options.layouts["w"] = parallel::BlockLayout({6, 4}, {2, 0});
  KEEL_ASSERT_OK_AND_ASSIGN(State saved, ModelState(source, options).StateDict());
  ASSERT_TRUE(saved.tensors["w"].layout.has_value());
  EXPECT_THAT(saved.tensors["w"].layout->global_shape, ElementsAre(6, 4));
  EXPECT_THAT(saved.tensors["w"].layout->offsets, ElementsAre(2, 0));

  Shard same;
  ModelState same_target(same, options);
  KEEL_ASSERT_OK_AND_ASSIGN(LoadReport report, Load(same_target, saved));
  EXPECT_TRUE(report.clean()) << report.ToString();
  EXPECT_TRUE(at::equal(same.w, source.w));

  // A different sharding: a one-row block at global row 3, the saved block's second row.
  struct Row : torch::nn::Module {
    Row() { w = register_parameter("w", at::zeros({1, 4})); }
    at::Tensor w;
  };
  Row row;
  ModelStateOptions row_options;
  row_options.layouts["w"] = parallel::BlockLayout({6, 4}, {3, 0});
  ModelState row_target(row, row_options);
  KEEL_ASSERT_OK_AND_ASSIGN(report, Load(row_target, saved));
  EXPECT_TRUE(report.clean()) << report.ToString();
  EXPECT_TRUE(at::equal(row.w, source.w.narrow(0, 1, 1)));
}

TEST(ModelStateTest, RejectsALayoutForAnUnknownName) {
  TinyLm lm(/*tie=*/false);
  ModelStateOptions options;
  options.layouts["model.nope"] = parallel::BlockLayout({1}, {0});
  EXPECT_THAT(ModelState(lm, options).StateDict(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("model.nope")));
}

}  // namespace
}  // namespace keel::checkpoint
