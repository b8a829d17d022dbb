#include "common/net_address.h"

#include <arpa/inet.h>

#include <cstdint>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace ddp {
namespace {

// Echoed addresses are cut short: the flag may be anything.
std::string Quote(absl::string_view s) {
  return absl::StrCat("\"", absl::CHexEscape(s.substr(0, 100)), s.size() > 100 ? "..." : "", "\"");
}

bool IsName(absl::string_view host) {
  if (host.empty() || host.size() > 253) return false;
  for (char c : host) {
    if (!absl::ascii_isalnum(c) && c != '-' && c != '.' && c != '_') return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<HostPort> ParseHostPort(absl::string_view address, bool allow_port_zero) {
  absl::string_view rest = address;
  for (absl::string_view scheme : {"dns:///", "ipv4:", "ipv6:"}) {
    if (absl::ConsumePrefix(&rest, scheme)) break;
  }
  const std::string usage =
      absl::StrCat(Quote(address), " is not HOST:PORT (e.g. 10.0.0.1:29400, [fd00::1]:29400)");
  HostPort out;
  absl::string_view port;
  if (absl::ConsumePrefix(&rest, "[")) {
    const size_t close = rest.find(']');
    if (close == absl::string_view::npos || rest.substr(close + 1, 1) != ":") {
      return absl::InvalidArgumentError(usage);
    }
    out.host = std::string(rest.substr(0, close));
    port = rest.substr(close + 2);
    in6_addr v6;
    if (::inet_pton(AF_INET6, out.host.c_str(), &v6) != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(usage, ": ", Quote(out.host), " is not an IPv6 address"));
    }
  } else {
    const size_t colon = rest.rfind(':');
    if (colon == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(usage, ": no port"));
    }
    out.host = std::string(rest.substr(0, colon));
    port = rest.substr(colon + 1);
    if (out.host.find("://") != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(usage, ": no URL scheme (http://...), just HOST:PORT"));
    }
    if (out.host.find(':') != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(usage, ": write an IPv6 address in brackets, [addr]:port"));
    }
    if (!IsName(out.host)) {
      return absl::InvalidArgumentError(absl::StrCat(
          usage, ": the host must be a name or an address (letters, digits, '-', '.')"));
    }
  }
  uint32_t number = 0;
  if (port.empty() || !absl::ascii_isdigit(port[0]) || !absl::SimpleAtoi(port, &number) ||
      number > 65535 || (number == 0 && !allow_port_zero)) {
    return absl::InvalidArgumentError(absl::StrCat(usage, ": the port must be a number from ",
                                                   allow_port_zero ? 0 : 1, " to 65535"));
  }
  out.port = static_cast<int>(number);
  return out;
}

bool IsLoopbackHost(absl::string_view host) {
  if (absl::EqualsIgnoreCase(host, "localhost")) return true;
  const std::string h(host);
  in_addr v4;
  if (::inet_pton(AF_INET, h.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6;
  if (::inet_pton(AF_INET6, h.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    // ::ffff:127.x.y.z
    return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
  }
  return false;
}

bool IsLocalAddress(absl::string_view address) {
  if (absl::StartsWith(address, "unix:") || absl::StartsWith(address, "unix-abstract:")) {
    return true;
  }
  absl::StatusOr<HostPort> parsed = ParseHostPort(address, /*allow_port_zero=*/true);
  return parsed.ok() && IsLoopbackHost(parsed->host);
}

std::string JoinHostPort(absl::string_view host, int port) {
  if (absl::StrContains(host, ':')) return absl::StrCat("[", host, "]:", port);
  return absl::StrCat(host, ":", port);
}

bool IsWildcardHost(absl::string_view host) {
  return host.empty() || host == "0.0.0.0" || host == "::";
}

}  // namespace ddp
