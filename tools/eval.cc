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
// hf_sft_tokenize.py's) whole instead, over their learned tokens only, each alone or packed as
// the trainer packs them (--packed_sequence_size). Exit status (tools/cli/exit_code.h): 0; 1
// when the model or the data cannot be read; 2 for bad usage or data the model cannot take (too
// few tokens, a token outside its vocabulary, windows longer than its positions).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/attention.h"
#include "base/json.h"
#include "base/status.h"
#include "base/torch_status.h"
#include "models/registry.h"
#include "sampling/conversation_dataset.h"
#include "sampling/indexed_dataset.h"
#include "sampling/sequence_packing.h"
#include "tools/cli/exit_code.h"
#include "tools/cli/flags.h"
#include "tools/cli/user_path.h"
#include "tools/recipe/named_dataset.h"
#include "tools/recipe/one_rank_model.h"
#include "tools/recipe/sft_data.h"
#include "torch/cuda.h"

ABSL_FLAG(std::string, model, "",
          "A Hugging Face directory, a tools:train checkpoint, or a run's checkpoint_dir.");
ABSL_FLAG(std::string, adapter, "",
          "A Hugging Face peft LoRA adapter directory (adapter_config.json, "
          "adapter_model.safetensors) evaluated over --model, its base.");
ABSL_FLAG(std::string, data_format, "pretraining",
          "pretraining (windows of the tokens end to end) or sft (conversations with their loss "
          "mask, as tools/scripts/hf_sft_tokenize.py writes them; no --sequence_length).");
ABSL_FLAG(std::string, data_prefix, "",
          "The indexed dataset: PREFIX.bin and PREFIX.idx (tools:preprocess writes them).");
ABSL_FLAG(int64_t, sequence_length, 0, "L: the tokens each window predicts.");
ABSL_FLAG(int64_t, samples, 0, "N: the windows 0..N-1 evaluated.");
ABSL_FLAG(int64_t, batch_size, 8, "Windows (or packed rows) per forward pass.");
ABSL_FLAG(int64_t, packed_sequence_size, 0,
          "With --data_format=sft: the conversations packed in order into rows of this many "
          "tokens, as the trainer's packed_sequence.packed_sequence_size packs them; 0: each "
          "alone.");
ABSL_FLAG(std::string, device, "cpu", "Where the model runs: cpu, cuda or cuda:N.");
ABSL_FLAG(std::string, dtype, "float32",
          "The model's weights and activations: float32 or bfloat16 (the files' dtype is "
          "converted, as transformers' dtype does).");

namespace keel::tools {
namespace {

constexpr char kUsage[] = R"(Evaluates a model's loss on an indexed dataset's tokens.

Usage: eval --model=DIR --data_prefix=PREFIX --sequence_length=L --samples=N
            [--data_format=pretraining|sft] [--packed_sequence_size=S]
            [--adapter=PEFT_DIR] [--batch_size=8]
            [--device=cpu] [--dtype=float32]

Prints {"window", "loss", "tokens"} per window i (tokens [i*L, i*L+L+1) of the dataset's
tokens end to end), then {"mean_loss", "tokens", "perplexity"}.

With --data_format=sft (--sequence_length unused): {"sample", "loss", "tokens"} per
conversation i < N, whole, its loss the mean over its learned tokens (null without one), then
{"mean_loss", "tokens", "perplexity"} over all their learned tokens; with
--packed_sequence_size=S they run packed S tokens to a row, as the trainer packs them (the
same figures, up to float rounding).)";

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

// The flags' values, alone and together: what each data format reads.
absl::Status CheckFlags(const std::string& model, const std::string& prefix, bool sft,
                        int64_t length, int64_t samples, int64_t batch_size, int64_t packed_size) {
  if (model.empty() || prefix.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--model and --data_prefix are required\n\n", kUsage));
  }
  if (sft && length != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--sequence_length (", length,
        ") sizes windows; --data_format=sft evaluates each conversation whole; allowed with "
        "sft: unset"));
  }
  if ((!sft && length < 1) || samples < 1 || batch_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--sequence_length (", length, "), --samples (",
                                                   samples, ") and --batch_size (", batch_size,
                                                   ") must be positive"));
  }
  if (packed_size < 0 || (packed_size > 0 && !sft)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--packed_sequence_size (", packed_size,
        ") packs conversations: allowed 0, or a positive size with --data_format=sft"));
  }
  return absl::OkStatus();
}

