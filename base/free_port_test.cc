#include "base/free_port.h"

#include <fstream>
#include <set>

#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace keel::base {
namespace {

// Below the ephemeral range, where no outgoing connection takes it, and spread out so that
// concurrent launchers rarely meet.
TEST(PickFreePortTest, APortBelowTheEphemeralRange) {
  int64_t ephemeral_low = 32768;
  if (std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range"); range) range >> ephemeral_low;
  std::set<int> ports;
  for (int i = 0; i < 20; ++i) {
    KEEL_ASSERT_OK_AND_ASSIGN(const int port, PickFreePort());
    EXPECT_GE(port, 1024);
    if (ephemeral_low >= 11024) {
      EXPECT_LT(port, ephemeral_low);
      EXPECT_GE(port, ephemeral_low - 10000);
    }
    ports.insert(port);
  }
  EXPECT_GT(ports.size(), 10u);
}

}  // namespace
}  // namespace keel::base
