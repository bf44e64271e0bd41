// An asynchronous save of CUDA tensors writes the values they had when Save was called, even
// when the device-to-host copies are still queued behind other work as Save returns and the
// weights change right after it. Skips without a GPU.
#include <memory>
#include <string>

#include "ATen/ATen.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_testutil.h"
#include "checkpoint/reader.h"
#include "gtest/gtest.h"
#include "testing/files.h"
#include "testing/status_matchers.h"
#include "torch/cuda.h"

namespace keel::checkpoint {
namespace {

using ::keel::checkpoint::testing::TensorsState;

TEST(CheckpointGpuTest, AsyncSaveWritesTheValuesOfTheMomentSaveWasCalled) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a GPU";
  CheckpointerOptions options;
  options.checkpoint_dir = keel::testing::NewTempDir("gpu_async");
  options.is_async = true;
  KEEL_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Checkpointer> checkpointer,
                            Checkpointer::Create(options, /*group=*/nullptr));
  TensorsState state;
  const at::Tensor weights = at::zeros({64 << 20}, at::TensorOptions(at::kCUDA));  // 256 MiB
  state.tensors["w"] = {weights};
  const at::Tensor a = at::randn({4096, 4096}, at::TensorOptions(at::kCUDA));
  for (int step = 1; step <= 4; ++step) {
    // Queue tens of milliseconds of work, then the values to save, so that the copies Save
    // queues next are still waiting when it returns and its writer thread starts.
    at::Tensor busy = a;
    for (int i = 0; i < 8; ++i) busy = at::matmul(busy, a).tanh_();
    weights.fill_(step);
    KEEL_ASSERT_OK(checkpointer->Save({{"model", &state}}, step, /*epoch=*/0));
    weights.fill_(-1);  // the training goes on at once
    KEEL_ASSERT_OK(checkpointer->Wait());
    KEEL_ASSERT_OK_AND_ASSIGN(std::unique_ptr<CheckpointReader> reader,
                              CheckpointReader::Open(*checkpointer->last_saved()));
    KEEL_ASSERT_OK_AND_ASSIGN(at::Tensor saved, reader->ReadTensor("model/w"));
    EXPECT_TRUE(saved.eq(step).all().item<bool>()) << "step " << step;
  }
}

}  // namespace
}  // namespace keel::checkpoint
