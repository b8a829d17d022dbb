#include "coordinator/health_service.h"

namespace ddp {
namespace {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

// Writes one response, then waits for the client to leave.
class HealthWatch final : public grpc::ServerWriteReactor<HealthCheckResponse> {
 public:
  explicit HealthWatch(HealthCheckResponse::ServingStatus status) {
    response_.set_status(status);
    StartWrite(&response_);
  }
  void OnWriteDone(bool ok) override {
    if (!ok) Finish(grpc::Status::OK);
  }
  void OnCancel() override { Finish(grpc::Status::OK); }
  void OnDone() override { delete this; }

 private:
  HealthCheckResponse response_;
};

}  // namespace

HealthCheckResponse::ServingStatus HealthService::StatusOf(const std::string& service) const {
  if (!service.empty() && service != "ddp.v1.Coordinator") {
    return HealthCheckResponse::SERVICE_UNKNOWN;
  }
  if (!serving_ || (standby_ && !service.empty())) return HealthCheckResponse::NOT_SERVING;
  return HealthCheckResponse::SERVING;
}

grpc::ServerUnaryReactor* HealthService::Check(grpc::CallbackServerContext* context,
                                               const HealthCheckRequest* request,
                                               HealthCheckResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const auto status = StatusOf(request->service());
  if (status == HealthCheckResponse::SERVICE_UNKNOWN) {
    reactor->Finish(grpc::Status(
        grpc::StatusCode::NOT_FOUND,
        "unknown service \"" + request->service() + "\"; known: \"\" and \"ddp.v1.Coordinator\""));
    return reactor;
  }
  response->set_status(status);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerWriteReactor<HealthCheckResponse>* HealthService::Watch(
    grpc::CallbackServerContext* /*context*/, const HealthCheckRequest* request) {
  return new HealthWatch(StatusOf(request->service()));
}

}  // namespace ddp
