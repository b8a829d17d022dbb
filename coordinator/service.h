// The gRPC layer: translates ddp.v1.Coordinator calls to the Coordinator
// core and back, and nothing else. Uses gRPC's callback API, so thousands of
// worker streams need no thread each, and a waiting store get holds no
// thread at all. Every handler first asks the Authorizer whether the
// caller's token may call it; a refused call touches nothing (UNAUTHENTICATED
// or PERMISSION_DENIED). Store calls pass the caller's store token
// (ddp-store-token metadata) to the core, which checks it against the
// generation the request names.
#ifndef DDP_COORDINATOR_SERVICE_H_
#define DDP_COORDINATOR_SERVICE_H_

#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/log_limiter.h"
#include "coordinator/authorizer.h"
#include "coordinator/call_observer.h"
#include "coordinator/coordinator.h"
#include "coordinator/leadership.h"
#include "coordinator/status_watchers.h"
#include "ddp/v1/coordinator.grpc.pb.h"

namespace ddp {

// Every method as a callback, Attach with raw bytes (AttachStream parses
// them, to tell a message that does not parse from the end of the stream).
using CoordinatorServiceBase = v1::Coordinator::WithRawCallbackMethod_Attach<
    v1::Coordinator::WithCallbackMethod_StoreSet<v1::Coordinator::WithCallbackMethod_StoreGet<
        v1::Coordinator::WithCallbackMethod_StoreAdd<v1::Coordinator::WithCallbackMethod_GetStatus<
            v1::Coordinator::WithCallbackMethod_ListWorkers<
                v1::Coordinator::WithCallbackMethod_SubmitJob<
                    v1::Coordinator::WithCallbackMethod_CancelJob<
                        v1::Coordinator::WithCallbackMethod_WatchStatus<
                            v1::Coordinator::WithCallbackMethod_ListJobs<
                                v1::Coordinator::WithCallbackMethod_GetJob<
                                    v1::Coordinator::Service>>>>>>>>>>>;

class CoordinatorService final : public CoordinatorServiceBase {
 public:
  // `core`, `watchers`, `authorizer` and `attach_observer` must outlive the
  // service; a null `authorizer` lets every call through. `attach_observer`
  // (may be null) hears of every Attach stream (RpcMetrics, which observes
  // the other calls through an interceptor). `leadership` (may be null: a
  // coordinator on its own) refuses every call while this coordinator does
  // not lead, naming the leader.
  CoordinatorService(Coordinator* core, StatusWatchers* watchers,
                     const Authorizer* authorizer = nullptr,
                     CallObserver* attach_observer = nullptr,
                     const Leadership* leadership = nullptr);

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Attach(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* StoreSet(grpc::CallbackServerContext* context,
                                     const v1::StoreSetRequest* request,
                                     v1::StoreSetResponse* response) override;
  // A waiting get whose caller goes away (cancelled, or past the deadline it
  // gave) leaves the store at once, holding nothing.
  grpc::ServerUnaryReactor* StoreGet(grpc::CallbackServerContext* context,
                                     const v1::StoreGetRequest* request,
                                     v1::StoreGetResponse* response) override;
  grpc::ServerUnaryReactor* StoreAdd(grpc::CallbackServerContext* context,
                                     const v1::StoreAddRequest* request,
                                     v1::StoreAddResponse* response) override;
  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* context,
                                      const v1::GetStatusRequest* request,
                                      v1::JobStatus* response) override;
  grpc::ServerUnaryReactor* ListWorkers(grpc::CallbackServerContext* context,
                                        const v1::ListWorkersRequest* request,
                                        v1::ListWorkersResponse* response) override;
  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* context,
                                      const v1::SubmitJobRequest* request,
                                      v1::SubmitJobResponse* response) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* context,
                                      const v1::CancelJobRequest* request,
                                      v1::CancelJobResponse* response) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const v1::ListJobsRequest* request,
                                     v1::ListJobsResponse* response) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context,
                                   const v1::GetJobRequest* request,
                                   v1::JobSummary* response) override;
  grpc::ServerWriteReactor<v1::JobStatus>* WatchStatus(
      grpc::CallbackServerContext* context, const v1::WatchStatusRequest* request) override;

 private:
  // OK, or why the caller may not call `method` (logged, rate-limited), or
  // that this coordinator does not lead (UNAVAILABLE, the leader named in
  // the message and the trailer).
  absl::Status Allow(grpc::CallbackServerContext* context, const char* method);

  Coordinator* core_;
  StatusWatchers* watchers_;
  const Authorizer* authorizer_;
  CallObserver* attach_observer_;
  const Leadership* leadership_;
  absl::Mutex log_mu_;
  // Refusals are logged, but a client hammering with a bad token must not
  // flood the log.
  LogLimiter refusal_log_ ABSL_GUARDED_BY(log_mu_){absl::Minutes(1)};
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_SERVICE_H_
