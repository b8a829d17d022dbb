#include "common/http_server.h"

#include <arpa/inet.h>
#include <gnutls/gnutls.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <unordered_map>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/log_limiter.h"
#include "common/logging.h"
#include "common/net_address.h"
#include "common/port_holder.h"

namespace ddp {

struct HttpServer::Context {
  Options options;
  HttpHandler handler;
  // The last message libmicrohttpd logged while starting: why it failed.
  absl::Mutex mu;
  std::string start_error ABSL_GUARDED_BY(mu);
  bool started ABSL_GUARDED_BY(mu) = false;
  LogLimiter log_limiter ABSL_GUARDED_BY(mu){absl::Minutes(1)};
  // Connections whose request head is still coming in: their socket, the
  // remote address (raw bytes), when the head is due, and the order they
  // came in. Added when libmicrohttpd accepts one, removed when the head is
  // complete (the handler runs), when it is cut off, or when the
  // connection closes; the notification of a close comes before
  // libmicrohttpd closes the socket, so a socket found here under the lock
  // is still the connection's own.
  struct Head {
    int fd;
    std::string address;
    absl::Time deadline;
    uint64_t order;
  };
  absl::Mutex heads_mu;
  std::unordered_map<MHD_Connection*, Head> heads ABSL_GUARDED_BY(heads_mu);
  uint64_t next_order ABSL_GUARDED_BY(heads_mu) = 0;
  bool stopping ABSL_GUARDED_BY(heads_mu) = false;
};

namespace {

// libmicrohttpd's messages go to our log; while starting, the last one is
// kept as the reason a start failed. After that at most one a minute: a
// client can make it complain once per connection it opens.
void LogHttpdMessage(void* cls, const char* format, va_list args) {
  char text[512];
  std::vsnprintf(text, sizeof(text), format, args);
  absl::string_view message = absl::StripAsciiWhitespace(text);
  auto* context = static_cast<HttpServer::Context*>(cls);
  uint64_t held_back = 0;
  {
    absl::MutexLock lock(&context->mu);
    if (!context->started) {
      context->start_error = std::string(message);
      return;
    }
    if (!context->log_limiter.ShouldLog(0, context->options.clock->Now(), &held_back)) return;
  }
  DDP_LOG(Warning) << context->options.what << ": " << message
                   << (held_back ? absl::StrCat(" (", held_back, " more messages held back)") : "");
}

absl::StatusOr<std::string> ReadPem(const std::string& path, absl::string_view what) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in || text.str().empty()) {
    return absl::UnavailableError(absl::StrCat("can't read the ", what, " ", path));
  }
  return text.str();
}

// Whether the TLS client presented a certificate the trusted CA signed.
bool ClientCertificateVerified(MHD_Connection* connection) {
  const MHD_ConnectionInfo* info =
      MHD_get_connection_info(connection, MHD_CONNECTION_INFO_GNUTLS_SESSION);
  if (info == nullptr || info->tls_session == nullptr) return false;
  unsigned int status = 0;
  return gnutls_certificate_verify_peers2(static_cast<gnutls_session_t>(info->tls_session),
                                          &status) == GNUTLS_E_SUCCESS &&
         status == 0;
}

MHD_Result Send(MHD_Connection* connection, const HttpServer::Context& context,
                const HttpResponse& response,
                std::initializer_list<std::pair<const char*, const char*>> extra = {}) {
  MHD_Response* r = MHD_create_response_from_buffer(
      response.body.size(), const_cast<char*>(response.body.data()), MHD_RESPMEM_MUST_COPY);
  if (r == nullptr) return MHD_NO;
  MHD_add_response_header(r, "Content-Type", response.content_type.c_str());
  MHD_add_response_header(r, "Cache-Control", "no-store");
  // Each response closes its connection: a client can't park idle
  // keep-alive connections on the few handler threads.
  MHD_add_response_header(r, "Connection", "close");
  for (const auto& [name, value] : context.options.headers) {
    MHD_add_response_header(r, name.c_str(), value.c_str());
  }
  for (const auto& [name, value] : extra) MHD_add_response_header(r, name, value);
  const MHD_Result queued = MHD_queue_response(connection, response.code, r);
  MHD_destroy_response(r);
  return queued;
}

