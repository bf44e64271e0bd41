#include "tools/cli/flags.h"

#include <atomic>
#include <cstdlib>

#include "absl/flags/parse.h"
#include "absl/strings/string_view.h"
#include "tools/cli/exit_code.h"

namespace keel::tools::cli {
namespace {

// Whether absl::ParseCommandLine is running on a command line without a usage flag: an exit
// then is Abseil's for a flag it could not parse.
std::atomic<bool> parsing_flags{false};

void ExitAsBadUsage() {
  if (parsing_flags.load()) std::_Exit(kExitUsage);  // Abseil wrote its message to stderr
}

// Abseil's usage flags (absl/flags/internal/usage.cc), whose exit is their own: "--help",
// "-helpon=module", "--version" and the others, with one dash or two.
bool IsUsageFlag(absl::string_view arg) {
  if (arg.empty() || arg[0] != '-') return false;
  arg.remove_prefix(arg.size() > 1 && arg[1] == '-' ? 2 : 1);
  arg = arg.substr(0, arg.find('='));
  for (absl::string_view usage : {"help", "helpfull", "helpshort", "helppackage", "helpon",
                                  "helpmatch", "version", "only_check_args"}) {
    if (arg == usage) return true;
  }
  return false;
}

}  // namespace

std::vector<char*> ParseFlags(int argc, char** argv) {
  bool usage = false;
  for (int i = 1; i < argc && absl::string_view(argv[i]) != "--"; ++i) {
    usage = usage || IsUsageFlag(argv[i]);
  }
  static const int registered = std::atexit(ExitAsBadUsage);
  (void)registered;
  parsing_flags = !usage;
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  parsing_flags = false;
  return args;
}

}  // namespace keel::tools::cli
