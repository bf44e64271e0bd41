// Paths as the user typed them: `bazel run` starts tools in their runfiles directory, so a
// relative path is taken from the directory the user ran Bazel in (BUILD_WORKING_DIRECTORY).
#ifndef KEEL_TOOLS_CLI_USER_PATH_H_
#define KEEL_TOOLS_CLI_USER_PATH_H_

#include <string>

namespace keel::tools::cli {

// `path` made absolute against BUILD_WORKING_DIRECTORY when it is relative and the variable
// is set; otherwise `path` unchanged.
std::string UserPath(const std::string& path);

}  // namespace keel::tools::cli

#endif  // KEEL_TOOLS_CLI_USER_PATH_H_
