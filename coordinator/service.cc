#include "coordinator/service.h"

#include <algorithm>

#include "common/grpc_status.h"
#include "coordinator/attach_stream.h"

namespace ddp {
namespace {

grpc::ServerUnaryReactor* Reply(grpc::CallbackServerContext* context, const absl::Status& s) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(s));
  return reactor;
}

}  // namespace

grpc::ServerBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage>* CoordinatorService::Attach(
    grpc::CallbackServerContext* /*context*/) {
  return AttachStream::Start(core_);
}

grpc::ServerUnaryReactor* CoordinatorService::StoreSet(grpc::CallbackServerContext* context,
                                                       const v1::StoreSetRequest* request,
                                                       v1::StoreSetResponse* /*response*/) {
  return Reply(context, core_->StoreSet(*request));
}

grpc::ServerUnaryReactor* CoordinatorService::StoreGet(grpc::CallbackServerContext* context,
                                                       const v1::StoreGetRequest* request,
                                                       v1::StoreGetResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // The reply comes when the key is set or the deadline passes; the RPC's
  // objects stay alive until Finish.
  core_->StoreGet(*request, [reactor, response](absl::StatusOr<std::string> value) {
    if (value.ok()) response->set_value(std::move(*value));
    reactor->Finish(ToGrpcStatus(value.status()));
  });
  return reactor;
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
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // The reply comes when the job's check is done (a helper process may take
  // a while); no thread waits for it here.
  core_->SubmitJob(request->spec(), [reactor, response](absl::StatusOr<v1::JobSpec> spec) {
    if (spec.ok()) {
      response->set_job_id(spec->name());
      *response->mutable_spec() = *spec;
    }
    reactor->Finish(ToGrpcStatus(spec.status()));
  });
  return reactor;
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
