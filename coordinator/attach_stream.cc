#include "coordinator/attach_stream.h"

#include <atomic>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/quote.h"
#include "grpcpp/impl/codegen/proto_utils.h"

namespace ddp {
namespace {

// Refusals come in floods: say so at most every ten seconds.
bool LogRefusalNow() {
  static std::atomic<int64_t> last{0};
  const int64_t now = absl::ToUnixSeconds(absl::Now());
  int64_t before = last.load();
  return now - before >= 10 && last.compare_exchange_strong(before, now);
}

}  // namespace

AttachStream* AttachStream::Start(Coordinator* core, grpc::CallbackServerContext* context,
                                  CallObserver* observer) {
  std::shared_ptr<AttachStream> stream(new AttachStream(core, context, observer));
  stream->self_ = stream;
  absl::StatusOr<StreamGate::StreamId> admitted = core->streams()->Open(stream);
  if (!admitted.ok()) {
    if (LogRefusalNow()) DDP_LOG(Warning) << "refused Attach streams: " << admitted.status();
    {
      absl::MutexLock lock(&stream->mu_);
      stream->finish_ = ToGrpcStatus(admitted.status());
    }
    stream->Pump();
    return stream.get();
  }
  stream->gate_id_ = *admitted;
  stream->StartRead(&stream->in_bytes_);
  return stream.get();
}

void AttachStream::Send(const v1::CoordinatorMessage& message) {
  grpc::ByteBuffer bytes;
  bool own_buffer = false;
  if (!grpc::SerializationTraits<v1::CoordinatorMessage>::Serialize(message, &bytes, &own_buffer)
           .ok()) {
    DDP_LOG(Error) << "can't serialize a message to a worker";
    return;
  }
  bool cancel = false;
  {
    absl::MutexLock lock(&mu_);
    if (done_ || finish_) return;
    if (queue_.size() < kMaxQueuedMessages) {
      queue_.push_back(std::move(bytes));
    } else {
      // The worker does not read: the write in flight never completes, so
      // only cancelling the call ends it.
      queue_.clear();
      cut_off_ = absl::StrCat("it did not read its stream: ", kMaxQueuedMessages,
                              " messages to it were waiting (the limit per stream)");
      finish_ = grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                             absl::StrCat(kMaxQueuedMessages,
                                          " messages to this worker were waiting to be "
                                          "written, the limit per stream; read the stream"));
      // Finish waits until the cancel is done: OnDone, which can only
      // follow Finish, frees context_.
      cancel = writing_;
      cancelling_ = cancel;
    }
  }
  if (cancel) {
    context_->TryCancel();
    absl::MutexLock lock(&mu_);
    cancelling_ = false;
  }
  Pump();
}

void AttachStream::Close(const absl::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    if (done_ || finish_) return;
    finish_ = ToGrpcStatus(status);
  }
  Pump();
}

void AttachStream::Pump() {
  enum { kNothing, kWrite, kFinish } action = kNothing;
  grpc::Status finish_status;
  {
    absl::MutexLock lock(&mu_);
    if (writing_ || finished_ || done_) return;
    if (!queue_.empty()) {
      out_.Swap(&queue_.front());
      queue_.pop_front();
      writing_ = true;
      action = kWrite;
    } else if (finish_ && !cancelling_) {
      finished_ = true;
      finish_status = *finish_;
      action = kFinish;
    }
  }
  // out_ is stable while writing_ is set: only the owner of the write
  // touches it again, in OnWriteDone.
  if (action == kWrite) StartWrite(&out_);
  if (action == kFinish) {
    call_.Handled(finish_status.error_code());
    Finish(finish_status);
  }
}

void AttachStream::OnWriteDone(bool ok) {
  {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) {
      // The stream is broken; reads will fail too and report it.
      queue_.clear();
      if (!finish_) finish_ = grpc::Status::OK;
    }
  }
  Pump();
}

void AttachStream::ReportClosed(const std::string& reason) {
  std::string why;
  {
    absl::MutexLock lock(&mu_);
    if (closed_reported_ || !session_) return;
    closed_reported_ = true;
    why = cut_off_.empty() ? reason : cut_off_;
  }
  core_->OnStreamClosed(*session_, why);
}

bool AttachStream::OnRegister() {
  core_->streams()->Registered(gate_id_);
  if (in_.kind_case() != v1::WorkerMessage::kRegister) {
    Close(absl::InvalidArgumentError(
        "the first message on an Attach stream must be a RegisterRequest"));
    return false;
  }
  absl::StatusOr<Coordinator::Session> session = core_->Attach(in_.register_(), self_);
  if (!session.ok()) {
    DDP_LOG(Warning) << "refused worker " << Quote(in_.register_().host()) << " "
                     << Quote(in_.register_().device()) << ": " << session.status().message();
    Close(session.status());
    return false;
  }
  session_ = *session;
  return true;
}

void AttachStream::OnReadDone(bool ok) {
  if (!ok) {
    // The client ended the stream, or the call was cancelled (a message
    // that does not parse is told apart below).
    ReportClosed("its stream closed (process exited or connection lost)");
    Close(absl::OkStatus());
    return;
  }
  ++messages_read_;
  if (!grpc::SerializationTraits<v1::WorkerMessage>::Deserialize(&in_bytes_, &in_).ok()) {
    ReportClosed("it sent a message that is not a ddp.v1.WorkerMessage");
    Close(absl::InvalidArgumentError(
        absl::StrCat("message ", messages_read_,
                     " on the Attach stream is not a ddp.v1.WorkerMessage (it does not parse); "
                     "the stream is closed")));
    return;
  }
  if (!session_) {
    if (!OnRegister()) return;
  } else {
    core_->OnMessage(*session_, in_);
  }
  StartRead(&in_bytes_);
}

void AttachStream::OnDone() {
  call_.Handled(grpc::StatusCode::CANCELLED);  // unless it finished
  ReportClosed("its stream ended");
  core_->streams()->Closed(gate_id_);
  std::shared_ptr<AttachStream> self;
  {
    absl::MutexLock lock(&mu_);
    done_ = true;
    queue_.clear();
    self = std::move(self_);
  }
  // `self` may be the last owner: this object may be freed on return.
}

}  // namespace ddp
