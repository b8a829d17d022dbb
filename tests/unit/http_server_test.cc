#include "common/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "common/metrics_server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/counter.h"
#include "prometheus/registry.h"
#include "tests/test_util.h"

namespace ddp {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

const std::vector<TokenEntry> kTokens = {{Role::kWorker, "worker-token-0123456789"},
                                         {Role::kOperator, "operator-token-0123456789"},
                                         {Role::kAdmin, "admin-token-0123456789"}};

HttpAccess WithTlsAndTokens() {
  HttpAccess access;
  access.tls_cert = "/etc/ddp/server.crt";
  access.tls_key = "/etc/ddp/server.key";
  access.tokens = kTokens;
  return access;
}

TEST(CheckHttpListen, Loopback_OkWithNothing) {
  EXPECT_THAT(CheckHttpListen("--metrics_listen", "metrics", "127.0.0.1:9400", {}), IsOk());
  EXPECT_THAT(CheckHttpListen("--http_listen", "the page", "localhost:0", {}), IsOk());
  EXPECT_THAT(CheckHttpListen("--http_listen", "the page", "[::1]:9401", {}), IsOk());
}

TEST(CheckHttpListen, OffLoopback_NeedsTlsAndTokensOrInsecure) {
  EXPECT_THAT(CheckHttpListen("--http_listen", "the status page", "0.0.0.0:9401", {}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("the status page"), HasSubstr("without TLS and tokens"),
                             HasSubstr("--insecure"))));
  HttpAccess tls_only = WithTlsAndTokens();
  tls_only.tokens.clear();
  EXPECT_THAT(CheckHttpListen("--metrics_listen", "metrics", "10.0.0.7:9400", tls_only),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("without tokens")));
  EXPECT_THAT(CheckHttpListen("--metrics_listen", "metrics", "10.0.0.7:9400", WithTlsAndTokens()),
              IsOk());
  HttpAccess insecure;
  insecure.insecure = true;
  EXPECT_THAT(CheckHttpListen("--metrics_listen", "metrics", "0.0.0.0:9400", insecure), IsOk());
}

TEST(CheckHttpListen, MalformedOrHalfTls_InvalidArgument) {
  EXPECT_THAT(CheckHttpListen("--metrics_listen", "metrics", "nonsense", {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--metrics_listen")));
  HttpAccess no_key;
  no_key.tls_cert = "/etc/ddp/server.crt";
  EXPECT_THAT(CheckHttpListen("--http_listen", "the page", "127.0.0.1:0", no_key),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("key")));
}

TEST(CheckHttpAuthorization, NoTokensConfigured_EveryoneReads) {
  EXPECT_THAT(CheckHttpAuthorization({}, std::nullopt), IsOk());
}

TEST(CheckHttpAuthorization, OperatorOrAdmin_BearerOrBasic_Ok) {
  EXPECT_THAT(CheckHttpAuthorization(kTokens, "Bearer operator-token-0123456789"), IsOk());
  EXPECT_THAT(CheckHttpAuthorization(kTokens, "bearer admin-token-0123456789"), IsOk());
  // What a browser sends after asking: any user name, the token as password.
  const std::string basic = "Basic " + absl::Base64Escape("me:admin-token-0123456789");
  EXPECT_THAT(CheckHttpAuthorization(kTokens, basic), IsOk());
}

TEST(CheckHttpAuthorization, MissingUnknownOrWorker_RefusedWithoutQuotingTheToken) {
  EXPECT_THAT(CheckHttpAuthorization(kTokens, std::nullopt),
              StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("operator or admin token")));
  EXPECT_THAT(CheckHttpAuthorization(kTokens, "Bearer guessed-token-0123456789"),
              StatusIs(absl::StatusCode::kUnauthenticated,
                       AllOf(HasSubstr("unknown token"), Not(HasSubstr("guessed")))));
  EXPECT_THAT(CheckHttpAuthorization(kTokens, "Token operator-token-0123456789"),
              StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("Bearer")));
  EXPECT_THAT(CheckHttpAuthorization(kTokens, "Basic !!!"),
              StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("Basic")));
  EXPECT_THAT(CheckHttpAuthorization(kTokens, "Bearer worker-token-0123456789"),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("worker")));
}

// A raw HTTP exchange: what a browser sends, nothing more.
std::string Fetch(int port, const std::string& request) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return "";
  }
  ::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string answer;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;) answer.append(buf, n);
  ::close(fd);
  return answer;
}

std::string Get(int port, const std::string& path, const std::string& headers = "") {
  return Fetch(port, "GET " + path + " HTTP/1.1\r\nHost: x\r\n" + headers + "\r\n");
}

HttpResponse Hello(absl::string_view method, absl::string_view path) {
  if (path != "/hello") return {404, "text/plain", "no\n"};
  return {200, "text/plain", std::string(method) + " hello\n"};
}

HttpServer::Options Local() {
  HttpServer::Options options;
  options.listen = "127.0.0.1:0";
  return options;
}