HttpResponse Text(int code, std::string body) {
  return {code, "text/plain; charset=utf-8", std::move(body)};
}

// Unfinished heads held at once: what the connection cap leaves after a
// reserve for requests being answered, so a newcomer is always accepted.
int MaxHeads(const HttpAccess& access) {
  return std::max(1, access.max_connections - std::max(1, access.max_connections / 8));
}

// Ends a connection libmicrohttpd owns: it sees the end of the stream and
// closes the connection (and then its socket) on its own thread.
void CutOff(int fd) { ::shutdown(fd, SHUT_RDWR); }

// The remote address of `connection` as raw bytes (empty if unknown).
std::string RemoteAddress(MHD_Connection* connection) {
  const MHD_ConnectionInfo* info =
      MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
  if (info == nullptr || info->client_addr == nullptr) return "";
  const sockaddr* addr = info->client_addr;
  if (addr->sa_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(addr);
    return std::string(reinterpret_cast<const char*>(&v4->sin_addr), sizeof(v4->sin_addr));
  }
  if (addr->sa_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(addr);
    return std::string(reinterpret_cast<const char*>(&v6->sin6_addr), sizeof(v6->sin6_addr));
  }
  return "";
}

// A newcomer past a cap on unfinished heads (its address's, or all of them)
// ends the oldest unfinished head rather than being refused: a reader who
// sends its request at once is served however many slow connections share
// its address (all local users share 127.0.0.1), unless more newcomers than
// the cap arrive while its few bytes are on the way.
void NotifyConnection(void* cls, MHD_Connection* connection, void** /*socket_context*/,
                      MHD_ConnectionNotificationCode code) {
  auto* context = static_cast<HttpServer::Context*>(cls);
  absl::MutexLock lock(&context->heads_mu);
  if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
    context->heads.erase(connection);
    return;
  }
  const MHD_ConnectionInfo* info =
      MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CONNECTION_FD);
  if (info == nullptr) return;
  const HttpAccess& access = context->options.access;
  std::string address = RemoteAddress(connection);
  int same_address = 0;
  auto oldest = context->heads.end();
  auto oldest_same = context->heads.end();
  for (auto it = context->heads.begin(); it != context->heads.end(); ++it) {
    if (oldest == context->heads.end() || it->second.order < oldest->second.order) oldest = it;
    if (it->second.address != address) continue;
    ++same_address;
    if (oldest_same == context->heads.end() || it->second.order < oldest_same->second.order) {
      oldest_same = it;
    }
  }
  auto evict = context->heads.end();
  if (same_address >= access.max_connections_per_address) {
    evict = oldest_same;
  } else if (static_cast<int>(context->heads.size()) >= MaxHeads(access)) {
    evict = oldest;
  }
  if (evict != context->heads.end()) {
    CutOff(evict->second.fd);
    context->heads.erase(evict);
  }
  context->heads[connection] = {info->connect_fd, std::move(address),
                                context->options.clock->Now() + access.header_timeout,
                                context->next_order++};
}

MHD_Result Handle(void* cls, MHD_Connection* connection, const char* url, const char* method,
                  const char* /*version*/, const char* /*upload_data*/,
                  size_t* /*upload_data_size*/, void** /*request_state*/) {
  auto* context = static_cast<HttpServer::Context*>(cls);
  {
    // The head is in: from here the idle timeout bounds the answer.
    absl::MutexLock lock(&context->heads_mu);
    context->heads.erase(connection);
  }
  const HttpAccess& access = context->options.access;
  if (!access.tls_ca.empty() && !ClientCertificateVerified(connection)) {
    return Send(connection, *context,
                Text(403, "a client certificate signed by the server's CA is required\n"));
  }
  if (!access.tokens.empty()) {
    const char* header =
        MHD_lookup_connection_value(connection, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    const absl::Status allowed = CheckHttpAuthorization(
        access.tokens, header ? std::optional<absl::string_view>(header) : std::nullopt);
    if (absl::IsUnauthenticated(allowed)) {
      // Basic: a browser then asks for the token (as the password).
      return Send(connection, *context, Text(401, absl::StrCat(allowed.message(), "\n")),
                  {{"WWW-Authenticate", "Basic realm=\"ddp\", charset=\"UTF-8\""}});
    }
    if (!allowed.ok()) {
      return Send(connection, *context, Text(403, absl::StrCat(allowed.message(), "\n")));
    }
  }
  // Answered on the first call, before any request body is read: these
  // pages take none.
  const HttpResponse response = context->handler(method ? method : "", url ? url : "");
  if (response.code == 405) return Send(connection, *context, response, {{"Allow", "GET, HEAD"}});
  return Send(connection, *context, response);
}

}  // namespace

