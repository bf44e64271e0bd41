#include "base/json.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include "base/enum.h"
#include "base/fields.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace keel::base {

enum class Shape { kRound, kSquare };
inline constexpr EnumSpelling<Shape> kShapeSpellings[] = {{Shape::kRound, "round"},
                                                          {Shape::kSquare, "square"}};
bool AbslParseFlag(absl::string_view text, Shape* out, std::string* error) {
  return ParseEnum(kShapeSpellings, text, out, error);
}
std::string AbslUnparseFlag(Shape shape) { return std::string(EnumName(kShapeSpellings, shape)); }

namespace {

using ::keel::testing::StatusIs;
using ::testing::HasSubstr;

struct Options {
  double rate = 0.5;
  int64_t steps = 3;
  bool enabled = false;
  std::optional<int64_t> limit;
  Shape shape = Shape::kRound;
};

template <typename O, typename V, IsFieldsOf<O, Options> = 0>
void VisitFields(O& o, V&& v) {
  v("rate", o.rate);
  v("steps", o.steps);
  v("enabled", o.enabled);
  v("limit", o.limit);
  v("shape", o.shape);
}

TEST(JsonTest, ReadsEveryFieldKindAndKeepsAbsentDefaults) {
  KEEL_ASSERT_OK_AND_ASSIGN(Json json, ParseJson(R"({"rate": 2, "limit": 7, "shape": "square"})"));
  Options options;
  KEEL_ASSERT_OK(ReadJsonFields(json, options));
  EXPECT_EQ(options.rate, 2.0);  // an integer is accepted for a double field
  EXPECT_EQ(options.steps, 3);
  EXPECT_EQ(options.limit, 7);
  EXPECT_EQ(options.shape, Shape::kSquare);
}

TEST(JsonTest, WriteThenReadRoundTripsIncludingNonFiniteAndNull) {
  Options options;
  options.rate = -std::numeric_limits<double>::infinity();
  options.enabled = true;
  Json json = WriteJsonFields(options);
  EXPECT_EQ(json.dump(),
            R"({"rate":"-inf","steps":3,"enabled":true,"limit":null,"shape":"round"})");
  Options back;
  back.limit = 1;
  KEEL_ASSERT_OK(ReadJsonFields(json, back));
  EXPECT_TRUE(std::isinf(back.rate));
  EXPECT_EQ(back.limit, std::nullopt);
  EXPECT_TRUE(back.enabled);
}

TEST(JsonTest, ShortestRoundTripDoublesLikePythonRepr) {
  EXPECT_EQ(DoubleToJson(0.1).dump(), "0.1");
  EXPECT_EQ(DoubleToJson(0.10000000000000002).dump(), "0.10000000000000002");
  KEEL_ASSERT_OK_AND_ASSIGN(Json json, ParseJson("[0.059095584794513066]"));
  EXPECT_EQ(json[0].get<double>(), 0.059095584794513066);
}

TEST(JsonTest, ErrorsNameTheFieldAndTheAllowedValues) {
  Options options;
  EXPECT_THAT(ReadJsonFields(Json::parse(R"({"steps": 1.5})"), options, "inputs."),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("inputs.steps must be an integer, got 1.5")));
  EXPECT_THAT(ReadJsonFields(Json::parse(R"({"shape": "oval"})"), options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(R"(shape: "oval" is not one of "round", "square")")));
  EXPECT_THAT(
      ReadJsonFields(Json::parse(R"({"enabled": 1})"), options),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("enabled must be true or false")));
  EXPECT_THAT(ReadJsonFields(Json::parse(R"({"rate": "fast"})"), options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rate must be a number")));
  EXPECT_THAT(
      ReadJsonFields(Json::parse("[1]"), options, "inputs"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("inputs must be a JSON object")));
}

TEST(JsonTest, SyntaxErrorsAndMissingFilesAreStatuses) {
  EXPECT_THAT(ParseJson("{\"a\": }"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("invalid JSON")));
  EXPECT_THAT(ReadJsonFile("/nonexistent/keel.json"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("/nonexistent/keel.json")));
}

TEST(JsonTest, NumbersBeyondADoubleAreErrorsNotExceptions) {
  // nlohmann throws out_of_range, not parse_error, for these; both used to end the process.
  for (const char* text : {R"({"rms_norm_eps": 1e400})", "[-1e400]", "1E+999"}) {
    EXPECT_THAT(ParseJson(text),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("number overflow parsing")))
        << text;
  }
  KEEL_ASSERT_OK_AND_ASSIGN(Json tiny, ParseJson("[1e-400, 1.7976931348623157e308]"));
  EXPECT_EQ(tiny[0].get<double>(), 0.0);  // underflow is zero, as in Python
  EXPECT_EQ(tiny[1].get<double>(), std::numeric_limits<double>::max());
}

TEST(JsonTest, NestingIsBoundedAtTheLimitAndDeeperTextIsRefused) {
  const auto nested = [](int depth) {
    return std::string(depth, '[') + "1" + std::string(depth, ']');
  };
  KEEL_ASSERT_OK_AND_ASSIGN(Json deepest, ParseJson(nested(kMaxJsonDepth)));
  EXPECT_EQ(deepest.dump(), nested(kMaxJsonDepth));
  KEEL_EXPECT_OK(ParseJson(R"({"a": )" + nested(kMaxJsonDepth - 1) + "}"));
  for (const std::string& text :
       {nested(kMaxJsonDepth + 1), R"({"a": )" + nested(kMaxJsonDepth) + "}",
        std::string(kMaxJsonDepth + 1, '[') + std::string(kMaxJsonDepth + 1, ']'),
        // A million levels parsed, destroyed or printed recursively overflow the stack.
        nested(1'000'000)}) {
    EXPECT_THAT(ParseJson(text),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("arrays and objects nest deeper than 1000 levels")));
  }
  // Unbalanced text deeper than the limit is refused either way, never walked.
  EXPECT_THAT(ParseJson(std::string(1'000'000, '{')),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("invalid JSON")));
}

TEST(JsonTest, IntegersPastInt64AreRefusedNotWrapped) {
  int64_t out = 0;
  KEEL_ASSERT_OK_AND_ASSIGN(Json json, ParseJson("[9223372036854775807, -9223372036854775808, "
                                                 "9223372036854775808, 18446744073709551615]"));
  KEEL_ASSERT_OK(FromJson(json[0], "a", out));
  EXPECT_EQ(out, std::numeric_limits<int64_t>::max());
  KEEL_ASSERT_OK(FromJson(json[1], "b", out));
  EXPECT_EQ(out, std::numeric_limits<int64_t>::min());
  EXPECT_THAT(FromJson(json[2], "c", out),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("c is 9223372036854775808, past the largest integer")));
  EXPECT_THAT(FromJson(json[3], "d", out),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("d is 18446744073709551615, past the largest integer")));
  EXPECT_EQ(out, std::numeric_limits<int64_t>::min());  // untouched by the refusals
}

}  // namespace
}  // namespace keel::base
