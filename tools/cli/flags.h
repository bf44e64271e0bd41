// The command line of every Keel tool: absl::ParseCommandLine, with its errors as bad usage
// (exit_code.h's kExitUsage, 2). Abseil ends the process with 1 for an unknown flag or a value
// that does not parse (its ParseCommandLine has no way to return them); ParseFlags keeps
// Abseil's message and ends with 2 instead, as a bad value that the tool itself reads does.
// --help and Abseil's other usage flags end as Abseil ends them (1; --version and
// --only_check_args 0).
//
//   int main(int argc, char** argv) {
//     const std::vector<char*> args = keel::tools::cli::ParseFlags(argc, argv);
//     ...
//   }
#ifndef KEEL_TOOLS_CLI_FLAGS_H_
#define KEEL_TOOLS_CLI_FLAGS_H_

#include <vector>

namespace keel::tools::cli {

// absl::ParseCommandLine(argc, argv): the program name and the positional arguments, with every
// flag set; exits with kExitUsage when a flag is unknown or its value does not parse.
// Call it once, from the main thread, before any other thread starts.
std::vector<char*> ParseFlags(int argc, char** argv);

}  // namespace keel::tools::cli

#endif  // KEEL_TOOLS_CLI_FLAGS_H_
