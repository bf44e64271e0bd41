// Evaluates a trained model on an indexed dataset: the loss of predicting each token of
// consecutive windows of its tokens laid end to end, window i being tokens [i*L, i*L + L + 1)
// (inputs the first L, labels the last L), as sampling/gpt_dataset.h cuts a sample.
//
//   bazel run //tools:eval -- --model=hf/llama --data_prefix=data/wiki_text
//       --sequence_length=1024 --samples=64
//
// --model is a Hugging Face directory (config.json and safetensors), a checkpoint of
// tools:train, or a run's checkpoint_dir (its newest checkpoint). Prints one JSON line per
// window, {"window": i, "loss": mean over its L tokens, "tokens": L}, then
// {"mean_loss": ..., "tokens": N*L, "perplexity": exp(mean_loss)}; the model's description goes
// to stderr. --data_format=sft evaluates the first N conversations (tools/scripts/
// hf_sft_tokenize.py's) whole instead, over their learned tokens only. Exit status (tools/cli/exit_code.h): 0; 1 when the model or the data cannot be
// read; 2 for bad usage or data the model cannot take (too few tokens, a token outside its
// vocabulary, windows longer than its positions).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/json.h"
#include "base/status.h"
#include "base/torch_status.h"
#include "models/registry.h"
#include "sampling/conversation_dataset.h"
#include "sampling/indexed_dataset.h"
#include "tools/cli/exit_code.h"
#include "tools/cli/user_path.h"
#include "tools/recipe/named_dataset.h"
#include "tools/recipe/one_rank_model.h"
#include "tools/recipe/sft_data.h"

ABSL_FLAG(std::string, model, "",
          "A Hugging Face directory, a tools:train checkpoint, or a run's checkpoint_dir.");
ABSL_FLAG(std::string, adapter, "",
          "A Hugging Face peft LoRA adapter directory (adapter_config.json, "
          "adapter_model.safetensors) evaluated over --model, its base.");
ABSL_FLAG(std::string, data_format, "pretraining",
          "pretraining (windows of the tokens end to end) or sft (conversations with their loss "
          "mask, as tools/scripts/hf_sft_tokenize.py writes them; --sequence_length unused).");
ABSL_FLAG(std::string, data_prefix, "",
          "The indexed dataset: PREFIX.bin and PREFIX.idx (tools:preprocess writes them).");
ABSL_FLAG(int64_t, sequence_length, 0, "L: the tokens each window predicts.");
ABSL_FLAG(int64_t, samples, 0, "N: the windows 0..N-1 evaluated.");
ABSL_FLAG(int64_t, batch_size, 8, "Windows per forward pass.");
ABSL_FLAG(std::string, device, "cpu", "Where the model runs: cpu, cuda or cuda:N.");
ABSL_FLAG(std::string, dtype, "float32",
          "The model's weights and activations: float32 or bfloat16 (the files' dtype is "
          "converted, as transformers' dtype does).");

namespace keel::tools {
namespace {

constexpr char kUsage[] = R"(Evaluates a model's loss on an indexed dataset's tokens.

Usage: eval --model=DIR --data_prefix=PREFIX --sequence_length=L --samples=N
            [--data_format=pretraining|sft] [--adapter=PEFT_DIR] [--batch_size=8]
            [--device=cpu] [--dtype=float32]

Prints {"window", "loss", "tokens"} per window i (tokens [i*L, i*L+L+1) of the dataset's
tokens end to end), then {"mean_loss", "tokens", "perplexity"}.

With --data_format=sft (--sequence_length unused): {"sample", "loss", "tokens"} per
conversation i < N, whole, its loss the mean over its learned tokens (null without one), then
{"mean_loss", "tokens", "perplexity"} over all their learned tokens.)";

// The first `count` tokens of the dataset's sequences laid end to end, as int64.
absl::StatusOr<at::Tensor> EndToEnd(const sampling::IndexedDataset& data, int64_t count) {
  std::vector<at::Tensor> pieces;
  int64_t have = 0;
  for (int64_t i = 0; i < data.size() && have < count; ++i) {
    KEEL_ASSIGN_OR_RETURN(at::Tensor sequence, data.Get(i));
    have += sequence.numel();
    pieces.push_back(sequence.to(at::kLong));
  }
  return at::cat(pieces).narrow(0, 0, count);
}

// Every token must be an id of the model's vocabulary.
absl::Status CheckVocabulary(const at::Tensor& tokens, int64_t vocab_size, int64_t sequence_length,
                             const std::string& prefix) {
  const at::Tensor outside = at::logical_or(tokens.lt(0), tokens.ge(vocab_size)).nonzero();
  if (outside.numel() == 0) return absl::OkStatus();
  const int64_t position = outside[0][0].item<int64_t>();
  return absl::InvalidArgumentError(absl::StrCat(
      prefix, ": token ", position, " (window ", position / sequence_length, ") is ",
      tokens[position].item<int64_t>(), ", outside the model's vocabulary of ", vocab_size,
      " (allowed: 0 to ", vocab_size - 1, "); ", outside.size(0), " such tokens in all"));
}

absl::Status CheckFlags(const std::string& model, const std::string& prefix, int64_t length,
                        int64_t samples, int64_t batch_size) {
  if (model.empty() || prefix.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--model and --data_prefix are required\n\n", kUsage));
  }
  if (length < 1 || samples < 1 || batch_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--sequence_length (", length, "), --samples (",
                                                   samples, ") and --batch_size (", batch_size,
                                                   ") must be positive"));
  }
  return absl::OkStatus();
}

