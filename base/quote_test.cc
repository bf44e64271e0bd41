#include "base/quote.h"

#include <string>

#include "gtest/gtest.h"

namespace keel::base {
namespace {

TEST(QuoteTest, QuoteEscapesAndCuts) {
  EXPECT_EQ(Quote("model.embed_tokens.weight"), "\"model.embed_tokens.weight\"");
  EXPECT_EQ(Quote("a\nb\x1b[31m"), "\"a\\nb\\u001b[31m\"");
  EXPECT_EQ(Quote(std::string(500, 'x')), "\"" + std::string(199, 'x') + "...");
}

TEST(QuoteTest, PrintableEscapesEveryByteOutsidePrintableAscii) {
  EXPECT_EQ(Printable("Expected identifier, got: \"x\""), "Expected identifier, got: \"x\"");
  EXPECT_EQ(Printable(std::string("MMIDIDX\0\0", 9)), "MMIDIDX\\x00\\x00");
  EXPECT_EQ(Printable("\xc3\xa9\x7f\x1b\\ ~"), "\\xc3\\xa9\\x7f\\x1b\\x5c ~");
}

TEST(QuoteTest, ShapeString) {
  EXPECT_EQ(ShapeString({}), "[]");
  EXPECT_EQ(ShapeString({2, 3}), "[2, 3]");
}

}  // namespace
}  // namespace keel::base
