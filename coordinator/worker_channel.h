// The way down to one worker's stream, as the coordinator's core sees it
// (the gRPC layer implements it).
#ifndef DDP_COORDINATOR_WORKER_CHANNEL_H_
#define DDP_COORDINATOR_WORKER_CHANNEL_H_

#include "absl/status/status.h"
#include "ddp/v1/worker.pb.h"

namespace ddp {

class WorkerChannel {
 public:
  virtual ~WorkerChannel() = default;
  // Queues a message; never blocks. Thread-safe.
  virtual void Send(const v1::CoordinatorMessage& message) = 0;
  // Ends the stream with `status` once queued messages are written.
  virtual void Close(const absl::Status& status) = 0;
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_WORKER_CHANNEL_H_