// --dtype's value as a LibTorch dtype.
absl::StatusOr<at::ScalarType> DtypeOf(const std::string& name) {
  if (name == "float32") return at::kFloat;
  if (name == "bfloat16") return at::kBFloat16;
  return absl::InvalidArgumentError(
      absl::StrCat("--dtype=", name, " is not a dtype eval runs; allowed: float32, bfloat16"));
}

// --model, with --adapter's adapter, in eval mode (no dropout: a LoRA adapter's).
absl::StatusOr<recipe::OneRankModel> LoadModel(const std::string& model_path) {
  KEEL_ASSIGN_OR_RETURN(recipe::OneRankModel loaded, recipe::LoadOneRankModel(model_path));
  if (const std::string adapter = absl::GetFlag(FLAGS_adapter); !adapter.empty()) {
    KEEL_RETURN_IF_ERROR(
        base::Annotate(recipe::AddPeftAdapter(cli::UserPath(adapter), loaded), "--adapter"));
  }
  loaded.model->eval();
  std::cerr << "eval: " << loaded.source << "\n"
            << "model: " << models::DescribeModel(loaded.options) << "\n";
  return loaded;
}

// --data_format=sft: the first `samples` conversations at `prefix`, each whole.
absl::Status EvaluateConversations(const std::string& model_path, const std::string& prefix,
                                   int64_t samples, const c10::Device& device,
                                   at::ScalarType dtype) {
  absl::StatusOr<sampling::ConversationDataset> data = sampling::ConversationDataset::Open(prefix);
  KEEL_RETURN_IF_ERROR(base::Annotate(data.status(), "--data_prefix"));
  if (data->size() < samples) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, " holds ", data->size(), " conversations; --samples=", samples));
  }
  KEEL_ASSIGN_OR_RETURN(recipe::OneRankModel loaded, LoadModel(model_path));
  if (!loaded.hf_directory.empty()) {
    KEEL_RETURN_IF_ERROR(
        recipe::CheckDataFitsModel(prefix, {loaded.options.vocab_size, loaded.hf_directory}));
  }
  KEEL_RETURN_IF_ERROR(base::CallTorch(absl::StatusCode::kInternal, "moving the model",
                                       [&] { loaded.model->to(device, dtype); }));
  double total = 0;
  int64_t learned_total = 0;
  for (int64_t i = 0; i < samples; ++i) {
    KEEL_ASSIGN_OR_RETURN(const sampling::Conversation conversation, data->Get(i));
    const int64_t n = conversation.tokens.size(0);
    const int64_t vocab_size = loaded.options.vocab_size;
    if (n > 0 && (conversation.tokens.min().item<int64_t>() < 0 ||
                  conversation.tokens.max().item<int64_t>() >= vocab_size)) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, ": conversation ", i, " holds a token outside the model's vocabulary of ",
          vocab_size, " (allowed: 0 to ", vocab_size - 1, ")"));
    }
    if (loaded.options.family == models::ModelFamily::kGpt &&
        n - 1 > loaded.options.max_sequence_length) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, ": conversation ", i, " predicts ", n - 1,
                       " tokens, more than the GPT's learned positions (",
                       loaded.options.max_sequence_length, ")"));
    }
    double sum = 0;
    int64_t learned = 0;
    if (n > 1) {
      KEEL_RETURN_IF_ERROR(base::CallTorch(absl::StatusCode::kInternal, "evaluating", [&] {
        at::NoGradGuard no_grad;
        const at::Tensor tokens = conversation.tokens.to(device);
        const at::Tensor mask = conversation.loss_mask.narrow(0, 1, n - 1).to(at::kDouble);
        const at::Tensor losses = loaded.model
                                      ->TokenLosses(tokens.narrow(0, 0, n - 1).unsqueeze(0),
                                                    tokens.narrow(0, 1, n - 1).unsqueeze(0))
                                      .to(at::kDouble)
                                      .cpu()[0];
        sum = (losses * mask).sum().item<double>();
        learned = static_cast<int64_t>(mask.sum().item<double>());
      }));
    }
    total += sum;
    learned_total += learned;
    std::cout << base::Json{{"sample", i},
                            {"loss", learned > 0 ? base::Json(sum / static_cast<double>(learned))
                                                 : base::Json()},
                            {"tokens", learned}}
                     .dump()
              << "\n";
  }
  const double mean = total / static_cast<double>(std::max<int64_t>(learned_total, 1));
  std::cout << base::Json{{"mean_loss", mean},
                          {"tokens", learned_total},
                          {"perplexity", std::exp(mean)}}
                   .dump()
            << std::endl;
  return absl::OkStatus();
}

