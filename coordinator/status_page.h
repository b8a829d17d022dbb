// The live status page: one HTML page (with its script and style, embedded
// in the binary at build time: nothing is fetched from anywhere else) and
// /api/status, the snapshot as protobuf JSON plus each rank's recent curve.
//
// It has no TLS and no tokens, so main() serves it off loopback only with
// --insecure. What a client can make it hold is bounded: a few handler
// threads, a short accept queue, small requests, a request timeout. Handlers
// read Coordinator::Snapshot() (a shared_ptr copy) and never wait behind the
// coordinator's lock.
#ifndef DDP_COORDINATOR_STATUS_PAGE_H_
#define DDP_COORDINATOR_STATUS_PAGE_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "coordinator/status_history.h"
#include "ddp/v1/status.pb.h"

struct mg_context;  // civetweb's, kept out of this header

namespace ddp {

// What one request gets. Pure: built from the snapshot and the history.
struct HttpResponse {
  int code = 200;
  std::string content_type;
  std::string body;
};

using SnapshotFn = std::function<std::shared_ptr<const v1::JobStatus>()>;

// Answers GET or HEAD of "/", "/status.js", "/status.css" and "/api/status";
// 404 for any other path, 405 for any other method. Thread-safe.
class StatusPageHandler {
 public:
  // None owned; all outlive this.
  StatusPageHandler(SnapshotFn snapshot, const StatusHistory* history, const Clock* clock);
  HttpResponse Respond(absl::string_view method, absl::string_view path) const;

 private:
  std::string ApiStatus() const;

  SnapshotFn snapshot_;
  const StatusHistory* history_;
  const Clock* clock_;
};

class StatusPageServer {
 public:
  struct Options {
    // HOST:PORT, the host an IP address or "localhost"; port 0 picks one.
    std::string listen;
    // Requests served at once; more wait in a queue of `queue` connections,
    // and beyond that are not accepted.
    int threads = 4;
    int queue = 16;
    absl::Duration request_timeout = absl::Seconds(10);
    // Largest request head accepted (the page takes no request bodies).
    int max_request_bytes = 8192;
  };

  // Serves `handler` (not owned; outlives the server). INVALID_ARGUMENT for
  // a malformed address, UNAVAILABLE when it can't be bound (with civetweb's
  // reason).
  static absl::StatusOr<std::unique_ptr<StatusPageServer>> Start(const Options& options,
                                                                 const StatusPageHandler* handler);
  // Stops accepting and waits for the requests in progress.
  ~StatusPageServer();

  // The port served on (the one picked, for port 0).
  int port() const { return port_; }

 private:
  StatusPageServer(mg_context* ctx, int port) : ctx_(ctx), port_(port) {}
  mg_context* ctx_;
  int port_;
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_STATUS_PAGE_H_
