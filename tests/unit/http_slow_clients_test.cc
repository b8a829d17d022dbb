// The HTTP pages under slow clients (slowloris): many connections that
// trickle their request head keep no reader with a token out, from other
// addresses or from the reader's own (all local users share 127.0.0.1); a
// head that is still coming a few seconds after connect is cut off, however
// steadily it trickles. Real sockets on
// loopback, where every 127.0.0.x is an address of this host.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/clock.h"
#include "common/http_server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ddp {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

const std::vector<TokenEntry> kTokens = {{Role::kOperator, "operator-token-0123456789"}};
constexpr char kAuthorized[] =
    "GET /hello HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer operator-token-0123456789\r\n\r\n";

HttpResponse Hello(absl::string_view, absl::string_view path) {
  if (path != "/hello") return {404, "text/plain", "no\n"};
  return {200, "text/plain", "hello\n"};
}

// A socket from `source` to 127.0.0.1:port, connected within `timeout`;
// -1 when it isn't (a full accept queue leaves connect waiting).
int ConnectFrom(const std::string& source, int port, absl::Duration timeout = absl::Seconds(1)) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  sockaddr_in from{};
  from.sin_family = AF_INET;
  ::inet_pton(AF_INET, source.c_str(), &from.sin_addr);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(port);
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from)) != 0 ||
      (::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0 && errno != EINPROGRESS)) {
    ::close(fd);
    return -1;
  }
  pollfd p{fd, POLLOUT, 0};
  int error = 0;
  socklen_t len = sizeof(error);
  if (::poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout))) != 1 ||
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len) != 0 || error != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

bool SendAll(int fd, const std::string& text) {
  return ::send(fd, text.data(), text.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(text.size());
}

// Whether the server closed `fd` (end of stream or reset) within `timeout`.
bool ClosedWithin(int fd, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  char buf[4096];
  for (absl::Time now = absl::Now(); now < deadline; now = absl::Now()) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(deadline - now)) + 1) != 1) {
      continue;
    }
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return true;  // whatever was answered before, it is closed
  }
  return false;
}

// A whole request from 127.0.0.1 and its answer, or "" when none came
// within `timeout`; *took says how long it took.
std::string Ask(int port, const std::string& request, absl::Duration timeout,
                absl::Duration* took) {
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + timeout;
  const int fd = ConnectFrom("127.0.0.1", port, timeout);
  std::string answer;
  if (fd >= 0 && SendAll(fd, request)) {
    char buf[4096];
    for (absl::Time now = absl::Now(); now < deadline; now = absl::Now()) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(deadline - now)) + 1) != 1) {
        continue;
      }
      const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) break;
      answer.append(buf, n);
    }
  }
  if (fd >= 0) ::close(fd);
  *took = absl::Now() - start;
  return answer;
}

struct Sockets {
  std::vector<int> fds;
  ~Sockets() {
    for (int fd : fds) ::close(fd);
  }
};

// A page served as the coordinator serves it: loopback, tokens required.
HttpServer::Options WithTokens() {
  HttpServer::Options options;
  options.listen = "127.0.0.1:0";
  options.access.tokens = kTokens;
  return options;
}

// 200 connections that send a request line and one header line, then
// trickle; connection i comes from `address(i)`.
void OpenSlowHeads(int port, const std::function<std::string(int)>& address, Sockets* slow) {
  for (int i = 0; i < 200; ++i) {
    // (A burst of connects may overrun the accept queue for a moment: the
    // kernel then retries the handshake a second later.)
    const int fd = ConnectFrom(address(i), port, absl::Seconds(5));
    if (fd >= 0 && SendAll(fd, "GET /hello HTTP/1.1\r\nX-Slow-0: a\r\n")) slow->fds.push_back(fd);
  }
}

