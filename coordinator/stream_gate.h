// Admission of worker streams (Attach): at most max_streams open at once,
// and a stream that has not sent its RegisterRequest within
// register_deadline is closed with DEADLINE_EXCEEDED, so silent
// connections can't pile up. Knows nothing of gRPC: a stream is a
// WorkerChannel, and time comes from the Clock (the Coordinator's Tick
// calls CloseUnregistered).
//
// Thread-safe. Channels are closed outside the gate's lock.
#ifndef DDP_COORDINATOR_STREAM_GATE_H_
#define DDP_COORDINATOR_STREAM_GATE_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <set>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "coordinator/worker_channel.h"

namespace ddp {

class StreamGate {
 public:
  struct Options {
    // Attach streams open at once, registered or not (ddp-coordinator
    // --max_attach_streams).
    size_t max_streams = 20'000;
    // How long a new stream has to send its RegisterRequest
    // (--register_deadline).
    absl::Duration register_deadline = absl::Seconds(10);
  };
  using StreamId = uint64_t;

  StreamGate(const Clock* clock, Options options) : clock_(clock), options_(options) {}

  // Admits a new stream, or RESOURCE_EXHAUSTED naming the limit when
  // max_streams are open. The gate does not own the channel.
  absl::StatusOr<StreamId> Open(std::weak_ptr<WorkerChannel> channel);
  // The stream sent its first message: the deadline no longer applies.
  void Registered(StreamId id);
  // The stream ended: its place is free. Unknown ids are ignored.
  void Closed(StreamId id);
  // Closes with DEADLINE_EXCEEDED every stream that has not registered
  // within the deadline. Called periodically.
  void CloseUnregistered();

  size_t open() const;
  size_t unregistered() const;

 private:
  struct Pending {
    absl::Time deadline;
    std::weak_ptr<WorkerChannel> channel;
  };

  const Clock* clock_;
  const Options options_;
  mutable absl::Mutex mu_;
  std::set<StreamId> open_ ABSL_GUARDED_BY(mu_);
  // Streams yet to register. Ids grow with time, so the map is in deadline
  // order too.
  std::map<StreamId, Pending> unregistered_ ABSL_GUARDED_BY(mu_);
  StreamId next_id_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_STREAM_GATE_H_
