#include "tools/recipe/corpus_testutil.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "testing/files.h"
#include "tools/recipe/corpus.h"

namespace keel::tools::recipe {

const std::string& PangramCorpus() {
  static const std::string* const prefix = [] {
    const std::string dir = keel::testing::NewTempDir("corpus");
    std::string text;
    for (int i = 0; i < 200; ++i) {
      absl::StrAppend(&text, "Line ", i, ": pack my box with five dozen liquor jugs.\n\n");
    }
    keel::testing::WriteFileOrFail(dir + "/text.txt", text);
    auto* path = new std::string(dir + "/corpus");
    const auto built = BuildByteCorpus({dir + "/text.txt"}, *path);
    EXPECT_TRUE(built.ok()) << built.status();
    return path;
  }();
  return *prefix;
}

}  // namespace keel::tools::recipe
