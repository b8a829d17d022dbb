// ddp.v1.Coordinator as a standby serves it: a coordinator waiting to take
// over holds no state of the term, so it answers every call UNAVAILABLE,
// naming the leader in the message and in the `ddp-leader` trailer (clients
// follow it: common/coordinator_targets.h). GetStatus and ListWorkers are
// forwarded to the leader with the caller's own authorization, so an
// operator can ask any coordinator.
//
// Thread-safe.
#ifndef DDP_COORDINATOR_STANDBY_SERVICE_H_
#define DDP_COORDINATOR_STANDBY_SERVICE_H_

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/credentials.h"
#include "coordinator/leadership.h"
#include "ddp/v1/coordinator.grpc.pb.h"

namespace ddp {

class StandbyService final : public v1::Coordinator::CallbackService {
 public:
  // `leadership` outlives the service; `to_leader` is how reads are
  // forwarded (its token is not used: the caller's is).
  StandbyService(const Leadership* leadership, ClientSecurity to_leader);

  grpc::ServerBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage>* Attach(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* StoreSet(grpc::CallbackServerContext* context,
                                     const v1::StoreSetRequest* request,
                                     v1::StoreSetResponse* response) override;
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
  // The queue lives in the leader's memory: asked there.
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const v1::ListJobsRequest* request,
                                     v1::ListJobsResponse* response) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context,
                                   const v1::GetJobRequest* request,
                                   v1::JobSummary* response) override;
  grpc::ServerWriteReactor<v1::JobStatus>* WatchStatus(
      grpc::CallbackServerContext* context, const v1::WatchStatusRequest* request) override;

 private:
  // Finishes `context`'s call UNAVAILABLE with the leader named.
  grpc::ServerUnaryReactor* RefuseUnary(grpc::CallbackServerContext* context) const;
  grpc::Status Refusal(grpc::CallbackServerContext* context) const;
  // A stub to the leader now, or null while none is known.
  std::shared_ptr<v1::Coordinator::Stub> LeaderStub();
  // Forwards a unary read to the leader (see the .cc).
  template <typename Call>
  grpc::ServerUnaryReactor* ForwardUnary(grpc::CallbackServerContext* context, Call call);

  const Leadership* const leadership_;
  const ClientSecurity to_leader_;
  absl::Mutex mu_;
  std::string stub_address_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<v1::Coordinator::Stub> stub_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_STANDBY_SERVICE_H_
