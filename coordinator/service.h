// The gRPC layer: translates ddp.v1.Coordinator calls to the Coordinator
// core and back, and nothing else. Uses gRPC's callback API, so thousands of
// worker streams need no thread each, and a waiting store get holds no
// thread at all.
#ifndef DDP_COORDINATOR_SERVICE_H_
#define DDP_COORDINATOR_SERVICE_H_

#include <memory>

#include "coordinator/coordinator.h"
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
                            v1::Coordinator::Service>>>>>>>>>;

class CoordinatorService final : public CoordinatorServiceBase {
 public:
  // `core` and `watchers` must outlive the service.
  CoordinatorService(Coordinator* core, StatusWatchers* watchers)
      : core_(core), watchers_(watchers) {}

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
  grpc::ServerWriteReactor<v1::JobStatus>* WatchStatus(
      grpc::CallbackServerContext* context, const v1::WatchStatusRequest* request) override;

 private:
  Coordinator* core_;
  StatusWatchers* watchers_;
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_SERVICE_H_
