// The live status page: one HTML page (with its script and style, embedded
// in the binary at build time: nothing is fetched from anywhere else) and
// /api/status, the snapshot as protobuf JSON plus each rank's recent curve.
//
// main() serves it on an HttpServer (TLS, tokens, and the bounds on what a
// client can make it hold are there). Handlers read Coordinator::Snapshot()
// (a shared_ptr copy) and never wait behind the coordinator's lock.
#ifndef DDP_COORDINATOR_STATUS_PAGE_H_
#define DDP_COORDINATOR_STATUS_PAGE_H_

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/http_server.h"
#include "coordinator/status_history.h"
#include "ddp/v1/status.pb.h"

namespace ddp {

// Headers every response of the page carries: a strict Content Security
// Policy (the page loads only what it serves itself, and is never framed).
std::vector<std::pair<std::string, std::string>> StatusPageHeaders();

using SnapshotFn = std::function<std::shared_ptr<const v1::JobStatus>()>;

// Answers GET or HEAD of "/", "/status.js", "/status.css" and "/api/status";
// 404 for any other path, 405 for any other method. Pure (built from the
// snapshot and the history) and thread-safe.
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

}  // namespace ddp

#endif  // DDP_COORDINATOR_STATUS_PAGE_H_
