#include "coordinator/service.h"

#include <algorithm>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/credentials.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "coordinator/attach_stream.h"
#include "coordinator/worker_pages.h"

namespace ddp {
namespace {

grpc::ServerUnaryReactor* Reply(grpc::CallbackServerContext* context, const absl::Status& s) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(s));
  return reactor;
}

// One StoreGet: answered when the key is set, the wait times out or the
// caller goes away. Frees itself in OnDone.
class StoreGetCall final : public grpc::ServerUnaryReactor {
 public:
  StoreGetCall(Coordinator* core, v1::StoreGetResponse* response)
      : core_(core), response_(response) {}

  // Called from the method handler, so before gRPC can call OnCancel or
  // OnDone: the waiter id is set before anyone reads it.
  void Start(const v1::StoreGetRequest& request, absl::string_view store_token) {
    const KvStore::WaiterId waiter = core_->StoreGet(
        request,
        [this](absl::StatusOr<std::string> value) {
          // Runs once, whichever way the wait ends.
          if (value.ok()) response_->set_value(std::move(*value));
          Finish(ToGrpcStatus(value.status()));
        },
        store_token);
    absl::MutexLock lock(&mu_);
    waiter_ = waiter;
  }

  void OnCancel() override {
    KvStore::WaiterId waiter;
    {
      absl::MutexLock lock(&mu_);
      waiter = waiter_;
    }
    // Finishes the call with CANCELLED unless it was answered already.
    if (waiter != 0) core_->CancelStoreGet(waiter);
  }

  void OnDone() override { delete this; }

 private:
  Coordinator* const core_;
  v1::StoreGetResponse* const response_;
  absl::Mutex mu_;
  KvStore::WaiterId waiter_ ABSL_GUARDED_BY(mu_) = 0;
};

// A streaming call refused before anything was read or written: finishes
// at once (gRPC holds the Finish until the reactor is bound), frees itself.
template <typename Base>
class Refused final : public Base {
 public:
  explicit Refused(const absl::Status& s) { this->Finish(ToGrpcStatus(s)); }
  void OnDone() override { delete this; }
};

// The caller's store token, or empty.
std::string StoreToken(const grpc::CallbackServerContext* context) {
  const auto& metadata = context->client_metadata();
  auto it = metadata.find(kStoreTokenMetadata);
  if (it == metadata.end()) return "";
  return std::string(it->second.data(), it->second.size());
}

}  // namespace

CoordinatorService::CoordinatorService(Coordinator* core, StatusWatchers* watchers,
                                       const Authorizer* authorizer, CallObserver* attach_observer,
                                       const Leadership* leadership)
    : core_(core),
      watchers_(watchers),
      authorizer_(authorizer),
      attach_observer_(attach_observer),
      leadership_(leadership) {}

