#include <chrono>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "torch/csrc/distributed/c10d/HashStore.hpp"
#include "torch/csrc/distributed/c10d/ProcessGroupGloo.hpp"
#include "torch/types.h"

namespace {

TEST(C10dGlooTest, TwoRanksAllReduceOverAHashStore) {
  constexpr int kWorldSize = 2;
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<double> results(kWorldSize);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < kWorldSize; ++rank) {
    ranks.emplace_back([&, rank] {
      auto options = c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(20));
      options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
      c10d::ProcessGroupGloo group(store, rank, kWorldSize, options);
      std::vector<at::Tensor> tensors = {
          torch::full({3}, static_cast<double>(rank + 1), torch::kFloat64)};
      group.allreduce(tensors)->wait();
      results[rank] = tensors[0][2].item<double>();
    });
  }
  for (std::thread& rank : ranks) rank.join();
  EXPECT_EQ(results[0], 3.0);  // 1 + 2
  EXPECT_EQ(results[1], 3.0);
}

}  // namespace