absl::Status CheckHttpListen(absl::string_view flag, absl::string_view what,
                             const std::string& listen, const HttpAccess& access) {
  auto parsed = ParseHostPort(listen, /*allow_port_zero=*/true);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", parsed.status().message()));
  }
  if (access.tls_cert.empty() != access.tls_key.empty() ||
      (!access.tls_ca.empty() && access.tls_cert.empty())) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, ": TLS needs both a certificate and its key (and a client CA needs them too)"));
  }
  if (access.max_connections < 1 || access.max_connections_per_address < 1 ||
      access.header_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, ": the connection caps must be at least 1 and the header timeout positive"));
  }
  if (IsLoopbackHost(parsed->host) || (access.tls() && !access.tokens.empty())) {
    return absl::OkStatus();
  }
  std::vector<std::string> missing;
  if (!access.tls()) missing.push_back("TLS");
  if (access.tokens.empty()) missing.push_back("tokens");
  const std::string lacking = absl::StrJoin(missing, " and ");
  if (!access.insecure) {
    return absl::FailedPreconditionError(absl::StrCat(
        "refusing to serve ", what, " on ", listen, " (", flag, ") without ", lacking,
        ": anyone who reaches that address could read the job's progress, workers and hosts. "
        "Listen on 127.0.0.1 (and reach it through a local Prometheus or an SSH tunnel), give "
        "TLS and tokens as for the gRPC API, set ",
        flag, "= (empty) to turn it off, or pass --insecure on a network you trust"));
  }
  DDP_LOG(Warning) << "--insecure: serving " << what << " on " << listen << " without " << lacking
                   << "; anyone who reaches it can read it";
  return absl::OkStatus();
}

absl::Status CheckHttpAuthorization(const std::vector<TokenEntry>& tokens,
                                    std::optional<absl::string_view> authorization) {
  if (tokens.empty()) return absl::OkStatus();
  if (!authorization) {
    return absl::UnauthenticatedError(
        "this page needs an operator or admin token: send \"Authorization: Bearer <token>\", "
        "or give the token as the password when the browser asks");
  }
  absl::string_view value = absl::StripAsciiWhitespace(*authorization);
  std::string token;
  if (value.size() > 7 && absl::EqualsIgnoreCase(value.substr(0, 7), "Bearer ")) {
    token = std::string(absl::StripAsciiWhitespace(value.substr(7)));
  } else if (value.size() > 6 && absl::EqualsIgnoreCase(value.substr(0, 6), "Basic ")) {
    std::string decoded;
    if (!absl::Base64Unescape(absl::StripAsciiWhitespace(value.substr(6)), &decoded) ||
        decoded.find(':') == std::string::npos) {
      return absl::UnauthenticatedError("malformed Basic credentials (base64 of user:token)");
    }
    token = decoded.substr(decoded.find(':') + 1);  // the user name is not checked
  } else {
    return absl::UnauthenticatedError(
        "the Authorization header must be \"Bearer <token>\" or Basic with the token as "
        "password");
  }
  const std::optional<Role> role = FindTokenRole(tokens, token);
  if (!role) return absl::UnauthenticatedError("unknown token");
  if (*role == Role::kWorker) {
    return absl::PermissionDeniedError(
        "a worker's token may not read this page; use an operator or admin token");
  }
  return absl::OkStatus();
}