// --device's value: the CPU, or a GPU this machine has.
absl::StatusOr<c10::Device> DeviceOf(const std::string& name) {
  c10::Device device(c10::kCPU);
  KEEL_RETURN_IF_ERROR(base::CallTorch(absl::StatusCode::kInvalidArgument, "--device",
                                       [&] { device = c10::Device(name); }));
  if (!device.is_cpu() && !device.is_cuda()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device=", name, ": allowed: cpu, cuda or cuda:N"));
  }
  if (device.is_cuda() && !at::hasCUDA()) {
    return absl::InvalidArgumentError(absl::StrCat("--device=", name, ": this machine has no GPU"));
  }
  const int gpus = static_cast<int>(torch::cuda::device_count());
  if (device.is_cuda() && device.index() >= gpus) {
    return absl::InvalidArgumentError(absl::StrCat("--device=", name, ": this machine has ", gpus,
                                                   " GPU(s), cuda:0 to cuda:", gpus - 1));
  }
  return device;
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

// The first conversations' summed losses over their learned tokens, and those tokens' counts.
struct ConversationLosses {
  std::vector<double> sums;
  std::vector<int64_t> learned;
};

// Conversation `c` (its `inputs` and `labels`) fits the model: tokens of its vocabulary, and
// no more positions than a GPT learned.
absl::Status CheckConversation(const models::ModelOptions& model, const std::string& prefix,
                               int64_t c, const at::Tensor& inputs, const at::Tensor& labels) {
  const int64_t vocab_size = model.vocab_size;
  for (const at::Tensor& tokens : {inputs, labels}) {
    if (tokens.numel() > 0 &&
        (tokens.min().item<int64_t>() < 0 || tokens.max().item<int64_t>() >= vocab_size)) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, ": conversation ", c, " holds a token outside the model's vocabulary of ",
          vocab_size, " (allowed: 0 to ", vocab_size - 1, ")"));
    }
  }
  if (model.family == models::ModelFamily::kGpt && inputs.numel() > model.max_sequence_length) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, ": conversation ", c, " predicts ", inputs.numel(),
        " tokens, more than the GPT's learned positions (", model.max_sequence_length, ")"));
  }
  return absl::OkStatus();
}

// The first `samples` conversations at `prefix`, each whole and alone.
absl::StatusOr<ConversationLosses> EachAlone(recipe::OneRankModel& loaded,
                                             const std::string& prefix, int64_t samples,
                                             const c10::Device& device) {
  absl::StatusOr<sampling::ConversationDataset> data = sampling::ConversationDataset::Open(prefix);
  KEEL_RETURN_IF_ERROR(base::Annotate(data.status(), "--data_prefix"));
  if (data->size() < samples) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, " holds ", data->size(), " conversations; --samples=", samples));
  }
  ConversationLosses losses{std::vector<double>(samples), std::vector<int64_t>(samples)};
  for (int64_t i = 0; i < samples; ++i) {
    KEEL_ASSIGN_OR_RETURN(const sampling::Conversation conversation, data->Get(i));
    const int64_t n = std::max<int64_t>(conversation.tokens.size(0) - 1, 0);
    const at::Tensor inputs = conversation.tokens.narrow(0, 0, n);
    const at::Tensor labels = conversation.tokens.narrow(0, conversation.tokens.size(0) - n, n);
    KEEL_RETURN_IF_ERROR(CheckConversation(loaded.options, prefix, i, inputs, labels));
    if (n == 0) continue;
    KEEL_RETURN_IF_ERROR(base::CallTorch(absl::StatusCode::kInternal, "evaluating", [&] {
      at::NoGradGuard no_grad;
      const at::Tensor mask = conversation.loss_mask.narrow(0, 1, n).to(at::kDouble);
      const at::Tensor token_losses =
          loaded.model->TokenLosses(inputs.to(device).unsqueeze(0), labels.to(device).unsqueeze(0))
              .to(at::kDouble)
              .cpu()[0];
      losses.sums[i] = (token_losses * mask).sum().item<double>();
      losses.learned[i] = static_cast<int64_t>(mask.sum().item<double>());
    }));
  }
  return losses;
}

