// One worker's Attach stream: reads WorkerMessages into the Coordinator and
// writes CoordinatorMessages queued through the WorkerChannel interface, one
// write in flight at a time.
//
// Limits: the stream is admitted by the Coordinator's StreamGate (at most
// --max_attach_streams open, RESOURCE_EXHAUSTED beyond; closed with
// DEADLINE_EXCEEDED when it sends no RegisterRequest in time), and at most
// kMaxQueuedMessages wait to be written: a worker that stops reading its
// stream is cut off (the call is cancelled, as the write in flight never
// completes; the worker sees CANCELLED) and counts as lost.
//
// The stream is read as raw bytes and parsed here, not by gRPC: with a
// typed callback method, a message that does not parse reaches OnReadDone
// as ok=false, exactly like the client ending the stream (gRPC 1.51,
// CallOpRecvMessage::FinishOp), so garbage would end with status OK.
// Parsing here tells them apart: garbage ends with INVALID_ARGUMENT.
#ifndef DDP_COORDINATOR_ATTACH_STREAM_H_
#define DDP_COORDINATOR_ATTACH_STREAM_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/authorizer.h"
#include "coordinator/call_observer.h"
#include "coordinator/coordinator.h"
#include "grpcpp/grpcpp.h"

namespace ddp {

// Owns itself: gRPC holds the reactor until OnDone, the Coordinator holds it
// as a WorkerChannel for as long as it likes; the last owner frees it. After
// OnDone, Send and Close do nothing.
class AttachStream final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
                           public WorkerChannel {
 public:
  // Messages waiting to be written to one worker before it counts as stuck.
  // A healthy worker has a handful at most.
  static constexpr size_t kMaxQueuedMessages = 1000;

  // Admits the stream and starts reading, or refuses it; returns the
  // reactor for gRPC. `context` is gRPC's, valid until OnDone. `observer`
  // (may be null) hears of the call's start and end.
  static AttachStream* Start(Coordinator* core, grpc::CallbackServerContext* context,
                             CallObserver* observer);

  void Send(const v1::CoordinatorMessage& message) override;
  void Close(const absl::Status& status) override;

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnDone() override;

 private:
  AttachStream(Coordinator* core, grpc::CallbackServerContext* context, CallObserver* observer)
      : core_(core), context_(context), call_(observer, method::kAttach) {}
  // Starts the next write or the finish, if one is due. Called without mu_:
  // gRPC may run reactions inline.
  void Pump();
  void ReportClosed(const std::string& reason);
  // Takes the first message: registers the worker, or closes the stream.
  // False when the stream was closed.
  bool OnRegister();

  Coordinator* const core_;
  grpc::CallbackServerContext* const context_;
  // Told of the status at Finish (or CANCELLED at OnDone, without one).
  // Used by Pump's finish, which happens once, and then by OnDone.
  ObservedCall call_;
  std::shared_ptr<AttachStream> self_;
  // Set in Start; 0 when the gate refused the stream.
  StreamGate::StreamId gate_id_ = 0;
  // Touched only by OnReadDone, which gRPC never runs concurrently with itself.
  grpc::ByteBuffer in_bytes_;
  v1::WorkerMessage in_;
  uint64_t messages_read_ = 0;
  std::optional<Coordinator::Session> session_;

  absl::Mutex mu_;
  std::deque<grpc::ByteBuffer> queue_ ABSL_GUARDED_BY(mu_);
  grpc::ByteBuffer out_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<grpc::Status> finish_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_reported_ ABSL_GUARDED_BY(mu_) = false;
  // Send is calling context_->TryCancel: no Finish until it returns.
  bool cancelling_ ABSL_GUARDED_BY(mu_) = false;
  // Why the worker is lost, when the coordinator cut it off.
  std::string cut_off_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_ATTACH_STREAM_H_
