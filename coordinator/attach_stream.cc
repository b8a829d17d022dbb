#include "coordinator/attach_stream.h"

#include "common/grpc_status.h"
#include "common/logging.h"

namespace ddp {

AttachStream* AttachStream::Start(Coordinator* core) {
  std::shared_ptr<AttachStream> stream(new AttachStream(core));
  stream->self_ = stream;
  stream->StartRead(&stream->in_);
  return stream.get();
}

void AttachStream::Send(const v1::CoordinatorMessage& message) {
  {
    absl::MutexLock lock(&mu_);
    if (done_ || finish_) return;
    queue_.push_back(message);
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
      out_ = std::move(queue_.front());
      queue_.pop_front();
      writing_ = true;
      action = kWrite;
    } else if (finish_) {
      finished_ = true;
      finish_status = *finish_;
      action = kFinish;
    }
  }
  // out_ is stable while writing_ is set: only the owner of the write
  // touches it again, in OnWriteDone.
  if (action == kWrite) StartWrite(&out_);
  if (action == kFinish) Finish(finish_status);
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
  {
    absl::MutexLock lock(&mu_);
    if (closed_reported_ || !session_) return;
    closed_reported_ = true;
  }
  core_->OnStreamClosed(*session_, reason);
}

void AttachStream::OnReadDone(bool ok) {
  if (!ok) {
    ReportClosed("its stream closed (process exited or connection lost)");
    Close(absl::OkStatus());
    return;
  }
  if (!session_) {
    if (in_.kind_case() != v1::WorkerMessage::kRegister) {
      Close(absl::InvalidArgumentError(
          "the first message on an Attach stream must be a RegisterRequest"));
      return;
    }
    absl::StatusOr<Coordinator::Session> session = core_->Attach(in_.register_(), self_);
    if (!session.ok()) {
      DDP_LOG(Warning) << "refused worker " << in_.register_().host() << " "
                       << in_.register_().device() << ": " << session.status().message();
      Close(session.status());
      return;
    }
    session_ = *session;
  } else {
    core_->OnMessage(*session_, in_);
  }
  StartRead(&in_);
}

void AttachStream::OnDone() {
  ReportClosed("its stream ended");
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
