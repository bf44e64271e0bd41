#include "sampling/conversation_dataset.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sampling/indexed_dataset_writer.h"
#include "testing/files.h"
#include "testing/status_matchers.h"

namespace keel::sampling {
namespace {

using ::keel::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr auto kDataLoss = absl::StatusCode::kDataLoss;

using Documents = std::vector<std::vector<std::vector<int64_t>>>;  // documents of sequences

std::string TempPrefix(const std::string& name) {
  static const std::string* const dir = new std::string(keel::testing::NewTempDir("chats"));
  return absl::StrCat(*dir, "/", name);
}

void Write(const std::string& prefix, TokenDtype dtype, const Documents& documents) {
  KEEL_ASSERT_OK_AND_ASSIGN(auto writer, IndexedDatasetWriter::Create(prefix, dtype));
  for (const auto& document : documents) {
    for (const auto& sequence : document) KEEL_ASSERT_OK(writer.AddItem(sequence));
    writer.EndDocument();
  }
  KEEL_ASSERT_OK(writer.Finalize());
}

// Writes the tokens at `name` (uint16) and the mask beside it (uint8), one conversation per
// document; returns the prefix.
std::string WriteConversations(const std::string& name, const Documents& tokens,
                               const Documents& mask, TokenDtype mask_dtype = TokenDtype::kUint8) {
  const std::string prefix = TempPrefix(name);
  Write(prefix, TokenDtype::kUint16, tokens);
  Write(ConversationDataset::LossMaskPrefix(prefix), mask_dtype, mask);
  return prefix;
}

std::vector<int64_t> ToVector(const at::Tensor& t) {
  const at::Tensor longs = t.to(at::kLong).contiguous();
  return std::vector<int64_t>(longs.data_ptr<int64_t>(), longs.data_ptr<int64_t>() + longs.numel());
}

const Documents kTokens = {{{1, 7, 8, 2}}, {{1, 9, 2}}, {{1, 5, 6, 7, 2}}};
const Documents kMask = {{{0, 1, 1, 1}}, {{0, 0, 1}}, {{0, 0, 1, 0, 1}}};

TEST(ConversationDatasetTest, GivesEachConversationsTokensAndMask) {
  const std::string prefix = WriteConversations("three", kTokens, kMask);
  KEEL_ASSERT_OK_AND_ASSIGN(auto chats, ConversationDataset::Open(prefix));
  EXPECT_EQ(chats.size(), 3);
  EXPECT_EQ(chats.num_tokens(), 12);
  EXPECT_EQ(chats.num_learned_tokens(), 3 + 1 + 2);
  EXPECT_EQ(chats.length(2), 5);
  KEEL_ASSERT_OK_AND_ASSIGN(Conversation c, chats.Get(2));
  EXPECT_EQ(c.tokens.scalar_type(), at::kLong);
  EXPECT_EQ(c.loss_mask.scalar_type(), at::kBool);
  EXPECT_THAT(ToVector(c.tokens), ElementsAre(1, 5, 6, 7, 2));
  EXPECT_THAT(ToVector(c.loss_mask), ElementsAre(0, 0, 1, 0, 1));
  KEEL_ASSERT_OK_AND_ASSIGN(c, chats.Get(0));
  EXPECT_THAT(ToVector(c.tokens), ElementsAre(1, 7, 8, 2));
  EXPECT_THAT(ToVector(c.loss_mask), ElementsAre(0, 1, 1, 1));
}

TEST(ConversationDatasetTest, WidensInt32Tokens) {
  const std::string prefix = TempPrefix("int32");
  Write(prefix, TokenDtype::kInt32, {{{70000, 3}}});
  Write(ConversationDataset::LossMaskPrefix(prefix), TokenDtype::kUint8, {{{0, 1}}});
  KEEL_ASSERT_OK_AND_ASSIGN(auto chats, ConversationDataset::Open(prefix));
  KEEL_ASSERT_OK_AND_ASSIGN(Conversation c, chats.Get(0));
  EXPECT_THAT(ToVector(c.tokens), ElementsAre(70000, 3));
}

TEST(ConversationDatasetTest, RefusesAnIndexOutsideTheDataset) {
  const std::string prefix = WriteConversations("range", kTokens, kMask);
  KEEL_ASSERT_OK_AND_ASSIGN(auto chats, ConversationDataset::Open(prefix));
  EXPECT_THAT(chats.Get(3), StatusIs(absl::StatusCode::kOutOfRange,
                                     HasSubstr("conversation 3 is outside [0, 3)")));
  EXPECT_THAT(chats.Get(-1), StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("conversation -1")));
}

TEST(ConversationDatasetTest, NamesAMissingMask) {
  const std::string prefix = TempPrefix("no_mask");
  Write(prefix, TokenDtype::kUint16, kTokens);
  EXPECT_THAT(ConversationDataset::Open(prefix),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(prefix + "_loss_mask.idx")));
}

