// Turns text files into a byte-level Megatron indexed dataset (<prefix>.bin/.idx) for the
// trainer: each file is a document, each blank-line separated paragraph a sequence, tokens are
// bytes (uint16, as Megatron picks for 256 symbols) and byte 0 ends every document. See
// tools/recipe/corpus.h for the exact layout. With --tokenizer_model, Megatron's
// preprocess_data.py with a SentencePiece model instead (tools/recipe/tokenized_corpus.h).
//
//   bazel run //tools:preprocess -- --output_prefix=data/mytext a.txt b.txt
//   bazel run //tools:preprocess -- --output_prefix=data/licenses   # the default corpus
//   bazel run //tools:preprocess -- --tokenizer_model=spm.model --json_keys=text
//       --append_eod --output_prefix=data/web docs.jsonl    # one line: data/web_text_document
//
// Exit status (tools/cli/exit_code.h): 0 when written, 1 for errors, 2 for bad usage.
#include <algorithm>
#include <chrono>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "sampling/indexed_dataset_writer.h"
#include "tools/cli/exit_code.h"
#include "tools/cli/flags.h"
#include "tools/cli/user_path.h"
#include "tools/recipe/corpus.h"
#include "tools/recipe/tokenized_corpus.h"

ABSL_FLAG(std::string, output_prefix, "",
          "Writes <output_prefix>.bin and <output_prefix>.idx (required).");
ABSL_FLAG(std::string, tokenizer_model, "",
          "A SentencePiece model: encode with it instead of writing bytes.");
ABSL_FLAG(std::vector<std::string>, json_keys, {},
          "With --tokenizer_model: the FILEs are JSONL, and each of these keys makes a dataset "
          "<output_prefix>_<key>_document.");
ABSL_FLAG(bool, append_eod, false,
          "With --tokenizer_model: end every document with the model's EOS id.");
ABSL_FLAG(int, workers, 0, "With --tokenizer_model: encoding threads; 0 for one per core.");

namespace keel::tools {
namespace {

constexpr char kUsage[] = R"(Turns text files into a byte-level Megatron indexed dataset.

Usage: preprocess --output_prefix=PREFIX [FILE...]
       preprocess --tokenizer_model=MODEL [--json_keys=K1,K2] [--append_eod] [--workers=N]
                  --output_prefix=PREFIX [FILE...]

Each FILE is one document and each blank-line separated paragraph one sequence; tokens are the
bytes (uint16), and byte 0 is appended to end every document. Without FILEs, the license texts
in /usr/share/common-licenses are used. Relative paths are taken from the directory Bazel was
run in.

With --tokenizer_model, the SentencePiece model encodes: each FILE is a document whose non-empty
lines are its sequences, or with --json_keys (Megatron's preprocess_data.py) a JSONL file whose
lines are documents, each key's text a dataset <PREFIX>_<key>_document. Tokens are uint16 below
65500 pieces, else int32; <prefix>.tokenizer.json records the vocabulary for the trainer.)";

// The FILEs, or the default corpus's license texts.
absl::StatusOr<std::vector<std::string>> InputFiles(const std::vector<std::string>& operands) {
  std::vector<std::string> files;
  for (const std::string& operand : operands) files.push_back(cli::UserPath(operand));
  if (!files.empty()) return files;
  files = recipe::DefaultCorpusFiles();
  if (files.empty()) {
    return absl::NotFoundError(
        "no FILE given and no default corpus: /usr/share/common-licenses holds none of the "
        "base-files license texts");
  }
  std::cout << "default corpus: " << files.size() << " license texts\n";
  return files;
}

absl::Status Tokenize(const std::vector<std::string>& files, const std::string& prefix) {
  recipe::TokenizeOptions options;
  options.tokenizer_model = cli::UserPath(absl::GetFlag(FLAGS_tokenizer_model));
  options.json_keys = absl::GetFlag(FLAGS_json_keys);
  options.append_eod = absl::GetFlag(FLAGS_append_eod);
  options.threads = absl::GetFlag(FLAGS_workers);
  const auto start = std::chrono::steady_clock::now();
  KEEL_ASSIGN_OR_RETURN(recipe::TokenizedCorpus corpus,
                        recipe::BuildTokenizedCorpus(files, prefix, options));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  int64_t tokens = 0;
  for (const recipe::TokenizedDataset& dataset : corpus.datasets) {
    std::cout << "wrote " << dataset.prefix << ".{bin,idx,tokenizer.json}: " << dataset.documents
              << " documents, " << dataset.sequences << " sequences, " << dataset.tokens
              << " tokens (" << sampling::AbslUnparseFlag(corpus.dtype) << ", vocabulary "
              << corpus.info.vocab_size << ", EOS " << corpus.info.eos_id
              << (corpus.info.append_eod ? " appended" : " not appended") << ")\n";
    tokens += dataset.tokens;
  }
  std::cout << "encoded " << tokens << " tokens in " << seconds
            << " s: " << static_cast<int64_t>(tokens / std::max(seconds, 1e-9)) << " tokens/s\n";
  return absl::OkStatus();
}

absl::Status Run(const std::vector<std::string>& operands) {
  const std::string prefix = cli::UserPath(absl::GetFlag(FLAGS_output_prefix));
  KEEL_ASSIGN_OR_RETURN(const std::vector<std::string> files, InputFiles(operands));
  // The output's folder is made, as the trainer makes its run directory.
  KEEL_RETURN_IF_ERROR(base::Annotate(base::MakeDirectories(base::ParentDirectory(prefix)),
                                      "--output_prefix's folder"));
  if (!absl::GetFlag(FLAGS_tokenizer_model).empty()) return Tokenize(files, prefix);
  KEEL_ASSIGN_OR_RETURN(recipe::CorpusStats stats, recipe::BuildByteCorpus(files, prefix));
  std::cout << "wrote " << prefix << ".bin and " << prefix << ".idx: " << stats.documents
            << " documents, " << stats.sequences << " sequences, " << stats.tokens << " tokens ("
            << sampling::AbslUnparseFlag(recipe::kByteTokenDtype) << ", vocabulary "
            << recipe::kByteVocabSize << ", end of document " << recipe::kByteEodToken << ")\n";
  return absl::OkStatus();
}

}  // namespace
}  // namespace keel::tools

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(keel::tools::kUsage);
  const std::vector<char*> args = keel::tools::cli::ParseFlags(argc, argv);
  if (absl::GetFlag(FLAGS_output_prefix).empty()) {
    std::cerr << "preprocess: --output_prefix is required\n\n" << keel::tools::kUsage << "\n";
    return keel::tools::cli::kExitUsage;
  }
  if (absl::GetFlag(FLAGS_tokenizer_model).empty() &&
      (!absl::GetFlag(FLAGS_json_keys).empty() || absl::GetFlag(FLAGS_append_eod))) {
    std::cerr << "preprocess: --json_keys and --append_eod need --tokenizer_model\n";
    return keel::tools::cli::kExitUsage;
  }
  return keel::tools::cli::Exit("preprocess", keel::tools::Run({args.begin() + 1, args.end()}));
}
