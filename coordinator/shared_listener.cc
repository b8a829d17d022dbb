#include "coordinator/shared_listener.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/net_address.h"
#include "common/port_holder.h"

namespace ddp {
namespace {

constexpr int kBacklog = 4096;

// The port a bound socket got.
int BoundPort(int fd) {
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) return 0;
  if (address.ss_family == AF_INET) {
    return ntohs(reinterpret_cast<sockaddr_in*>(&address)->sin_port);
  }
  return ntohs(reinterpret_cast<sockaddr_in6*>(&address)->sin6_port);
}

// The socket a previous image handed down, if it is one listening on
// `port`; taken out of the environment either way.
int TakeHandedDown(int port) {
  const char* named = std::getenv(SharedListener::kHandedDownFd);
  if (named == nullptr) return -1;
  int fd = -1;
  const bool parsed = absl::SimpleAtoi(named, &fd);
  ::unsetenv(SharedListener::kHandedDownFd);
  int listening = 0;
  socklen_t length = sizeof(listening);
  if (!parsed || fd < 0 || ::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &length) != 0 ||
      !listening || (port != 0 && BoundPort(fd) != port)) {
    return -1;
  }
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  return fd;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SharedListener>> SharedListener::Listen(const std::string& listen) {
  absl::StatusOr<HostPort> at = ParseHostPort(listen, /*allow_port_zero=*/true);
  if (!at.ok()) return at.status();
  if (const int handed = TakeHandedDown(at->port); handed >= 0) {
    int wake[2];
    if (::pipe2(wake, O_CLOEXEC) != 0) {
      ::close(handed);
      return absl::UnavailableError(absl::StrCat("pipe: ", std::strerror(errno)));
    }
    return std::unique_ptr<SharedListener>(
        new SharedListener(handed, BoundPort(handed), wake[0], wake[1]));
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  const std::string host = at->host == "localhost" ? "127.0.0.1" : at->host;
  addrinfo* found = nullptr;
  if (int e = ::getaddrinfo(IsWildcardHost(host) ? nullptr : host.c_str(),
                            std::to_string(at->port).c_str(), &hints, &found);
      e != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("can't listen on ", listen, ": ", ::gai_strerror(e)));
  }
  // The wildcard: IPv6's when there is one (it takes IPv4 too).
  const addrinfo* chosen = found;
  for (const addrinfo* a = found; a != nullptr && IsWildcardHost(host); a = a->ai_next) {
    if (a->ai_family == AF_INET6) chosen = a;
  }
  // Non-blocking: a connection reset between poll and accept must not
  // hold the loop until the next one comes.
  const int fd = ::socket(chosen->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    ::freeaddrinfo(found);
    return absl::UnavailableError(
        absl::StrCat("can't listen on ", listen, ": socket: ", std::strerror(errno)));
  }
  const int on = 1, off = 0;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));  // not SO_REUSEPORT
  if (chosen->ai_family == AF_INET6) ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof(off));
  const int bound = ::bind(fd, chosen->ai_addr, chosen->ai_addrlen);
  const int error = errno;
  ::freeaddrinfo(found);
  if (bound != 0 || ::listen(fd, kBacklog) != 0) {
    ::close(fd);
    return absl::UnavailableError(absl::StrCat(
        "can't listen on ", listen, ": ",
        bound != 0 && error == EADDRINUSE ? WhyCantListen(listen) : std::strerror(error)));
  }
  int wake[2];
  if (::pipe2(wake, O_CLOEXEC) != 0) {
    ::close(fd);
    return absl::UnavailableError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  return std::unique_ptr<SharedListener>(new SharedListener(fd, BoundPort(fd), wake[0], wake[1]));
}

SharedListener::SharedListener(int fd, int port, int wake_read, int wake_write)
    : fd_(fd), port_(port), wake_read_(wake_read), wake_write_(wake_write) {
  thread_ = std::thread([this] { AcceptLoop(); });
}

SharedListener::~SharedListener() {
  StopLoop();
  ::close(fd_);
  ::close(wake_read_);
  ::close(wake_write_);
}

void SharedListener::StopLoop() {
  if (!thread_.joinable()) return;
  const char stop = 1;
  while (::write(wake_write_, &stop, 1) < 0 && errno == EINTR) {
  }
  thread_.join();
}

void SharedListener::HandDown() {
  StopLoop();
  ::fcntl(fd_, F_SETFD, 0);  // open across the exec
  ::setenv(kHandedDownFd, std::to_string(fd_).c_str(), 1);
}

void SharedListener::Route(grpc::experimental::ExternalConnectionAcceptor* acceptor) {
  absl::MutexLock lock(&mu_);
  route_ = acceptor;
}

void SharedListener::AcceptLoop() {
  while (true) {
    pollfd fds[2] = {{fd_, POLLIN, 0}, {wake_read_, POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      DDP_LOG(Error) << "the listening socket's poll failed: " << std::strerror(errno);
      return;
    }
    if (fds[1].revents != 0) return;
    // Non-blocking, as gRPC's own listener makes its connections: its
    // pollers read them, and a blocking one would stall every call.
    const int connection = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (connection < 0) {
      // The peer gave up before we took it, or descriptors ran out for a
      // moment: nothing to hand over.
      if (errno == EMFILE || errno == ENFILE) ::poll(nullptr, 0, 10);
      continue;
    }
    absl::MutexLock lock(&mu_);
    if (route_ == nullptr) {
      ::close(connection);
      continue;
    }
    grpc::experimental::ExternalConnectionAcceptor::NewConnectionParameters p;
    p.listener_fd = fd_;
    p.fd = connection;  // gRPC owns it now
    route_->HandleNewConnection(&p);
  }
}

}  // namespace ddp
