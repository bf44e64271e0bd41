// What the tests of conversations (data.format "sft") share: conversations written as
// tools/scripts/hf_sft_tokenize.py writes them, and those of the fixture
// testdata/hf_parity/llama_gqa_untied_sft with transformers' answer-only losses on them.
//
//   const SftFixture fixture = ReadSftFixture();
//   const std::string prefix = WriteConversations("chat", fixture.conversations);
#ifndef KEEL_TOOLS_SFT_TESTUTIL_H_
#define KEEL_TOOLS_SFT_TESTUTIL_H_

#include <cstdint>
#include <string>
#include <vector>

namespace keel::tools {

// One conversation: its token ids and, per token, 1 where it is learned (not shifted).
struct TestConversation {
  std::vector<int64_t> tokens;
  std::vector<int64_t> learned;
};

// Writes `conversations` (tokens uint16, the mask uint8 beside them) under a new temporary
// directory named after `name`; their prefix. Fails the test on an error.
std::string WriteConversations(const std::string& name,
                               const std::vector<TestConversation>& conversations);

// The fixture's conversations and what transformers computed on them with llama_gqa_untied:
// each conversation's summed loss over its learned tokens and their count, and the whole
// answer-only loss (the sums over the counts).
struct SftFixture {
  std::vector<TestConversation> conversations;
  std::vector<double> loss_sums;
  std::vector<int64_t> label_tokens;
  double loss = 0;
};
SftFixture ReadSftFixture();

}  // namespace keel::tools

#endif  // KEEL_TOOLS_SFT_TESTUTIL_H_