HttpServer::HttpServer(std::unique_ptr<Context> context, MHD_Daemon* daemon, int port)
    : context_(std::move(context)), daemon_(daemon), port_(port), watchdog_([this] { Watch(); }) {}

HttpServer::~HttpServer() {
  {
    absl::MutexLock lock(&context_->heads_mu);
    context_->stopping = true;
  }
  watchdog_.join();
  MHD_stop_daemon(daemon_);
}

int HttpServer::CloseOverdue() {
  const absl::Time now = context_->options.clock->Now();
  int closed = 0;
  absl::MutexLock lock(&context_->heads_mu);
  for (auto it = context_->heads.begin(); it != context_->heads.end();) {
    if (it->second.deadline > now) {
      ++it;
      continue;
    }
    CutOff(it->second.fd);
    it = context_->heads.erase(it);
    ++closed;
  }
  return closed;
}

int HttpServer::HeadsPending() const {
  absl::MutexLock lock(&context_->heads_mu);
  return static_cast<int>(context_->heads.size());
}

void HttpServer::Watch() {
  const absl::Duration interval = context_->options.watch_interval;
  LogLimiter limiter(absl::Minutes(1));
  uint64_t closed_since = 0;
  for (;;) {
    {
      absl::MutexLock lock(&context_->heads_mu);
      context_->heads_mu.AwaitWithTimeout(absl::Condition(&context_->stopping), interval);
      if (context_->stopping) return;
    }
    const int closed = CloseOverdue();
    if (closed == 0) continue;
    closed_since += closed;
    uint64_t held_back = 0;
    if (limiter.ShouldLog(0, context_->options.clock->Now(), &held_back)) {
      DDP_LOG(Warning) << context_->options.what << ": closed " << closed_since
                       << " connection(s) that had not sent a whole request within "
                       << absl::FormatDuration(context_->options.access.header_timeout)
                       << " of connecting (slow or idle clients)";
      closed_since = 0;
    }
  }
}

std::string HttpServer::url() const {
  const std::string& listen = context_->options.listen;
  return absl::StrCat(context_->options.access.tls() ? "https://" : "http://",
                      listen.substr(0, listen.rfind(':')), ":", port_);
}

namespace {

// Where the server binds: the address given, not every interface. Adds
// MHD_USE_IPv6 to `flags` for an IPv6 address.
absl::Status ToSockaddr(const HttpServer::Options& options, const HostPort& address,
                        sockaddr_storage* bind_address, unsigned int* flags) {
  const std::string host = address.host == "localhost" ? "127.0.0.1" : address.host;
  auto* v4 = reinterpret_cast<sockaddr_in*>(bind_address);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(bind_address);
  if (::inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(address.port);
  } else if (::inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(address.port);
    *flags |= MHD_USE_IPv6;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        options.flag, ": ", options.what, " listens on an IP address (or localhost), not ", host));
  }
  return absl::OkStatus();
}

// The PEM files TLS serves with (all empty without TLS; `ca` empty when
// clients need no certificate).
struct TlsFiles {
  std::string cert, key, ca;
};

