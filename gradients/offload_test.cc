#include "gradients/offload.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"
#include "torch/cuda.h"
#include "torch/nn/modules/batchnorm.h"

namespace keel::gradients {
namespace {

using ::absl::StatusCode;
using ::keel::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(OffloadTest, DisabledOffloadingLeavesTheModuleAlone) {
  torch::nn::BatchNorm1d module(4);
  {
    KEEL_ASSERT_OK_AND_ASSIGN(auto scope,
                              ScopedModuleOffloading::Enter(*module, /*enabled=*/false));
    EXPECT_TRUE(module->weight.device().is_cpu());
    KEEL_EXPECT_OK(scope.Exit());
  }
  EXPECT_TRUE(module->running_mean.device().is_cpu());
}

// LibTorch refuses to move parameters in place to the meta device (set_data across tensor
// types); the refusal comes back as a status naming the device instead of an exception. (The
// moves that succeed need a second device: OffloadGpuTest.)
TEST(OffloadTest, AMoveLibTorchRefusesIsAnErrorNamingTheDevice) {
  torch::nn::BatchNorm1d module(4);
  EXPECT_THAT(MoveToDevice(*module, c10::Device(c10::DeviceType::Meta)),
              StatusIs(StatusCode::kInternal,
                       AllOf(HasSubstr("moving the module to meta"), HasSubstr("set_data"))));
}

TEST(OffloadTest, EnabledOffloadingWithoutCudaIsAClearError) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "this machine has CUDA";
  torch::nn::BatchNorm1d module(4);
  EXPECT_THAT(ScopedModuleOffloading::Enter(*module, /*enabled=*/true),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("has no CUDA")));
}

TEST(OffloadGpuTest, RoundTripsTheModuleThroughCuda) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a GPU";
  torch::nn::BatchNorm1d module(4);
  {
    KEEL_ASSERT_OK_AND_ASSIGN(auto scope, ScopedModuleOffloading::Enter(*module, /*enabled=*/true));
    EXPECT_TRUE(module->weight.device().is_cuda());
    EXPECT_TRUE(module->running_mean.device().is_cuda());
  }
  EXPECT_TRUE(module->weight.device().is_cpu());
  EXPECT_TRUE(module->running_mean.device().is_cpu());
}

}  // namespace
}  // namespace keel::gradients
