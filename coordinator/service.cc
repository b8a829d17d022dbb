#include "coordinator/service.h"

#include <algorithm>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_status.h"
#include "coordinator/attach_stream.h"

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
  void Start(const v1::StoreGetRequest& request) {
    const KvStore::WaiterId waiter =
        core_->StoreGet(request, [this](absl::StatusOr<std::string> value) {
          // Runs once, whichever way the wait ends.
          if (value.ok()) response_->set_value(std::move(*value));
          Finish(ToGrpcStatus(value.status()));
        });
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

}  // namespace

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* CoordinatorService::Attach(
    grpc::CallbackServerContext* context) {
  return AttachStream::Start(core_, context);
}

grpc::ServerUnaryReactor* CoordinatorService::StoreSet(grpc::CallbackServerContext* context,
                                                       const v1::StoreSetRequest* request,
                                                       v1::StoreSetResponse* /*response*/) {
  return Reply(context, core_->StoreSet(*request));
}

grpc::ServerUnaryReactor* CoordinatorService::StoreGet(grpc::CallbackServerContext* /*context*/,
                                                       const v1::StoreGetRequest* request,
                                                       v1::StoreGetResponse* response) {
  // The RPC's request and response stay alive until OnDone.
  auto* call = new StoreGetCall(core_, response);
  call->Start(*request);
  return call;
}

grpc::ServerUnaryReactor* CoordinatorService::StoreAdd(grpc::CallbackServerContext* context,
                                                       const v1::StoreAddRequest* request,
                                                       v1::StoreAddResponse* response) {
  absl::StatusOr<int64_t> value = core_->StoreAdd(*request);
  if (value.ok()) response->set_value(*value);
  return Reply(context, value.status());
}

grpc::ServerUnaryReactor* CoordinatorService::GetStatus(grpc::CallbackServerContext* context,
                                                        const v1::GetStatusRequest* /*request*/,
                                                        v1::JobStatus* response) {
  *response = *core_->Snapshot();
  return Reply(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* CoordinatorService::ListWorkers(grpc::CallbackServerContext* context,
                                                          const v1::ListWorkersRequest* /*request*/,
                                                          v1::ListWorkersResponse* response) {
  std::shared_ptr<const v1::JobStatus> status = core_->Snapshot();
  *response->mutable_workers() = status->workers();
  return Reply(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* CoordinatorService::SubmitJob(grpc::CallbackServerContext* context,
                                                        const v1::SubmitJobRequest* request,
                                                        v1::SubmitJobResponse* response) {
  if (!request->has_spec()) {
    return Reply(context, absl::InvalidArgumentError("SubmitJobRequest.spec is missing"));
  }
  absl::StatusOr<v1::JobSpec> spec = core_->SubmitJob(request->spec());
  if (spec.ok()) {
    response->set_job_id(spec->name());
    *response->mutable_spec() = *spec;
  }
  return Reply(context, spec.status());
}

grpc::ServerUnaryReactor* CoordinatorService::CancelJob(grpc::CallbackServerContext* context,
                                                        const v1::CancelJobRequest* request,
                                                        v1::CancelJobResponse* /*response*/) {
  return Reply(context, core_->CancelJob(request->job_id(), request->reason()));
}

grpc::ServerWriteReactor<v1::JobStatus>* CoordinatorService::WatchStatus(
    grpc::CallbackServerContext* /*context*/, const v1::WatchStatusRequest* request) {
  double seconds = request->interval_seconds() == 0 ? 1.0 : request->interval_seconds();
  seconds = std::clamp(seconds, 0.05, 3600.0);
  return watchers_->Start(core_->Snapshot(), absl::Seconds(seconds), absl::Now());
}

}  // namespace ddp
