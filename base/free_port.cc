#include "base/free_port.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <random>

#include "absl/strings/str_cat.h"
#include "base/files.h"

namespace keel::base {
namespace {

// Binds `port` on 127.0.0.1 (0: one the kernel chooses) and closes it again: the port bound,
// or the error (EADDRINUSE for a taken one).
absl::StatusOr<int> BindAndRelease(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return ErrnoError("opening a socket", "");
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t length = sizeof(address);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    const absl::Status status = ErrnoError("binding a port on", absl::StrCat("127.0.0.1:", port));
    ::close(fd);
    return status;
  }
  ::close(fd);
  return ntohs(address.sin_port);
}

}  // namespace

absl::StatusOr<int> PickFreePort() {
  int64_t ephemeral_low = 32768;
  if (std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range"); range) range >> ephemeral_low;
  const int64_t low = std::max<int64_t>(1024, ephemeral_low - 10000);
  if (ephemeral_low - low < 1000) return BindAndRelease(0);
  std::mt19937_64 random(std::random_device{}());
  for (int attempt = 0; attempt < 200; ++attempt) {
    const auto port = static_cast<int>(
        low + static_cast<int64_t>(random() % static_cast<uint64_t>(ephemeral_low - low)));
    if (absl::StatusOr<int> bound = BindAndRelease(port); bound.ok()) return bound;
  }
  return BindAndRelease(0);
}

}  // namespace keel::base
