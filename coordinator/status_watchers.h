// WatchStatus streams: each gets the latest snapshot of the job it asked
// for (or of the pool's default) every interval it asked for. The ticker
// calls Broadcast; a slow client skips snapshots rather than queueing them;
// a stream whose job is no longer kept ends with why. At most max_watches are open at once
// (ddp-coordinator --max_watch_streams); more are refused with
// RESOURCE_EXHAUSTED. No lock of this class is held while it calls gRPC.
#ifndef DDP_COORDINATOR_STATUS_WATCHERS_H_
#define DDP_COORDINATOR_STATUS_WATCHERS_H_

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ddp/v1/status.pb.h"
#include "grpcpp/grpcpp.h"

namespace ddp {

class StatusWatch;

class StatusWatchers {
 public:
  static constexpr size_t kDefaultMaxWatches = 64;

  // The status of job `job_id` ("": the default view), or why there is none.
  using ViewOf = std::function<absl::StatusOr<std::shared_ptr<const v1::JobStatus>>(
      const std::string& job_id)>;

  explicit StatusWatchers(size_t max_watches = kDefaultMaxWatches) : max_watches_(max_watches) {}

  // Starts a watch stream of job `job_id` ("": the default view) that
  // writes `first` at once, or one that ends at once with
  // RESOURCE_EXHAUSTED when max_watches are open. The reactor is gRPC's
  // until OnDone.
  grpc::ServerWriteReactor<v1::JobStatus>* Start(std::shared_ptr<const v1::JobStatus> first,
                                                 absl::Duration interval, absl::Time now,
                                                 const std::string& job_id = "");
  // Offers each watch whose interval has passed its job's view, asking
  // `view_of` once per job; a watch whose job has none ends with why.
  // Thread-safe.
  void Broadcast(const ViewOf& view_of, absl::Time now);
  // Ends every watch (server shutdown). Thread-safe.
  void FinishAll();
  // Watches open now (their OnDone not yet run). Thread-safe.
  size_t open_count();

 private:
  friend class StatusWatch;
  // The open watches, each held so that it outlives its use after mu_ is
  // released.
  std::vector<std::shared_ptr<StatusWatch>> Open();
  void Remove(StatusWatch* watch);

  const size_t max_watches_;
  absl::Mutex mu_;
  absl::flat_hash_map<StatusWatch*, std::shared_ptr<StatusWatch>> watches_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_STATUS_WATCHERS_H_
