// A TCP port on 127.0.0.1 for a store that binds it later (a launcher's rank 0, a test's
// ranks), chosen so that nothing but another listener asking for it by number takes it in
// between: a random free port below the kernel's ephemeral range. The kernel's own choice for
// port 0 (torchrun's get_free_port) comes from that range, where any outgoing connection can
// take it before the store binds it (EADDRINUSE at the rendezvous, seen under many concurrent
// multi-rank tests).
//
//   KEEL_ASSIGN_OR_RETURN(int port, keel::base::PickFreePort());
#ifndef KEEL_BASE_FREE_PORT_H_
#define KEEL_BASE_FREE_PORT_H_

#include "absl/status/statusor.h"

namespace keel::base {

// A port free when it was tried: at random from the 10000 below the ephemeral range
// (/proc/sys/net/ipv4/ip_local_port_range), or the kernel's choice when no room is left below
// it or 200 tries found none. Errors: the socket's (base::ErrnoError).
[[nodiscard]] absl::StatusOr<int> PickFreePort();

}  // namespace keel::base

#endif  // KEEL_BASE_FREE_PORT_H_
