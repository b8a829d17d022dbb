// grpc.health.v1.Health, served from our own compiled health.proto so that
// reflection can describe it (see proto/grpc/health/v1/health.proto).
#ifndef DDP_COORDINATOR_HEALTH_SERVICE_H_
#define DDP_COORDINATOR_HEALTH_SERVICE_H_

#include <atomic>

#include "grpc/health/v1/health.grpc.pb.h"

namespace ddp {

class HealthService final : public grpc::health::v1::Health::CallbackService {
 public:
  // Known services: "" (the server) and "ddp.v1.Coordinator".
  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* context,
                                  const grpc::health::v1::HealthCheckRequest* request,
                                  grpc::health::v1::HealthCheckResponse* response) override;
  // Sends the status now and keeps the stream open until the client leaves.
  grpc::ServerWriteReactor<grpc::health::v1::HealthCheckResponse>* Watch(
      grpc::CallbackServerContext* context,
      const grpc::health::v1::HealthCheckRequest* request) override;

  // Thread-safe. Checks answer NOT_SERVING once the server is shutting down.
  void SetServing(bool serving) { serving_ = serving; }
  // A standby (coordinator/failover.h) is up ("" is SERVING, so a liveness
  // probe keeps it) but does not serve ddp.v1.Coordinator (NOT_SERVING, so a
  // readiness probe or load balancer sends clients to the leader).
  void SetStandby(bool standby) { standby_ = standby; }

 private:
  grpc::health::v1::HealthCheckResponse::ServingStatus StatusOf(const std::string& service) const;
  std::atomic<bool> serving_{true};
  std::atomic<bool> standby_{false};
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_HEALTH_SERVICE_H_
