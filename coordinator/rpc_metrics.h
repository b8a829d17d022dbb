// Counts every RPC the coordinator serves, by method and status code, and
// times it, through a gRPC server interceptor (so no handler changes), or,
// for a stream that reports itself, as its CallObserver:
//
//   ddp_coordinator_rpcs_started_total{method}
//   ddp_coordinator_rpcs_handled_total{method,code}
//   ddp_coordinator_rpc_duration_seconds{method}   (histogram; a stream's whole life)
//
// Methods are the services' own (a bounded set; past kMaxMethods distinct
// names, "other"), codes gRPC's 17. Thread-safe.
#ifndef DDP_COORDINATOR_RPC_METRICS_H_
#define DDP_COORDINATOR_RPC_METRICS_H_

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "coordinator/call_observer.h"

namespace grpc::experimental {
class ServerInterceptorFactoryInterface;
}  // namespace grpc::experimental

namespace prometheus {
class Counter;
class Histogram;
class Registry;
template <typename T>
class Family;
}  // namespace prometheus

namespace ddp {

class RpcMetrics final : public CallObserver {
 public:
  static constexpr size_t kMaxMethods = 64;

  // Adds its families to `registry`; both must outlive every call served.
  RpcMetrics(prometheus::Registry* registry, const Clock* clock);
  RpcMetrics(const RpcMetrics&) = delete;
  RpcMetrics& operator=(const RpcMetrics&) = delete;

  // For ServerBuilder::experimental().SetInterceptorCreators; it refers to
  // this object. Methods in `self_reported` get no interceptor: their
  // handlers tell this object themselves.
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> InterceptorFactory(
      std::vector<std::string> self_reported = {});

  // What a call records. `method` as gRPC names it
  // ("/ddp.v1.Coordinator/GetStatus"); `code` a grpc::StatusCode.
  void Started(absl::string_view method) override;
  void Handled(absl::string_view method, int code, absl::Duration took) override;

  const Clock* clock() const override { return clock_; }
  // The label a method gets ("ddp.v1.Coordinator/GetStatus", or "other").
  std::string MethodLabel(absl::string_view method);

 private:
  const Clock* clock_;
  prometheus::Family<prometheus::Counter>* started_;
  prometheus::Family<prometheus::Counter>* handled_;
  prometheus::Family<prometheus::Histogram>* duration_;
  absl::Mutex mu_;
  // Cached children, so a call does one map lookup, not a label hash in
  // the family.
  std::map<std::string, std::string, std::less<>> labels_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, prometheus::Counter*> started_by_method_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<std::string, int>, prometheus::Counter*> handled_by_code_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, prometheus::Histogram*> duration_by_method_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_RPC_METRICS_H_
