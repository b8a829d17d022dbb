#include "coordinator/standby_service.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ddp {
namespace {

// A forwarded read waits at most this long for the leader.
constexpr auto kForwardTimeout = std::chrono::seconds(5);

template <typename Base>
class Refused final : public Base {
 public:
  explicit Refused(const grpc::Status& s) { this->Finish(s); }
  void OnDone() override { delete this; }
};

// The caller's token is forwarded; this service sends none of its own.
ClientSecurity WithoutToken(ClientSecurity security) {
  security.token.clear();
  return security;
}

// A forwarded call carries the caller's own token, and ends by the
// caller's deadline or `latest`, whichever comes first.
void Forward(const grpc::CallbackServerContext& from, grpc::ClientContext* to,
             std::chrono::system_clock::time_point latest) {
  for (const auto& [key, value] : from.client_metadata()) {
    if (key == kAuthorizationMetadata) {
      to->AddMetadata(kAuthorizationMetadata, std::string(value.data(), value.size()));
    }
  }
  to->set_deadline(std::min(from.deadline(), latest));
}

// The leader's answer, unless the leader could not be reached.
bool Reached(const grpc::Status& s) {
  return s.error_code() != grpc::StatusCode::UNAVAILABLE &&
         s.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED;
}

}  // namespace

StandbyService::StandbyService(const Leadership* leadership, ClientSecurity to_leader)
    : leadership_(leadership), to_leader_(WithoutToken(std::move(to_leader))) {}

grpc::Status StandbyService::Refusal(grpc::CallbackServerContext* context) const {
  const std::string leader = leadership_->LeaderAddress();
  if (!leader.empty()) context->AddTrailingMetadata(kLeaderMetadata, leader);
  return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                      NotLeaderMessage(leader, leadership_->EtcdTrouble()));
}

grpc::ServerUnaryReactor* StandbyService::RefuseUnary(grpc::CallbackServerContext* context) const {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(Refusal(context));
  return reactor;
}

std::shared_ptr<v1::Coordinator::Stub> StandbyService::LeaderStub() {
  const std::string leader = leadership_->LeaderAddress();
  if (leader.empty()) return nullptr;
  absl::MutexLock lock(&mu_);
  if (stub_ == nullptr || stub_address_ != leader) {
    stub_address_ = leader;
    stub_ = v1::Coordinator::NewStub(MakeChannel(leader, to_leader_, grpc::ChannelArguments()));
  }
  return stub_;
}

grpc::ServerBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage>* StandbyService::Attach(
    grpc::CallbackServerContext* context) {
  return new Refused<grpc::ServerBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage>>(
      Refusal(context));
}

grpc::ServerUnaryReactor* StandbyService::StoreSet(grpc::CallbackServerContext* context,
                                                   const v1::StoreSetRequest*,
                                                   v1::StoreSetResponse*) {
  return RefuseUnary(context);
}

grpc::ServerUnaryReactor* StandbyService::StoreGet(grpc::CallbackServerContext* context,
                                                   const v1::StoreGetRequest*,
                                                   v1::StoreGetResponse*) {
  return RefuseUnary(context);
}

grpc::ServerUnaryReactor* StandbyService::StoreAdd(grpc::CallbackServerContext* context,
                                                   const v1::StoreAddRequest*,
                                                   v1::StoreAddResponse*) {
  return RefuseUnary(context);
}

grpc::ServerUnaryReactor* StandbyService::SubmitJob(grpc::CallbackServerContext* context,
                                                    const v1::SubmitJobRequest*,
                                                    v1::SubmitJobResponse*) {
  return RefuseUnary(context);
}

grpc::ServerUnaryReactor* StandbyService::CancelJob(grpc::CallbackServerContext* context,
                                                    const v1::CancelJobRequest*,
                                                    v1::CancelJobResponse*) {
  return RefuseUnary(context);
}

grpc::ServerUnaryReactor* StandbyService::ListJobs(grpc::CallbackServerContext* context,
                                                   const v1::ListJobsRequest*,
                                                   v1::ListJobsResponse*) {
  return RefuseUnary(context);
}

grpc::ServerUnaryReactor* StandbyService::GetJob(grpc::CallbackServerContext* context,
                                                 const v1::GetJobRequest*, v1::JobSummary*) {
  return RefuseUnary(context);
}

