#include "tools/cli/user_path.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace keel::tools::cli {

std::string UserPath(const std::string& path) {
  const char* dir = std::getenv("BUILD_WORKING_DIRECTORY");
  if (path.empty() || path[0] == '/' || dir == nullptr) return path;
  return absl::StrCat(dir, "/", path);
}

}  // namespace keel::tools::cli
