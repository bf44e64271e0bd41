// The Llama family against Hugging Face transformers (testdata/hf_parity, recorded by
// tools/scripts/hf_parity.py): each case's config.json builds the model, its model.safetensors
// loads by HF's names, and Keel computes transformers' logits, loss (HF's: labels shifted
// inside, -100 ignored, the mean), every gradient, and after one SGD step the logits and loss
// again, within 1e-5 in float32: the loss and the gradients absolutely, the logits relative to
// their largest magnitude (about 10 here). Measured: at most 7.6e-6 of logits, 9.5e-7 of loss
// and 4.0e-7 of gradients under LibTorch 2.11 (the recording's torch).
#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/hf_import.h"
#include "checkpoint/safetensors.h"
#include "gtest/gtest.h"
#include "models/hf_config.h"
#include "models/registry.h"
#include "testing/status_matchers.h"
#include "torch/utils.h"

ABSL_FLAG(std::string, fixtures, "testdata/hf_parity", "the fixtures' directory");

namespace keel::models {
namespace {

constexpr double kTolerance = 1e-5;

std::map<std::string, at::Tensor> ReadExpected(const std::string& path) {
  std::map<std::string, at::Tensor> expected;
  absl::StatusOr<std::vector<std::pair<std::string, at::Tensor>>> tensors =
      checkpoint::ReadSafetensorsFile(path);
  EXPECT_TRUE(tensors.ok()) << tensors.status();
  if (tensors.ok()) {
    for (auto& [name, tensor] : *tensors) expected[name] = tensor;
  }
  return expected;
}

// The largest |a - b|.
double MaxDifference(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

// What a tolerance is relative to: the largest magnitude of `t`, or 1.
double Scale(const at::Tensor& t) { return std::max(1.0, t.abs().max().item<double>()); }

struct Outputs {
  at::Tensor logits;  // [batch, seq, vocab], the padding columns dropped
  at::Tensor loss;
};

// HF's causal-LM loss from Keel's per-position losses: label t + 1 is position t's target.
Outputs Forward(LanguageModel& model, const at::Tensor& input_ids, const at::Tensor& hf_labels,
                int64_t vocab) {
  const at::Tensor hidden = model.StageForward(input_ids, {}, nullptr);
  Outputs out;
  out.logits = model.Logits(hidden).narrow(-1, 0, vocab);
  const int64_t seq = input_ids.size(1);
  at::Tensor labels = at::full_like(hf_labels, -100);
  labels.narrow(1, 0, seq - 1).copy_(hf_labels.narrow(1, 1, seq - 1));
  const at::Tensor counted = labels.ne(-100);
  const at::Tensor losses = model.HeadLosses(hidden, labels.masked_fill(counted.logical_not(), 0));
  out.loss = (losses * counted).sum() / counted.sum();
  return out;
}

class LlamaHfParityTest : public ::testing::TestWithParam<std::string> {};

TEST_P(LlamaHfParityTest, LogitsLossGradientsAndAnSgdStepAreTransformers) {
  at::set_num_threads(1);
  const std::string dir = absl::StrCat(absl::GetFlag(FLAGS_fixtures), "/", GetParam());
  KEEL_ASSERT_OK_AND_ASSIGN(const ModelOptions options, ReadHfConfig(dir));
  torch::manual_seed(0);
  const std::shared_ptr<LanguageModel> model = BuildLanguageModel(options, {});
  KEEL_ASSERT_OK_AND_ASSIGN(const checkpoint::HfImportResult loaded,
                            checkpoint::LoadHfSafetensors(dir, *model));
  EXPECT_GT(loaded.num_tensors, 0);
  std::map<std::string, at::Tensor> expected = ReadExpected(dir + "/expected.safetensors");
  ASSERT_TRUE(expected.count("logits")) << "no logits in " << dir;

  Outputs out = Forward(*model, expected["input_ids"], expected["labels"], options.vocab_size);
  EXPECT_LE(MaxDifference(out.logits, expected["logits"]), kTolerance * Scale(expected["logits"]));
  EXPECT_NEAR(out.loss.item<double>(), expected["loss"].item<double>(), kTolerance);
  out.loss.backward();
  int64_t gradients = 0;
  for (const auto& item : model->named_parameters()) {
    const auto it = expected.find("grad." + item.key());
    if (it == expected.end()) {
      // A tied lm_head is the embedding itself: HF records its gradient once, as the embedding's.
      EXPECT_EQ(item.key(), "lm_head.weight");
      EXPECT_FALSE(options.untie_embeddings_and_output_weights);
      continue;
    }
    ++gradients;
    EXPECT_LE(MaxDifference(item.value().grad(), it->second), kTolerance) << item.key();
  }
  int64_t recorded = 0;
  for (const auto& [name, tensor] : expected) recorded += name.rfind("grad.", 0) == 0;
  EXPECT_EQ(gradients, recorded);

  const double lr = 0.1;  // hf_parity.py's SGD learning rate (its metadata's "sgd_lr")
  {
    at::NoGradGuard no_grad;
    std::set<const void*> stepped;  // a tied weight once
    for (auto& parameter : model->parameters()) {
      if (stepped.insert(parameter.unsafeGetTensorImpl()).second) {
        parameter.sub_(parameter.grad() * lr);
      }
    }
  }
  const Outputs after =
      Forward(*model, expected["input_ids"], expected["labels"], options.vocab_size);
  EXPECT_LE(MaxDifference(after.logits, expected["logits_after_step"]),
            kTolerance * Scale(expected["logits_after_step"]));
  EXPECT_NEAR(after.loss.item<double>(), expected["loss_after_step"].item<double>(), kTolerance);
}

INSTANTIATE_TEST_SUITE_P(Cases, LlamaHfParityTest,
                         ::testing::Values("llama_tied", "llama_gqa_untied", "llama_legacy_rope",
                                           "qwen2", "qwen3", "mistral"));

}  // namespace
}  // namespace keel::models
