#include "coordinator/status_page.h"

#include <civetweb.h>

#include <mutex>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "common/net_address.h"
#include "coordinator/status_page_assets.h"
#include "google/protobuf/util/json_util.h"

namespace ddp {
namespace {

// The page loads only what it serves itself, and is never framed.
constexpr char kSecurityHeaders[] =
    "Content-Security-Policy: default-src 'none'; script-src 'self'; style-src 'self'; "
    "connect-src 'self'; img-src 'self'; frame-ancestors 'none'; base-uri 'none'\r\n"
    "X-Content-Type-Options: nosniff\r\n"
    "Referrer-Policy: no-referrer\r\n";

HttpResponse Text(int code, std::string body) {
  return {code, "text/plain; charset=utf-8", std::move(body)};
}

const char* Reason(int code) {
  switch (code) {
    case 200:
      return "OK";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    default:
      return "Error";
  }
}

int Handle(mg_connection* conn, void* data) {
  const auto* handler = static_cast<const StatusPageHandler*>(data);
  const mg_request_info* request = mg_get_request_info(conn);
  const absl::string_view method = request->request_method ? request->request_method : "";
  const HttpResponse response =
      handler->Respond(method, request->local_uri ? request->local_uri : "");
  // Each response closes its connection: a client can't park idle
  // keep-alive connections on the few handler threads.
  mg_printf(conn,
            "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
            "Cache-Control: no-store\r\n%s%sConnection: close\r\n\r\n",
            response.code, Reason(response.code), response.content_type.c_str(),
            response.body.size(), kSecurityHeaders,
            response.code == 405 ? "Allow: GET, HEAD\r\n" : "");
  if (method != "HEAD") mg_write(conn, response.body.data(), response.body.size());
  return response.code;
}

// civetweb's own messages (a bad request, a refused connection) go to our
// log, not stderr.
int LogCivetwebMessage(const mg_connection*, const char* message) {
  DDP_LOG(Warning) << "status page: " << message;
  return 1;
}

}  // namespace

StatusPageHandler::StatusPageHandler(SnapshotFn snapshot, const StatusHistory* history,
                                     const Clock* clock)
    : snapshot_(std::move(snapshot)), history_(history), clock_(clock) {}

HttpResponse StatusPageHandler::Respond(absl::string_view method, absl::string_view path) const {
  if (method != "GET" && method != "HEAD") return Text(405, "only GET and HEAD\n");
  if (path == "/api/status") return {200, "application/json", ApiStatus()};
  for (size_t i = 0; i < kStatusPageAssetCount; ++i) {
    const StaticAsset& asset = kStatusPageAssets[i];
    if (asset.path == path) {
      return {200, std::string(asset.content_type), std::string(asset.body)};
    }
  }
  return Text(404, absl::StrCat("no page at ", path.substr(0, 200), "\n"));
}

std::string StatusPageHandler::ApiStatus() const {
  const std::shared_ptr<const v1::JobStatus> status = snapshot_();
  std::string status_json = "null";
  if (status) {
    google::protobuf::util::JsonPrintOptions options;
    // The page reads every field; proto3 JSON would leave zeros out.
    options.always_print_primitive_fields = true;
    status_json.clear();
    if (!google::protobuf::util::MessageToJsonString(*status, &status_json, options).ok()) {
      status_json = "null";
    }
  }
  return absl::StrCat(
      "{\"now_unix_seconds\":",
      absl::StrFormat("%.3f", absl::ToDoubleSeconds(clock_->Now() - absl::UnixEpoch())),
      ",\"status\":", status_json, ",\"history\":", history_->ToJson(), "}");
}

absl::StatusOr<std::unique_ptr<StatusPageServer>> StatusPageServer::Start(
    const Options& options, const StatusPageHandler* handler) {
  auto address = ParseHostPort(options.listen, /*allow_port_zero=*/true);
  if (!address.ok()) return address.status();
  std::string host = address->host;
  if (host == "localhost") host = "127.0.0.1";
  // civetweb binds addresses, not names.
  if (host.find(':') != std::string::npos) {
    host = absl::StrCat("[", host, "]");
  } else if (host.find_first_not_of("0123456789.") != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("the status page listens on an IP address (or localhost), not ", host));
  }
  static std::once_flag library_init;
  std::call_once(library_init, [] { mg_init_library(0); });
  const std::string ports = absl::StrCat(host, ":", address->port);
  const std::string threads = absl::StrCat(options.threads);
  const std::string queue = absl::StrCat(options.queue);
  const std::string timeout = absl::StrCat(absl::ToInt64Milliseconds(options.request_timeout));
  const std::string max_request = absl::StrCat(options.max_request_bytes);
  // No document_root: civetweb serves no file, only the handler below.
  const char* config[] = {"listening_ports",
                          ports.c_str(),
                          "num_threads",
                          threads.c_str(),
                          "connection_queue",
                          queue.c_str(),
                          "listen_backlog",
                          queue.c_str(),
                          "request_timeout_ms",
                          timeout.c_str(),
                          "max_request_size",
                          max_request.c_str(),
                          "enable_keep_alive",
                          "no",
                          nullptr};
  mg_callbacks callbacks{};
  callbacks.log_message = LogCivetwebMessage;
  mg_init_data init{};
  init.callbacks = &callbacks;
  init.configuration_options = config;
  char error_text[256] = {};
  mg_error_data error{};
  error.text = error_text;
  error.text_buffer_size = sizeof(error_text);
  mg_context* ctx = mg_start2(&init, &error);
  if (ctx == nullptr) {
    return absl::UnavailableError(absl::StrCat("can't serve the status page on ", options.listen,
                                               ": ", error_text[0] ? error_text : "unknown error"));
  }
  mg_set_request_handler(ctx, "/", Handle, const_cast<StatusPageHandler*>(handler));
  mg_server_port bound[4] = {};
  const int n = mg_get_server_ports(ctx, 4, bound);
  const int port = n > 0 ? bound[0].port : address->port;
  return std::unique_ptr<StatusPageServer>(new StatusPageServer(ctx, port));
}

StatusPageServer::~StatusPageServer() { mg_stop(ctx_); }

}  // namespace ddp