TEST(HttpSlowClients, TwoHundredTricklingHeads_ATokenHolderIsAnsweredWithinASecond) {
  // The defaults, as the coordinator serves its pages; tokens required.
  auto server = HttpServer::Start(WithTokens(), Hello);
  ASSERT_THAT(server, IsOk());
  const int port = (*server)->port();

  // 16 (the per-address cap) from each of 127.0.0.2..14.
  Sockets slow;
  OpenSlowHeads(
      port, [](int i) { return "127.0.0." + std::to_string(2 + i / 16); }, &slow);
  for (int round = 1; round <= 2; ++round) {
    for (int fd : slow.fds) SendAll(fd, "X-Slow-" + std::to_string(round) + ": a\r\n");
    absl::Duration took;
    const std::string answer = Ask(port, kAuthorized, absl::Seconds(3), &took);
    EXPECT_THAT(answer, StartsWith("HTTP/1.1 200")) << "round " << round;
    EXPECT_THAT(answer, HasSubstr("hello"));
    EXPECT_LT(took, absl::Seconds(1)) << "round " << round;
  }
  EXPECT_EQ(slow.fds.size(), 200u);
  // They were all held, none answered: still waiting for their heads.
  EXPECT_EQ((*server)->HeadsPending(), 200);
}

// Whether the server answers a request sent on `fd` with 200 within 2 s.
bool Answered(int fd, const std::string& request) {
  if (!SendAll(fd, request)) return false;
  std::string answer;
  char buf[4096];
  pollfd p{fd, POLLIN, 0};
  for (int i = 0; i < 20 && answer.size() < 12; ++i) {
    if (::poll(&p, 1, 100) != 1) continue;
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    answer.append(buf, n);
  }
  return answer.rfind("HTTP/1.1 200", 0) == 0;
}

TEST(HttpSlowClients, TwoHundredTricklingFromTheReadersOwnAddress_ReaderStillAnswered) {
  auto server = HttpServer::Start(WithTokens(), Hello);
  ASSERT_THAT(server, IsOk());
  const int port = (*server)->port();
  // Another local user: 200 slow heads from 127.0.0.1, as the reader's.
  Sockets slow;
  OpenSlowHeads(
      port, [](int) { return std::string("127.0.0.1"); }, &slow);
  EXPECT_EQ(slow.fds.size(), 200u);
  for (int i = 0; i < 200 && (*server)->HeadsPending() > 16; ++i) {
    absl::SleepFor(absl::Milliseconds(10));  // until the oldest are ended
  }
  EXPECT_EQ((*server)->HeadsPending(), 16);  // the per-address cap
  for (int round = 1; round <= 2; ++round) {
    for (int fd : slow.fds) SendAll(fd, "X-Slow-" + std::to_string(round) + ": a\r\n");
    absl::Duration took;
    EXPECT_THAT(Ask(port, kAuthorized, absl::Seconds(3), &took), StartsWith("HTTP/1.1 200"))
        << "round " << round;
    EXPECT_LT(took, absl::Seconds(1)) << "round " << round;
  }
}

TEST(HttpSlowClients, OneAddressPastItsCap_TheOldestHeadEnded_TheNewcomerServed) {
  HttpServer::Options options = WithTokens();
  options.access.max_connections_per_address = 4;
  auto server = HttpServer::Start(options, Hello);
  ASSERT_THAT(server, IsOk());
  const int port = (*server)->port();
  Sockets held;
  for (int i = 0; i < 4; ++i) {
    held.fds.push_back(ConnectFrom("127.0.0.20", port));
    ASSERT_GE(held.fds.back(), 0);
    ASSERT_TRUE(SendAll(held.fds.back(), "GET /hello HTTP/1.1\r\n"));
    for (int j = 0; j < 200 && (*server)->HeadsPending() < i + 1; ++j) {
      absl::SleepFor(absl::Milliseconds(10));  // accepted in this order
    }
  }
  ASSERT_EQ((*server)->HeadsPending(), 4);
  for (int fd : held.fds) EXPECT_FALSE(ClosedWithin(fd, absl::Milliseconds(50)));
  // A fifth from the same address ends the first, and is served.
  const int fifth = ConnectFrom("127.0.0.20", port);
  ASSERT_GE(fifth, 0);
  Sockets later{{fifth}};
  EXPECT_TRUE(ClosedWithin(held.fds[0], absl::Seconds(1)));
  for (size_t i = 1; i < held.fds.size(); ++i) {
    EXPECT_FALSE(ClosedWithin(held.fds[i], absl::Milliseconds(20)));
  }
  EXPECT_TRUE(Answered(fifth, kAuthorized));
  // Another address is not touched by this one's cap.
  const int other = ConnectFrom("127.0.0.21", port);
  ASSERT_GE(other, 0);
  Sockets more{{other}};
  EXPECT_FALSE(ClosedWithin(held.fds[1], absl::Milliseconds(50)));
}

