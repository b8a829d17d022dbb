// HOST:PORT addresses as the flags give them: checked at start-up, so a
// typo is an error at once rather than an endless "can't connect".
//
// Thread-safe: pure functions.
#ifndef DDP_COMMON_NET_ADDRESS_H_
#define DDP_COMMON_NET_ADDRESS_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ddp {

struct HostPort {
  // A name or an address; an IPv6 address without its brackets.
  std::string host;
  int port = 0;
};

// Parses "host:port", "[ipv6]:port", or gRPC's "dns:///host:port" and
// "ipv4:host:port" / "ipv6:[addr]:port" forms. The port is 1-65535 (0 too
// when `allow_port_zero`: a listener picking a free port); the host is a
// name of letters, digits, '-', '_' and '.', or an IP address.
// INVALID_ARGUMENT says what is wrong.
absl::StatusOr<HostPort> ParseHostPort(absl::string_view address, bool allow_port_zero = false);

// Whether `host` can only be reached from this machine: 127.0.0.0/8, ::1,
// or "localhost". 0.0.0.0, :: and every other name are not.
bool IsLoopbackHost(absl::string_view host);

// Whether a gRPC listen or target address stays on this machine: a
// loopback HOST:PORT, or a unix-domain socket ("unix:PATH").
bool IsLocalAddress(absl::string_view address);

// "host:port", with brackets around an IPv6 address.
std::string JoinHostPort(absl::string_view host, int port);

// Whether `host` is a listener's "any address" (0.0.0.0, ::, or empty),
// which no client can dial.
bool IsWildcardHost(absl::string_view host);

}  // namespace ddp

#endif  // DDP_COMMON_NET_ADDRESS_H_
