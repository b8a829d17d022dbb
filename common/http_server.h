// A small HTTP(S) server for the daemons' read-only pages: Prometheus
// metrics and the coordinator's status page, on GNU libmicrohttpd (TLS by
// GnuTLS). Not civetweb: Debian 12's build can't start TLS with OpenSSL 3.
//
// They follow the gRPC API's rules: on loopback anything goes; elsewhere
// they need TLS and tokens, or the operator's --insecure. When tokens are
// configured they are required even on loopback (a local user without one
// reads nothing), as "Authorization: Bearer <token>" (Prometheus'
// `authorization`) or as HTTP Basic with the token as password (what a
// browser prompts for); only operator and admin tokens may read. With a CA,
// clients must present a certificate it signed (checked once the handshake
// is done: a request without one is answered 403).
//
// What a client can make it hold is bounded: a few handler threads, small
// requests, a request timeout, no keep-alive, and against slow clients
// (slowloris) caps on unfinished request heads per remote address and in
// all (a newcomer ends the oldest), and a deadline for the request head
// counted from connect (not reset by each line that trickles in). Connections still sending their
// head cost no thread (they wait in epoll), so a few hundred of them, however slow, leave room for
// a reader with a token.
#ifndef DDP_COMMON_HTTP_SERVER_H_
#define DDP_COMMON_HTTP_SERVER_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/tokens.h"

struct MHD_Daemon;  // libmicrohttpd's, kept out of this header

namespace ddp {

// Who may read, and over what.
struct HttpAccess {
  // PEM certificate (chain) and key: serve HTTPS.
  std::string tls_cert;
  std::string tls_key;
  // PEM CA certificate(s): clients must present a certificate they signed.
  std::string tls_ca;
  // Non-empty: every request needs one of these, of role operator or admin.
  std::vector<TokenEntry> tokens;
  // Allow a non-loopback address without TLS and tokens.
  bool insecure = false;
  // What slow or many clients may hold (the coordinator's
  // --http_max_connections_per_address, --http_max_connections and
  // --http_header_timeout). Connections still sending their request head:
  // at most max_connections_per_address from one remote address, and
  // max_connections less a reserve (an eighth) in all; a newcomer past
  // either cap is accepted and ends the oldest of them, so one who sends
  // its request promptly is served however many slow ones share its
  // address. A head not complete `header_timeout` after connect is cut
  // off. Connections in all, beyond max_connections, wait in the kernel's
  // accept queue.
  int max_connections_per_address = 16;
  int max_connections = 512;
  absl::Duration header_timeout = absl::Seconds(5);

  bool tls() const { return !tls_cert.empty(); }
};

// OK when `listen` (HOST:PORT, port 0 picks one) may be served with
// `access`: a loopback address, one with TLS and tokens, or any with
// insecure (logged). INVALID_ARGUMENT for a malformed address or TLS flags
// without a certificate and key; FAILED_PRECONDITION, saying what to set,
// otherwise. `flag` names the flag and `what` the page, in messages.
absl::Status CheckHttpListen(absl::string_view flag, absl::string_view what,
                             const std::string& listen, const HttpAccess& access);

// Whether a request whose Authorization header is `authorization` may read,
// given `tokens` (empty: everyone may). UNAUTHENTICATED: no header, a
// malformed one, or an unknown token; PERMISSION_DENIED: a worker's token.
// Messages never quote a token.
absl::Status CheckHttpAuthorization(const std::vector<TokenEntry>& tokens,
                                    std::optional<absl::string_view> authorization);

struct HttpResponse {
  int code = 200;
  std::string content_type;
  std::string body;
};

// Answers one request: its method and path (no query). Called on the
// server's threads, so it must be thread-safe and must not wait long.
using HttpHandler = std::function<HttpResponse(absl::string_view method, absl::string_view path)>;

class HttpServer {
 public:
  struct Options {
    // Names the page and its flag in messages: "the status page", "--http_listen".
    std::string what = "HTTP";
    std::string flag = "--http_listen";
    // HOST:PORT, the host an IP address or "localhost"; port 0 picks one.
    std::string listen;
    HttpAccess access;
    // Threads serving connections (each polls many: a connection costs a
    // thread only while its handler runs), and the kernel's accept queue.
    int threads = 4;
    int queue = 64;
    // A connection idle this long is closed (after its head, while the
    // answer is written; the head has access.header_timeout from connect).
    absl::Duration request_timeout = absl::Seconds(10);
    // What header deadlines are measured with; a watchdog thread looks
    // every `watch_interval`.
    Clock* clock = RealClock::Get();
    absl::Duration watch_interval = absl::Milliseconds(100);
    // Largest request head accepted (these pages take no request bodies).
    int max_request_bytes = 8192;
    // Added to every response: (name, value).
    std::vector<std::pair<std::string, std::string>> headers;
  };

  // Serves `handler` after CheckHttpListen. INVALID_ARGUMENT for a malformed
  // address; UNAVAILABLE when a TLS file can't be read or the address can't
  // be bound (with the reason).
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(Options options, HttpHandler handler);
  // Stops accepting and waits for the requests in progress.
  ~HttpServer();

  // Closes every connection whose request head is overdue now; returns how
  // many. The watchdog calls it; tests may too (with a FakeClock).
  int CloseOverdue();
  // Connections accepted whose request head is not complete yet.
  int HeadsPending() const;

  // The port served on (the one picked, for port 0).
  int port() const { return port_; }
  // "http://HOST:PORT" or "https://HOST:PORT".
  std::string url() const;

  // For libmicrohttpd's callbacks.
  struct Context;

 private:
  HttpServer(std::unique_ptr<Context> context, MHD_Daemon* daemon, int port);
  void Watch();

  std::unique_ptr<Context> context_;
  MHD_Daemon* daemon_;
  int port_;
  std::thread watchdog_;
};

}  // namespace ddp

#endif  // DDP_COMMON_HTTP_SERVER_H_