namespace {

// A WatchStatus relayed from the leader: each status read from the leader's
// stream is written to the caller before the next is read, so a slow
// caller slows the relay, not the standby's memory. Ends when either side
// does; frees itself once both are done.
class ForwardedWatch final : public grpc::ServerWriteReactor<v1::JobStatus>,
                             public grpc::ClientReadReactor<v1::JobStatus> {
 public:
  // `refusal` makes the answer for a leader that could not be reached.
  explicit ForwardedWatch(std::function<grpc::Status()> refusal) : refusal_(std::move(refusal)) {}

  void Start(std::shared_ptr<v1::Coordinator::Stub> stub, const grpc::CallbackServerContext& from,
             const v1::WatchStatusRequest& request) {
    // A watch lasts as long as its caller wants.
    Forward(from, &upstream_, from.deadline());
    request_ = request;
    stub_ = std::move(stub);
    stub_->async()->WatchStatus(&upstream_, &request_, this);
    grpc::ClientReadReactor<v1::JobStatus>::StartRead(&status_);
    StartCall();
  }

  // The leader's side.
  void OnReadDone(bool ok) override {
    if (!ok) return;  // its OnDone follows
    absl::MutexLock lock(&mu_);
    writing_ = true;
    StartWrite(&status_);  // the next read waits for this write
  }
  void OnDone(const grpc::Status& s) override {
    {
      absl::MutexLock lock(&mu_);
      ended_ = Reached(s) ? s : refusal_();
      // A write in flight finishes first; its reaction finishes the call.
      if (!writing_) Finish(*ended_);
    }
    Release();
  }
  // The caller's side.
  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (ended_) {
      Finish(*ended_);
    } else if (ok) {
      grpc::ClientReadReactor<v1::JobStatus>::StartRead(&status_);
    } else {
      upstream_.TryCancel();
    }
  }
  void OnCancel() override { upstream_.TryCancel(); }
  void OnDone() override { Release(); }

 private:
  void Release() {
    if (--sides_ == 0) delete this;
  }

  const std::function<grpc::Status()> refusal_;
  std::shared_ptr<v1::Coordinator::Stub> stub_;  // the channel lives as long as the call
  grpc::ClientContext upstream_;
  v1::WatchStatusRequest request_;
  v1::JobStatus status_;
  absl::Mutex mu_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<grpc::Status> ended_ ABSL_GUARDED_BY(mu_);
  std::atomic<int> sides_{2};
};

}  // namespace

grpc::ServerWriteReactor<v1::JobStatus>* StandbyService::WatchStatus(
    grpc::CallbackServerContext* context, const v1::WatchStatusRequest* request) {
  std::shared_ptr<v1::Coordinator::Stub> stub = LeaderStub();
  if (stub == nullptr) {
    return new Refused<grpc::ServerWriteReactor<v1::JobStatus>>(Refusal(context));
  }
  auto* watch = new ForwardedWatch([this, context] { return Refusal(context); });
  watch->Start(std::move(stub), *context, *request);
  return watch;
}

// The two reads: the leader's answer as it is; when the leader can't be
// asked, the refusal naming it. `call` starts the call on the leader's
// async stub.
template <typename Call>
grpc::ServerUnaryReactor* StandbyService::ForwardUnary(grpc::CallbackServerContext* context,
                                                       Call call) {
  std::shared_ptr<v1::Coordinator::Stub> stub = LeaderStub();
  if (stub == nullptr) return RefuseUnary(context);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  auto upstream = std::make_shared<grpc::ClientContext>();
  Forward(*context, upstream.get(), std::chrono::system_clock::now() + kForwardTimeout);
  call(stub->async(), upstream.get(), [this, reactor, context, upstream, stub](grpc::Status s) {
    reactor->Finish(Reached(s) ? s : Refusal(context));
  });
  return reactor;
}

grpc::ServerUnaryReactor* StandbyService::GetStatus(grpc::CallbackServerContext* context,
                                                    const v1::GetStatusRequest* request,
                                                    v1::JobStatus* response) {
  return ForwardUnary(context, [&](auto* leader, grpc::ClientContext* upstream, auto done) {
    leader->GetStatus(upstream, request, response, std::move(done));
  });
}

grpc::ServerUnaryReactor* StandbyService::ListWorkers(grpc::CallbackServerContext* context,
                                                      const v1::ListWorkersRequest* request,
                                                      v1::ListWorkersResponse* response) {
  return ForwardUnary(context, [&](auto* leader, grpc::ClientContext* upstream, auto done) {
    leader->ListWorkers(upstream, request, response, std::move(done));
  });
}

}  // namespace ddp