// The first `samples` conversations at `prefix`, packed in order into rows of `size` tokens as
// the trainer packs them (packed_sequence.packed_sequence_size), `batch_size` rows at a time.
absl::StatusOr<ConversationLosses> Packed(recipe::OneRankModel& loaded, const std::string& prefix,
                                          int64_t samples, int64_t size, int64_t batch_size,
                                          const c10::Device& device) {
  recipe::SftDataOptions format;
  format.format = recipe::DataFormat::kSft;
  sampling::PackedSequenceOptions packing;
  packing.packed_sequence_size = size;
  // Every conversation that fits a pack, none validating.
  absl::StatusOr<std::unique_ptr<recipe::SftData>> data =
      recipe::SftData::Open(prefix, format, size, /*every_n=*/0, packing);
  KEEL_RETURN_IF_ERROR(base::Annotate(data.status(), "--data_prefix"));
  const sampling::ConversationDataset& conversations = (*data)->conversations();
  if (conversations.size() < samples) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, " holds ", conversations.size(),
                                                   " conversations; --samples=", samples));
  }
  for (int64_t i = 0; i < samples; ++i) {
    if (conversations.length(i) > size + 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, ": conversation ", i, " predicts ", conversations.length(i) - 1,
                       " tokens, more than --packed_sequence_size=", size,
                       " (allowed: at least the longest, ", "or a --samples that leaves it out)"));
    }
  }
  ConversationLosses losses{std::vector<double>(samples), std::vector<int64_t>(samples)};
  int64_t next = 0;  // the next pack
  while (next < (*data)->train_size() && (*data)->Conversations(next, false)[0] < samples) {
    const int64_t rows = std::min(batch_size, (*data)->train_size() - next);
    at::Tensor inputs = at::empty({rows, size}, at::kLong), labels = at::empty_like(inputs);
    at::Tensor mask = at::empty({rows, size}, at::kFloat);
    std::vector<std::vector<int64_t>> lengths(rows);
    for (int64_t r = 0; r < rows; ++r) {
      KEEL_RETURN_IF_ERROR(
          (*data)->Fill(next + r, /*validation=*/false,
                        {inputs[r].data_ptr<int64_t>(), labels[r].data_ptr<int64_t>(),
                         mask[r].data_ptr<float>(), &lengths[r]}));
      int64_t begin = 0;
      const std::vector<int64_t> members = (*data)->Conversations(next + r, false);
      for (size_t k = 0; k < members.size(); ++k) {
        KEEL_RETURN_IF_ERROR(CheckConversation(loaded.options, prefix, members[k],
                                               inputs[r].narrow(0, begin, lengths[r][k]),
                                               labels[r].narrow(0, begin, lengths[r][k])));
        begin += lengths[r][k];
      }
    }
    KEEL_RETURN_IF_ERROR(base::CallTorch(absl::StatusCode::kInternal, "evaluating", [&] {
      at::NoGradGuard no_grad;
      const base::PackedSequences packed = base::PackRows(lengths, size).To(device);
      const at::Tensor weighted =
          (loaded.model->TokenLosses(inputs.to(device), labels.to(device), &packed)
               .to(at::kDouble)
               .cpu() *
           mask.to(at::kDouble));
      for (int64_t r = 0; r < rows; ++r) {
        const std::vector<int64_t> members = (*data)->Conversations(next + r, false);
        int64_t begin = 0;
        for (size_t k = 0; k < members.size(); ++k) {
          const int64_t c = members[k], n = lengths[r][k];
          if (c < samples) {
            losses.sums[c] = weighted[r].narrow(0, begin, n).sum().item<double>();
            losses.learned[c] =
                static_cast<int64_t>(mask[r].narrow(0, begin, n).sum().item<float>());
          }
          begin += n;
        }
      }
    }));
    next += rows;
  }
  return losses;
}

// --data_format=sft: the first `samples` conversations at `prefix`, each whole, alone or packed
// into rows of `packed_size` tokens (when positive).
absl::Status EvaluateConversations(const std::string& model_path, const std::string& prefix,
                                   int64_t samples, int64_t packed_size, int64_t batch_size,
                                   const c10::Device& device, at::ScalarType dtype) {
  KEEL_RETURN_IF_ERROR(
      base::Annotate(sampling::ConversationDataset::Open(prefix).status(), "--data_prefix"));
  KEEL_ASSIGN_OR_RETURN(recipe::OneRankModel loaded, LoadModel(model_path));
  if (!loaded.hf_directory.empty()) {
    KEEL_RETURN_IF_ERROR(
        recipe::CheckDataFitsModel(prefix, {loaded.options.vocab_size, loaded.hf_directory}));
  }
  KEEL_RETURN_IF_ERROR(base::CallTorch(absl::StatusCode::kInternal, "moving the model",
                                       [&] { loaded.model->to(device, dtype); }));
  KEEL_ASSIGN_OR_RETURN(const ConversationLosses losses,
                        packed_size > 0
                            ? Packed(loaded, prefix, samples, packed_size, batch_size, device)
                            : EachAlone(loaded, prefix, samples, device));
  double total = 0;
  int64_t learned_total = 0;
  for (int64_t i = 0; i < samples; ++i) {
    const double sum = losses.sums[i];
    const int64_t learned = losses.learned[i];
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
  const int64_t packed_size = absl::GetFlag(FLAGS_packed_sequence_size);
  KEEL_RETURN_IF_ERROR(CheckFlags(absl::GetFlag(FLAGS_model), absl::GetFlag(FLAGS_data_prefix), sft,
                                  length, samples, batch_size, packed_size));
  KEEL_ASSIGN_OR_RETURN(const c10::Device device, DeviceOf(absl::GetFlag(FLAGS_device)));
  KEEL_ASSIGN_OR_RETURN(const at::ScalarType dtype, DtypeOf(absl::GetFlag(FLAGS_dtype)));
  if (sft) {
    return EvaluateConversations(model_path, prefix, samples, packed_size, batch_size, device,
                                 dtype);
  }

  KEEL_ASSIGN_OR_RETURN(const sampling::IndexedDataset data,
                        recipe::OpenNamedDataset("--data_prefix", prefix));
  // samples x length + 1 tokens, compared without a product that could overflow.
  if ((data.num_tokens() - 1) / length < samples) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, " holds ", data.num_tokens(), " tokens; --samples=", samples,
                     " windows of --sequence_length=", length, " need ",
                     static_cast<double>(samples) * static_cast<double>(length) + 1, " (at most ",
                     (data.num_tokens() - 1) / length, " windows of ", length, ")"));
  }
  const int64_t needed = samples * length + 1;
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
  keel::tools::cli::ParseFlags(argc, argv);
  return keel::tools::cli::Exit("eval", keel::tools::Run());
}
