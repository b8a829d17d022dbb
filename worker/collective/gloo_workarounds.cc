// Two ways a peer that dies or aborts can take a healthy Gloo process down
// with it, and what we do about each.
//
// 1. Gloo writes to its sockets without MSG_NOSIGNAL: a write to a peer that
//    has closed raises SIGPIPE, whose default action ends the process. We
//    ignore SIGPIPE; the write then fails with EPIPE, and the collective
//    fails the normal way.
// 2. Right after accept(), Gloo asks getpeername() for the peer's address
//    (Pair::handleConnected). If the peer reset the connection in between
//    (it was killed, or aborted its generation, while the full mesh was
//    still connecting), getpeername() fails with ENOTCONN, Gloo throws on
//    its event-loop thread, and std::terminate ends the process. Our
//    getpeername() below interposes libc's (symbols the executable defines
//    come first for the shared libraries it loads): for that one failure it
//    answers the unspecified address of the socket's family instead, so Gloo
//    goes on, finds the reset on its first read, and fails the pair with an
//    error our communicator returns as UNAVAILABLE. Every other call is
//    libc's, unchanged.
#include "worker/collective/gloo_workarounds.h"

#include <dlfcn.h>
#include <signal.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>

namespace ddp {

void PrepareProcessForGloo() {
  static std::once_flag once;
  std::call_once(once, [] { ::signal(SIGPIPE, SIG_IGN); });
}

}  // namespace ddp

extern "C" int getpeername(int fd, struct sockaddr* addr, socklen_t* len) {
  using Fn = int (*)(int, struct sockaddr*, socklen_t*);
  static const Fn libc = reinterpret_cast<Fn>(::dlsym(RTLD_NEXT, "getpeername"));
  const int rv = libc(fd, addr, len);
  if (rv == 0 || errno != ENOTCONN || addr == nullptr || len == nullptr) return rv;
  struct sockaddr_storage self = {};
  socklen_t self_len = sizeof(self);
  if (::getsockname(fd, reinterpret_cast<struct sockaddr*>(&self), &self_len) != 0 ||
      (self.ss_family != AF_INET && self.ss_family != AF_INET6)) {
    errno = ENOTCONN;
    return -1;
  }
  // The family's unspecified address and port 0, as long as the caller's
  // buffer allows.
  struct sockaddr_storage unspecified = {};
  unspecified.ss_family = self.ss_family;
  const socklen_t n = std::min(*len, self_len);
  std::memcpy(addr, &unspecified, n);
  *len = self_len;
  return 0;
}