absl::Status Run() {
  const std::string model_path = cli::UserPath(absl::GetFlag(FLAGS_model));
  const std::string prefix = cli::UserPath(absl::GetFlag(FLAGS_data_prefix));
  const int64_t length = absl::GetFlag(FLAGS_sequence_length);
  const int64_t samples = absl::GetFlag(FLAGS_samples);
  const int64_t batch_size = absl::GetFlag(FLAGS_batch_size);
  recipe::DataFormat format = recipe::DataFormat::kPretraining;
  if (std::string error;
      !recipe::AbslParseFlag(absl::GetFlag(FLAGS_data_format), &format, &error)) {
    return absl::InvalidArgumentError(absl::StrCat("--data_format: ", error));
  }
  const bool sft = format == recipe::DataFormat::kSft;
  KEEL_RETURN_IF_ERROR(CheckFlags(absl::GetFlag(FLAGS_model), absl::GetFlag(FLAGS_data_prefix),
                                  sft ? 1 : length, samples, batch_size));
  c10::Device device(c10::kCPU);
  KEEL_RETURN_IF_ERROR(base::CallTorch(absl::StatusCode::kInvalidArgument, "--device",
                                       [&] { device = c10::Device(absl::GetFlag(FLAGS_device)); }));
  if (device.is_cuda() && !at::hasCUDA()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device=", absl::GetFlag(FLAGS_device), ": this machine has no GPU"));
  }
  KEEL_ASSIGN_OR_RETURN(const at::ScalarType dtype, DtypeOf(absl::GetFlag(FLAGS_dtype)));
  if (sft) return EvaluateConversations(model_path, prefix, samples, device, dtype);

  KEEL_ASSIGN_OR_RETURN(const sampling::IndexedDataset data,
                        recipe::OpenNamedDataset("--data_prefix", prefix));
  const int64_t needed = samples * length + 1;
  if (data.num_tokens() < needed) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, " holds ", data.num_tokens(), " tokens; --samples=", samples,
                     " windows of --sequence_length=", length, " need ", needed, " (at most ",
                     (data.num_tokens() - 1) / length, " windows of ", length, ")"));
  }
  KEEL_ASSIGN_OR_RETURN(recipe::OneRankModel loaded, LoadModel(model_path));

  if (loaded.options.family == models::ModelFamily::kGpt &&
      length > loaded.options.max_sequence_length) {
    return absl::InvalidArgumentError(absl::StrCat("--sequence_length (", length,
                                                   ") exceeds the GPT's learned positions (",
                                                   loaded.options.max_sequence_length, ")"));
  }
  if (!loaded.hf_directory.empty()) {
    KEEL_RETURN_IF_ERROR(
        recipe::CheckDataFitsModel(prefix, {loaded.options.vocab_size, loaded.hf_directory}));
  }
  KEEL_ASSIGN_OR_RETURN(const at::Tensor tokens, EndToEnd(data, needed));
  KEEL_RETURN_IF_ERROR(CheckVocabulary(tokens, loaded.options.vocab_size, length, prefix));
  double total = 0;
  KEEL_RETURN_IF_ERROR(base::CallTorch(absl::StatusCode::kInternal, "evaluating", [&] {
    at::NoGradGuard no_grad;
    loaded.model->to(device, dtype);
    const at::Tensor on_device = tokens.to(device);
    for (int64_t first = 0; first < samples; first += batch_size) {
      const int64_t count = std::min(batch_size, samples - first);
      const at::Tensor span = on_device.narrow(0, first * length, count * length + 1);
      const at::Tensor inputs = span.narrow(0, 0, count * length).view({count, length});
      const at::Tensor labels = span.narrow(0, 1, count * length).view({count, length});
      const at::Tensor sums =
          loaded.model->TokenLosses(inputs, labels).to(at::kDouble).sum(1).cpu();
      for (int64_t w = 0; w < count; ++w) {
        const double sum = sums[w].item<double>();
        total += sum;
        std::cout << base::Json{{"window", first + w},
                                {"loss", sum / static_cast<double>(length)},
                                {"tokens", length}}
                         .dump()
                  << "\n";
      }
    }
  }));
  const double mean = total / static_cast<double>(samples * length);
  std::cout << base::Json{{"mean_loss", mean},
                          {"tokens", samples * length},
                          {"perplexity", std::exp(mean)}}
                   .dump()
            << std::endl;
  return absl::OkStatus();
}

}  // namespace
}  // namespace keel::tools

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(keel::tools::kUsage);
  absl::ParseCommandLine(argc, argv);
  return keel::tools::cli::Exit("eval", keel::tools::Run());
}
