#include "base/utf8.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace keel::base {
namespace {

TEST(FirstInvalidUtf8Test, FindsTheFirstByteThatIsNotUtf8) {
  const std::vector<std::pair<std::string, std::optional<size_t>>> cases = {
      {"", std::nullopt},
      {"plain ascii", std::nullopt},
      {"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", std::nullopt},  // é € 😀
      {"ab\xff", 2},                                                // never a lead byte
      {"a\xc3", 1},                                                 // cut short
      {"a\xc3(", 1},                                                // not a continuation
      {"\xc0\xaf", 0},                                              // overlong '/'
      {"x\xed\xa0\x80", 1},                                         // surrogate U+D800
      {"\xf4\x90\x80\x80", 0},                                      // past U+10FFFF
      {"ok\xf4\x8f\xbf\xbf", std::nullopt},                         // U+10FFFF itself
  };
  for (const auto& [text, expected] : cases) EXPECT_EQ(FirstInvalidUtf8(text), expected) << text;
}

}  // namespace
}  // namespace keel::base