absl::Status CoordinatorService::Allow(grpc::CallbackServerContext* context, const char* method) {
  // A leader whose lease may have lapsed answers nothing: another may lead.
  if (leadership_ != nullptr && !leadership_->IsLeader()) {
    const std::string leader = leadership_->LeaderAddress();
    if (!leader.empty()) context->AddTrailingMetadata(kLeaderMetadata, leader);
    return absl::UnavailableError(NotLeaderMessage(leader, leadership_->EtcdTrouble()));
  }
  if (authorizer_ == nullptr) return absl::OkStatus();
  absl::Status s = authorizer_->Check(method, *context);
  if (s.ok()) return s;
  uint64_t held_back = 0;
  bool log = false;
  {
    absl::MutexLock lock(&log_mu_);
    log = refusal_log_.ShouldLog(static_cast<int>(s.code()), absl::Now(), &held_back);
  }
  if (log) {
    DDP_LOG(Warning) << "refused " << method << " from " << context->peer() << ": "
                     << absl::StatusCodeToString(s.code()) << ": " << s.message()
                     << (held_back ? absl::StrCat(" (", held_back, " more refusals not logged)")
                                   : "");
  }
  return s;
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* CoordinatorService::Attach(
    grpc::CallbackServerContext* context) {
  // Before the first read: a caller without a worker token is never heard.
  if (absl::Status s = Allow(context, method::kAttach); !s.ok()) {
    ObservedCall(attach_observer_, method::kAttach).Handled(ToGrpcStatus(s).error_code());
    return new Refused<grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>>(s);
  }
  return AttachStream::Start(core_, context, attach_observer_);
}

grpc::ServerUnaryReactor* CoordinatorService::StoreSet(grpc::CallbackServerContext* context,
                                                       const v1::StoreSetRequest* request,
                                                       v1::StoreSetResponse* /*response*/) {
  if (absl::Status s = Allow(context, method::kStoreSet); !s.ok()) return Reply(context, s);
  return Reply(context, core_->StoreSet(*request, StoreToken(context)));
}

grpc::ServerUnaryReactor* CoordinatorService::StoreGet(grpc::CallbackServerContext* context,
                                                       const v1::StoreGetRequest* request,
                                                       v1::StoreGetResponse* response) {
  if (absl::Status s = Allow(context, method::kStoreGet); !s.ok()) return Reply(context, s);
  // The RPC's request and response stay alive until OnDone.
  auto* call = new StoreGetCall(core_, response);
  call->Start(*request, StoreToken(context));
  return call;
}

grpc::ServerUnaryReactor* CoordinatorService::StoreAdd(grpc::CallbackServerContext* context,
                                                       const v1::StoreAddRequest* request,
                                                       v1::StoreAddResponse* response) {
  if (absl::Status s = Allow(context, method::kStoreAdd); !s.ok()) return Reply(context, s);
  absl::StatusOr<int64_t> value = core_->StoreAdd(*request, StoreToken(context));
  if (value.ok()) response->set_value(*value);
  return Reply(context, value.status());
}

grpc::ServerUnaryReactor* CoordinatorService::GetStatus(grpc::CallbackServerContext* context,
                                                        const v1::GetStatusRequest* request,
                                                        v1::JobStatus* response) {
  if (absl::Status s = Allow(context, method::kGetStatus); !s.ok()) return Reply(context, s);
  absl::StatusOr<std::shared_ptr<const v1::JobStatus>> view =
      core_->JobStatusView(request->job_id());
  if (!view.ok()) return Reply(context, view.status());
  *response = **view;
  if (leadership_ != nullptr) *response->mutable_leadership() = leadership_->Describe();
  return Reply(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* CoordinatorService::ListWorkers(grpc::CallbackServerContext* context,
                                                          const v1::ListWorkersRequest* request,
                                                          v1::ListWorkersResponse* response) {
  if (absl::Status s = Allow(context, method::kListWorkers); !s.ok()) return Reply(context, s);
  absl::StatusOr<v1::ListWorkersResponse> page = PageOfWorkers(*core_->Snapshot(), *request);
  if (page.ok()) *response = *std::move(page);
  return Reply(context, page.status());
}

grpc::ServerUnaryReactor* CoordinatorService::SubmitJob(grpc::CallbackServerContext* context,
                                                        const v1::SubmitJobRequest* request,
                                                        v1::SubmitJobResponse* response) {
  if (absl::Status s = Allow(context, method::kSubmitJob); !s.ok()) return Reply(context, s);
  if (!request->has_spec()) {
    return Reply(context, absl::InvalidArgumentError("SubmitJobRequest.spec is missing"));
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // The reply comes when the job's check is done (a helper process may take
  // a while); no thread waits for it here.
  core_->SubmitJob(
      request->spec(),
      [core = core_, reactor, response](absl::StatusOr<v1::JobSpec> spec) {
        if (spec.ok()) {
          response->set_job_id(spec->name());
          *response->mutable_spec() = *spec;
          // Where it is now: taking the pool, or queued behind whom.
          if (absl::StatusOr<v1::JobSummary> job = core->GetJob(spec->name()); job.ok()) {
            response->set_state(job->state());
            response->set_message(job->message());
          }
        }
        reactor->Finish(ToGrpcStatus(spec.status()));
      },
      authorizer_ ? authorizer_->OwnerOf(*context) : "");
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::CancelJob(grpc::CallbackServerContext* context,
                                                        const v1::CancelJobRequest* request,
                                                        v1::CancelJobResponse* /*response*/) {
  if (absl::Status s = Allow(context, method::kCancelJob); !s.ok()) return Reply(context, s);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // Answered once the cancellation is saved; no thread waits for it here.
  Coordinator::Caller caller;
  if (authorizer_) caller = {authorizer_->OwnerOf(*context), authorizer_->ActsForAll(*context)};
  core_->CancelJob(
      request->job_id(), request->reason(),
      [reactor](absl::Status s) { reactor->Finish(ToGrpcStatus(s)); }, caller);
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::ListJobs(grpc::CallbackServerContext* context,
                                                       const v1::ListJobsRequest* request,
                                                       v1::ListJobsResponse* response) {
  if (absl::Status s = Allow(context, method::kListJobs); !s.ok()) return Reply(context, s);
  absl::StatusOr<v1::ListJobsResponse> page = core_->ListJobs(*request);
  if (page.ok()) *response = *std::move(page);
  return Reply(context, page.status());
}

grpc::ServerUnaryReactor* CoordinatorService::GetJob(grpc::CallbackServerContext* context,
                                                     const v1::GetJobRequest* request,
                                                     v1::JobSummary* response) {
  if (absl::Status s = Allow(context, method::kGetJob); !s.ok()) return Reply(context, s);
  absl::StatusOr<v1::JobSummary> job = core_->GetJob(request->job_id());
  if (job.ok()) *response = *std::move(job);
  return Reply(context, job.status());
}

grpc::ServerWriteReactor<v1::JobStatus>* CoordinatorService::WatchStatus(
    grpc::CallbackServerContext* context, const v1::WatchStatusRequest* request) {
  if (absl::Status s = Allow(context, method::kWatchStatus); !s.ok()) {
    return new Refused<grpc::ServerWriteReactor<v1::JobStatus>>(s);
  }
  double seconds = request->interval_seconds() == 0 ? 1.0 : request->interval_seconds();
  seconds = std::clamp(seconds, 0.05, 3600.0);
  // A job that has a status now: its first snapshot goes out at once.
  absl::StatusOr<std::shared_ptr<const v1::JobStatus>> first =
      core_->JobStatusView(request->job_id());
  if (!first.ok()) return new Refused<grpc::ServerWriteReactor<v1::JobStatus>>(first.status());
  return watchers_->Start(*std::move(first), absl::Seconds(seconds), absl::Now(),
                          request->job_id());
}

}  // namespace ddp