TEST(HttpSlowClients, ManyAddressesPastTheOverallCap_OldestEnded_AReaderServed) {
  HttpServer::Options options = WithTokens();
  options.access.max_connections = 16;  // 14 unfinished heads, 2 kept for answers
  auto server = HttpServer::Start(options, Hello);
  ASSERT_THAT(server, IsOk());
  const int port = (*server)->port();
  Sockets slow;
  for (int i = 0; i < 100; ++i) {
    const int fd = ConnectFrom("127.0.1." + std::to_string(1 + i), port, absl::Seconds(5));
    if (fd >= 0 && SendAll(fd, "GET /hello HTTP/1.1\r\n")) slow.fds.push_back(fd);
  }
  EXPECT_EQ(slow.fds.size(), 100u);
  // Bounded at 10 s: a loaded machine (the suite beside a TSan build) takes
  // longer than the usual tens of milliseconds to accept 100 connections.
  for (int i = 0; i < 1000 && (*server)->HeadsPending() > 14; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ((*server)->HeadsPending(), 14);
  absl::Duration took;
  EXPECT_THAT(Ask(port, kAuthorized, absl::Seconds(3), &took), StartsWith("HTTP/1.1 200"));
  EXPECT_LT(took, absl::Seconds(1));
}

TEST(HttpSlowClients, HeadStillTricklingAtTheDeadline_ClosedEvenThoughEachLineCameInTime) {
  FakeClock clock;
  HttpServer::Options options;
  options.listen = "127.0.0.1:0";
  options.clock = &clock;
  options.watch_interval = absl::Milliseconds(10);
  options.access.header_timeout = absl::Seconds(5);
  auto server = HttpServer::Start(options, Hello);
  ASSERT_THAT(server, IsOk());
  const int fd = ConnectFrom("127.0.0.50", (*server)->port());
  ASSERT_GE(fd, 0);
  Sockets held{{fd}};
  ASSERT_TRUE(SendAll(fd, "GET /hello HTTP/1.1\r\n"));
  for (int i = 0; i < 200 && (*server)->HeadsPending() < 1; ++i) {
    absl::SleepFor(absl::Milliseconds(10));  // until the server has accepted it
  }
  ASSERT_EQ((*server)->HeadsPending(), 1);
  // A line every 3 s: an idle timeout would never fire.
  clock.Advance(absl::Seconds(3));
  ASSERT_TRUE(SendAll(fd, "X-Slow-1: a\r\n"));
  EXPECT_EQ((*server)->CloseOverdue(), 0);
  EXPECT_FALSE(ClosedWithin(fd, absl::Milliseconds(50)));
  clock.Advance(absl::Seconds(3));
  SendAll(fd, "X-Slow-2: a\r\n");
  EXPECT_TRUE(ClosedWithin(fd, absl::Seconds(2)));
  EXPECT_EQ((*server)->HeadsPending(), 0);
}

TEST(HttpSlowClients, WholeRequestInTime_AnsweredAndNoLongerWatched) {
  FakeClock clock;
  HttpServer::Options options;
  options.listen = "127.0.0.1:0";
  options.clock = &clock;
  auto server = HttpServer::Start(options, Hello);
  ASSERT_THAT(server, IsOk());
  absl::Duration took;
  EXPECT_THAT(
      Ask((*server)->port(), "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n", absl::Seconds(3), &took),
      StartsWith("HTTP/1.1 200"));
  EXPECT_EQ((*server)->HeadsPending(), 0);
}

TEST(CheckHttpListen, ZeroCapsOrTimeout_InvalidArgument) {
  HttpAccess access;
  access.max_connections_per_address = 0;
  EXPECT_THAT(CheckHttpListen("--http_listen", "the page", "127.0.0.1:0", access),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at least 1")));
  access = HttpAccess{};
  access.header_timeout = absl::ZeroDuration();
  EXPECT_THAT(CheckHttpListen("--http_listen", "the page", "127.0.0.1:0", access),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace ddp