TEST(ConversationDatasetTest, RefusesAMaskThatIsNotUint8) {
  const std::string prefix = WriteConversations("mask_uint16", kTokens, kMask, TokenDtype::kUint16);
  EXPECT_THAT(ConversationDataset::Open(prefix),
              StatusIs(kDataLoss, AllOf(HasSubstr(prefix + "_loss_mask.idx"),
                                        HasSubstr("dtype uint16"), HasSubstr("uint8"))));
}

TEST(ConversationDatasetTest, RefusesFloatingPointTokens) {
  const std::string prefix = TempPrefix("float");
  Write(prefix, TokenDtype::kFloat32, {{{1, 2}}});
  Write(ConversationDataset::LossMaskPrefix(prefix), TokenDtype::kUint8, {{{0, 1}}});
  EXPECT_THAT(ConversationDataset::Open(prefix),
              StatusIs(kDataLoss, AllOf(HasSubstr(prefix + ".idx"), HasSubstr("float32"))));
}

TEST(ConversationDatasetTest, RefusesADocumentOfSeveralSequences) {
  // Tokens: one document of two sequences.
  const std::string tokens =
      WriteConversations("two_sequences", {{{1, 2}, {3}}}, {{{0, 1}}, {{1}}});
  EXPECT_THAT(ConversationDataset::Open(tokens),
              StatusIs(kDataLoss, AllOf(HasSubstr(tokens + ".idx"), HasSubstr("1 documents of 2"),
                                        HasSubstr("one sequence per document"))));
  // The mask: as many sequences as the tokens, in fewer documents.
  const std::string mask =
      WriteConversations("mask_two_sequences", {{{1, 2}}, {{3}}}, {{{0, 1}, {1}}});
  EXPECT_THAT(ConversationDataset::Open(mask),
              StatusIs(kDataLoss, AllOf(HasSubstr(mask + "_loss_mask.idx"),
                                        HasSubstr("one sequence per document"))));
}

TEST(ConversationDatasetTest, RefusesADifferentNumberOfConversations) {
  const std::string prefix = WriteConversations("count", kTokens, {{{0, 1, 1, 1}}, {{0, 0, 1}}});
  EXPECT_THAT(ConversationDataset::Open(prefix),
              StatusIs(kDataLoss, AllOf(HasSubstr(prefix + "_loss_mask.idx: 2 conversations"),
                                        HasSubstr(prefix + ".idx has 3"))));
}

TEST(ConversationDatasetTest, RefusesADifferentLength) {
  const std::string prefix =
      WriteConversations("length", kTokens, {{{0, 1, 1, 1}}, {{0, 0, 1, 1}}, {{0, 0, 1, 0, 1}}});
  EXPECT_THAT(ConversationDataset::Open(prefix),
              StatusIs(kDataLoss, AllOf(HasSubstr(prefix + "_loss_mask.idx: conversation 1 has 4"),
                                        HasSubstr("gives it 3 tokens"))));
}

TEST(ConversationDatasetTest, NamesAMaskValueOtherThanZeroOrOne) {
  const std::string prefix =
      WriteConversations("value", kTokens, {{{0, 1, 1, 1}}, {{0, 0, 1}}, {{0, 0, 1, 2, 1}}});
  EXPECT_THAT(ConversationDataset::Open(prefix),
              StatusIs(kDataLoss, AllOf(HasSubstr(prefix + "_loss_mask.bin: conversation 2"),
                                        HasSubstr("value 2 at position 3"))));
}

}  // namespace
}  // namespace keel::sampling