absl::StatusOr<TlsFiles> ReadTlsFiles(const HttpServer::Options& o) {
  TlsFiles files;
  if (!o.access.tls()) return files;
  auto read = [&](const std::string& path, absl::string_view what,
                  std::string* out) -> absl::Status {
    auto pem = ReadPem(path, what);
    if (!pem.ok()) {
      return absl::UnavailableError(
          absl::StrCat("can't serve ", o.what, " (", o.flag, "): ", pem.status().message()));
    }
    *out = std::move(*pem);
    return absl::OkStatus();
  };
  if (absl::Status s = read(o.access.tls_cert, "certificate", &files.cert); !s.ok()) return s;
  if (absl::Status s = read(o.access.tls_key, "private key", &files.key); !s.ok()) return s;
  if (!o.access.tls_ca.empty()) {
    if (absl::Status s = read(o.access.tls_ca, "CA certificate", &files.ca); !s.ok()) return s;
  }
  return files;
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(Options options,
                                                              HttpHandler handler) {
  if (absl::Status s = CheckHttpListen(options.flag, options.what, options.listen, options.access);
      !s.ok()) {
    return s;
  }
  auto address = ParseHostPort(options.listen, /*allow_port_zero=*/true);
  sockaddr_storage bind_address{};
  unsigned int flags = MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ERROR_LOG;
  if (absl::Status s = ToSockaddr(options, *address, &bind_address, &flags); !s.ok()) return s;
  auto context = std::make_unique<Context>();
  context->options = std::move(options);
  context->handler = std::move(handler);
  const Options& o = context->options;
  absl::StatusOr<TlsFiles> tls = ReadTlsFiles(o);
  if (!tls.ok()) return tls.status();
  if (o.access.tls()) flags |= MHD_USE_TLS;
  const size_t memory = static_cast<size_t>(o.max_request_bytes) + 8192;  // + the response head
  std::vector<MHD_OptionItem> items = {
      {MHD_OPTION_SOCK_ADDR, 0, &bind_address},
      {MHD_OPTION_THREAD_POOL_SIZE, o.threads, nullptr},
      {MHD_OPTION_CONNECTION_LIMIT, o.access.max_connections, nullptr},
      // A backstop: unfinished heads past the cap are ended by newcomers
      // (NotifyConnection); this bounds what one address holds meanwhile.
      {MHD_OPTION_PER_IP_CONNECTION_LIMIT, 4 * o.access.max_connections_per_address, nullptr},
      {MHD_OPTION_NOTIFY_CONNECTION, reinterpret_cast<intptr_t>(&NotifyConnection), context.get()},
      {MHD_OPTION_LISTEN_BACKLOG_SIZE, o.queue, nullptr},
      {MHD_OPTION_CONNECTION_TIMEOUT,
       std::max<intptr_t>(1, absl::ToInt64Seconds(o.request_timeout)), nullptr},
      {MHD_OPTION_CONNECTION_MEMORY_LIMIT, static_cast<intptr_t>(memory), nullptr},
      {MHD_OPTION_EXTERNAL_LOGGER, reinterpret_cast<intptr_t>(&LogHttpdMessage), context.get()},
  };
  if (o.access.tls()) {
    items.push_back({MHD_OPTION_HTTPS_MEM_CERT, 0, tls->cert.data()});
    items.push_back({MHD_OPTION_HTTPS_MEM_KEY, 0, tls->key.data()});
    items.push_back({MHD_OPTION_HTTPS_PRIORITIES, 0,
                     const_cast<char*>("NORMAL:-VERS-ALL:+VERS-TLS1.3:+VERS-TLS1.2")});
    if (!tls->ca.empty()) items.push_back({MHD_OPTION_HTTPS_MEM_TRUST, 0, tls->ca.data()});
  }
  items.push_back({MHD_OPTION_END, 0, nullptr});
  MHD_Daemon* daemon = MHD_start_daemon(flags, 0, nullptr, nullptr, &Handle, context.get(),
                                        MHD_OPTION_ARRAY, items.data(), MHD_OPTION_END);
  {
    absl::MutexLock lock(&context->mu);
    if (daemon == nullptr) {
      // libmicrohttpd's own words name the wrong port ("port 0"): say which
      // port, and who has it, when that is the trouble.
      std::string why = context->start_error.empty() ? "unknown error" : context->start_error;
      if (address->port > 0 && PortListened(address->port)) {
        why = absl::StrCat("port ", address->port, " is in use by ",
                           DescribePortHolder(address->port));
      }
      return absl::UnavailableError(
          absl::StrCat("can't serve ", o.what, " on ", o.listen, " (", o.flag, "): ", why));
    }
    context->started = true;
  }
  const MHD_DaemonInfo* bound = MHD_get_daemon_info(daemon, MHD_DAEMON_INFO_BIND_PORT);
  const int port = bound != nullptr ? bound->port : address->port;
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(context), daemon, port));
}

}  // namespace ddp
