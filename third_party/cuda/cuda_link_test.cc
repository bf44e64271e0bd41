#include <cuda_runtime_api.h>
#include <nccl.h>

#include "gtest/gtest.h"

namespace {

TEST(CudaLinkTest, RuntimeVersionMatchesHeaders) {
  int version = 0;
  ASSERT_EQ(cudaRuntimeGetVersion(&version), cudaSuccess);
  EXPECT_EQ(version, CUDART_VERSION);
}

TEST(CudaLinkTest, NcclVersionMatchesHeaders) {
  int version = 0;
  ASSERT_EQ(ncclGetVersion(&version), ncclSuccess);
  EXPECT_EQ(version, NCCL_VERSION_CODE);
}

}  // namespace
