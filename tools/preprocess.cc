// Turns text files into a byte-level Megatron indexed dataset (<prefix>.bin/.idx) for the
// trainer: each file is a document, each blank-line separated paragraph a sequence, tokens are
// bytes (uint16, as Megatron picks for 256 symbols) and byte 0 ends every document. See
// tools/recipe/corpus.h for the exact layout.
//
//   bazel run //tools:preprocess -- --output_prefix=data/mytext a.txt b.txt
//   bazel run //tools:preprocess -- --output_prefix=data/licenses   # the default corpus
//
// Exit status (tools/cli/exit_code.h): 0 when written, 1 for errors, 2 for bad usage.
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "sampling/indexed_dataset.h"
#include "tools/cli/exit_code.h"
#include "tools/cli/user_path.h"
#include "tools/recipe/corpus.h"

ABSL_FLAG(std::string, output_prefix, "",
          "Writes <output_prefix>.bin and <output_prefix>.idx (required).");

namespace keel::tools {
namespace {

constexpr char kUsage[] = R"(Turns text files into a byte-level Megatron indexed dataset.

Usage: preprocess --output_prefix=PREFIX [FILE...]

Each FILE is one document and each blank-line separated paragraph one sequence; tokens are the
bytes (uint16), and byte 0 is appended to end every document. Without FILEs, the license texts
in /usr/share/common-licenses are used. Relative paths are taken from the directory Bazel was
run in.)";

absl::Status Run(const std::vector<std::string>& operands) {
  const std::string prefix = cli::UserPath(absl::GetFlag(FLAGS_output_prefix));
  std::vector<std::string> files;
  for (const std::string& operand : operands) files.push_back(cli::UserPath(operand));
  if (files.empty()) {
    files = recipe::DefaultCorpusFiles();
    if (files.empty()) {
      return absl::NotFoundError(
          "no FILE given and no default corpus: /usr/share/common-licenses holds none of the "
          "base-files license texts");
    }
    std::cout << "default corpus: " << files.size() << " license texts\n";
  }
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
  const std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_output_prefix).empty()) {
    std::cerr << "preprocess: --output_prefix is required\n\n" << keel::tools::kUsage << "\n";
    return keel::tools::cli::kExitUsage;
  }
  return keel::tools::cli::Exit("preprocess", keel::tools::Run({args.begin() + 1, args.end()}));
}
