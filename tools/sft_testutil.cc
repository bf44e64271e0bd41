#include "tools/sft_testutil.h"

#include <map>
#include <utility>

#include "ATen/ATen.h"
#include "checkpoint/safetensors.h"
#include "gtest/gtest.h"
#include "sampling/conversation_dataset.h"
#include "sampling/indexed_dataset_writer.h"
#include "testing/files.h"

namespace keel::tools {

std::string WriteConversations(const std::string& name,
                               const std::vector<TestConversation>& conversations) {
  const std::string prefix = keel::testing::NewTempDir(name) + "/chat";
  for (const bool mask : {false, true}) {
    absl::StatusOr<sampling::IndexedDatasetWriter> writer = sampling::IndexedDatasetWriter::Create(
        mask ? sampling::ConversationDataset::LossMaskPrefix(prefix) : prefix,
        mask ? sampling::TokenDtype::kUint8 : sampling::TokenDtype::kUint16);
    EXPECT_TRUE(writer.ok()) << writer.status();
    if (!writer.ok()) return prefix;
    for (const TestConversation& conversation : conversations) {
      const std::vector<int64_t>& values = mask ? conversation.learned : conversation.tokens;
      EXPECT_TRUE(writer->AddDocument(values, {static_cast<int64_t>(values.size())}).ok());
    }
    EXPECT_TRUE(writer->Finalize().ok());
  }
  return prefix;
}

SftFixture ReadSftFixture() {
  SftFixture fixture;
  absl::StatusOr<std::vector<std::pair<std::string, at::Tensor>>> read =
      checkpoint::ReadSafetensorsFile(
          "testdata/hf_parity/llama_gqa_untied_sft/expected.safetensors");
  EXPECT_TRUE(read.ok()) << read.status();
  if (!read.ok()) return fixture;
  const std::map<std::string, at::Tensor> expected(read->begin(), read->end());
  fixture.loss = expected.at("loss").item<double>();
  for (int64_t c = 0; c < expected.at("lengths").size(0); ++c) {
    const int64_t n = expected.at("lengths")[c].item<int64_t>();
    const at::Tensor ids = expected.at("input_ids")[c].narrow(0, 0, n).contiguous();
    const at::Tensor mask = expected.at("assistant_masks")[c].narrow(0, 0, n).contiguous();
    fixture.conversations.push_back({{ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + n},
                                     {mask.data_ptr<int64_t>(), mask.data_ptr<int64_t>() + n}});
    fixture.loss_sums.push_back(expected.at("loss_sum")[c].item<double>());
    fixture.label_tokens.push_back(expected.at("label_tokens")[c].item<int64_t>());
  }
  return fixture;
}

}  // namespace keel::tools