TEST(HttpServer, PortZero_ServesTheHandlerWithItsHeaders) {
  HttpServer::Options options = Local();
  options.headers = {{"X-Test", "yes"}};
  auto server = HttpServer::Start(options, Hello);
  ASSERT_THAT(server, IsOk());
  ASSERT_GT((*server)->port(), 0);
  EXPECT_EQ((*server)->url(), "http://127.0.0.1:" + std::to_string((*server)->port()));
  const std::string answer = Get((*server)->port(), "/hello");
  EXPECT_THAT(answer, StartsWith("HTTP/1.1 200"));
  EXPECT_THAT(answer, HasSubstr("X-Test: yes\r\n"));
  EXPECT_THAT(answer, HasSubstr("Connection: close"));
  EXPECT_THAT(answer, HasSubstr("Cache-Control: no-store"));
  EXPECT_THAT(answer, HasSubstr("GET hello"));
  EXPECT_THAT(Get((*server)->port(), "/other"), StartsWith("HTTP/1.1 404"));
}

TEST(HttpServer, OversizedRequest_NotServed) {
  HttpServer::Options options = Local();
  options.max_request_bytes = 1024;
  auto server = HttpServer::Start(options, Hello);
  ASSERT_THAT(server, IsOk());
  EXPECT_THAT(Get((*server)->port(), "/hello", "X-Pad: " + std::string(65536, 'a') + "\r\n"),
              Not(HasSubstr("hello")));
}

TEST(HttpServer, AddressInUseNotAnAddressOrOffLoopback_Refused) {
  auto first = HttpServer::Start(Local(), Hello);
  ASSERT_THAT(first, IsOk());
  HttpServer::Options taken = Local();
  taken.listen = "127.0.0.1:" + std::to_string((*first)->port());
  EXPECT_THAT(HttpServer::Start(taken, Hello), StatusIs(absl::StatusCode::kUnavailable));
  HttpServer::Options name = Local();
  name.listen = "example.com:80";
  name.access.insecure = true;
  EXPECT_THAT(HttpServer::Start(name, Hello),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("IP address")));
  HttpServer::Options open = Local();
  open.listen = "0.0.0.0:0";
  EXPECT_THAT(HttpServer::Start(open, Hello), StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST(HttpServer, WithTokens_OnlyOperatorsAndAdminsRead) {
  HttpServer::Options options = Local();
  options.access.tokens = kTokens;
  auto server = HttpServer::Start(options, Hello);
  ASSERT_THAT(server, IsOk());
  const int port = (*server)->port();
  const std::string none = Get(port, "/hello");
  EXPECT_THAT(none, StartsWith("HTTP/1.1 401"));
  EXPECT_THAT(none, HasSubstr("WWW-Authenticate: Basic realm=\"ddp\""));
  EXPECT_THAT(none, Not(HasSubstr("GET hello")));
  EXPECT_THAT(Get(port, "/hello", "Authorization: Bearer operator-token-0123456789\r\n"),
              AllOf(StartsWith("HTTP/1.1 200"), HasSubstr("GET hello")));
  EXPECT_THAT(
      Get(port, "/hello",
          "Authorization: Basic " + absl::Base64Escape("x:admin-token-0123456789") + "\r\n"),
      StartsWith("HTTP/1.1 200"));
  EXPECT_THAT(Get(port, "/hello", "Authorization: Bearer worker-token-0123456789\r\n"),
              AllOf(StartsWith("HTTP/1.1 403"), Not(HasSubstr("GET hello"))));
  EXPECT_THAT(Get(port, "/hello", "Authorization: Bearer nope-nope-nope-nope-nope\r\n"),
              StartsWith("HTTP/1.1 401"));
}

TEST(HttpServer, TlsWithUnreadableCertificate_UnavailableNamingTheFile) {
  HttpServer::Options options = Local();
  options.access.tls_cert = "/nonexistent/server.crt";
  options.access.tls_key = "/nonexistent/server.key";
  EXPECT_THAT(HttpServer::Start(options, Hello),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("/nonexistent/server.crt")));
}

TEST(MetricsServer, Start_ServesRegisteredSeries_SecondOnSamePortUnavailable) {
  auto server = MetricsServer::Start("127.0.0.1:0", HttpAccess{});
  ASSERT_THAT(server, IsOk());
  ASSERT_GT((*server)->port(), 0);
  auto registry = std::make_shared<prometheus::Registry>();
  prometheus::BuildCounter()
      .Name("ddp_test_total")
      .Help("t")
      .Register(*registry)
      .Add({})
      .Increment(3);
  (*server)->Register(registry);
  EXPECT_THAT(Get((*server)->port(), "/metrics"), HasSubstr("ddp_test_total 3"));

  const std::string taken = "127.0.0.1:" + std::to_string((*server)->port());
  EXPECT_THAT(MetricsServer::Start(taken, HttpAccess{}),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr(taken)));
  // The default address taken: metrics off, the daemon runs.
  auto optional = StartMetricsServer(taken, HttpAccess{}, /*required=*/false);
  ASSERT_THAT(optional, IsOk());
  EXPECT_EQ(*optional, nullptr);
  EXPECT_THAT(StartMetricsServer(taken, HttpAccess{}, /*required=*/true),
              StatusIs(absl::StatusCode::kUnavailable));
  auto off = StartMetricsServer("", HttpAccess{}, true);
  ASSERT_THAT(off, IsOk());
  EXPECT_EQ(*off, nullptr);
}

}  // namespace
}  // namespace ddp
