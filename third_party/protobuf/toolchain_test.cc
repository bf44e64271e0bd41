#include <string>

#include "gtest/gtest.h"
#include "third_party/protobuf/toolchain_test.pb.h"

namespace {

TEST(ProtobufToolchainTest, GeneratedMessageRoundTripsThroughWireFormat) {
  keel::third_party::ToolchainProbe probe;
  probe.set_name("layer.weight");
  probe.add_shape(3);
  probe.add_shape(5);
  probe.mutable_written()->set_seconds(1700000000);

  std::string wire;
  ASSERT_TRUE(probe.SerializeToString(&wire));
  keel::third_party::ToolchainProbe parsed;
  ASSERT_TRUE(parsed.ParseFromString(wire));

  EXPECT_EQ(parsed.name(), "layer.weight");
  ASSERT_EQ(parsed.shape_size(), 2);
  EXPECT_EQ(parsed.shape(1), 5);
  EXPECT_EQ(parsed.written().seconds(), 1700000000);
}

}  // namespace
