// One worker's Attach stream: reads WorkerMessages into the Coordinator and
// writes CoordinatorMessages queued through the WorkerChannel interface, one
// write in flight at a time.
#ifndef DDP_COORDINATOR_ATTACH_STREAM_H_
#define DDP_COORDINATOR_ATTACH_STREAM_H_

#include <deque>
#include <memory>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/coordinator.h"
#include "grpcpp/grpcpp.h"

namespace ddp {

// Owns itself: gRPC holds the reactor until OnDone, the Coordinator holds it
// as a WorkerChannel for as long as it likes; the last owner frees it. After
// OnDone, Send and Close do nothing.
class AttachStream final
    : public grpc::ServerBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage>,
      public WorkerChannel {
 public:
  // Starts reading; returns the reactor for gRPC.
  static AttachStream* Start(Coordinator* core);

  void Send(const v1::CoordinatorMessage& message) override;
  void Close(const absl::Status& status) override;

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnDone() override;

 private:
  explicit AttachStream(Coordinator* core) : core_(core) {}
  // Starts the next write or the finish, if one is due. Called without mu_:
  // gRPC may run reactions inline.
  void Pump();
  void ReportClosed(const std::string& reason);

  Coordinator* core_;
  std::shared_ptr<AttachStream> self_;
  // Touched only by OnReadDone, which gRPC never runs concurrently with itself.
  v1::WorkerMessage in_;
  std::optional<Coordinator::Session> session_;

  absl::Mutex mu_;
  std::deque<v1::CoordinatorMessage> queue_ ABSL_GUARDED_BY(mu_);
  v1::CoordinatorMessage out_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<grpc::Status> finish_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_reported_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_ATTACH_STREAM_H_
