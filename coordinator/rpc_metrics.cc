#include "coordinator/rpc_metrics.h"

#include "absl/strings/ascii.h"
#include "absl/strings/strip.h"
#include "grpcpp/support/server_interceptor.h"
#include "grpcpp/support/status.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace ddp {
namespace {

using grpc::experimental::InterceptionHookPoints;

// gRPC's code names, as grpc-go's and the OpenTelemetry conventions write
// them ("OK", "DEADLINE_EXCEEDED").
std::string CodeLabel(int code) {
  static const char* const kNames[] = {"OK",
                                       "CANCELLED",
                                       "UNKNOWN",
                                       "INVALID_ARGUMENT",
                                       "DEADLINE_EXCEEDED",
                                       "NOT_FOUND",
                                       "ALREADY_EXISTS",
                                       "PERMISSION_DENIED",
                                       "RESOURCE_EXHAUSTED",
                                       "FAILED_PRECONDITION",
                                       "ABORTED",
                                       "OUT_OF_RANGE",
                                       "UNIMPLEMENTED",
                                       "INTERNAL",
                                       "UNAVAILABLE",
                                       "DATA_LOSS",
                                       "UNAUTHENTICATED"};
  if (code < 0 || code >= static_cast<int>(sizeof(kNames) / sizeof(kNames[0]))) return "UNKNOWN";
  return kNames[code];
}

// One call: started when gRPC creates it, handled when its status is sent
// (or, for a call that never sends one, when it is destroyed: CANCELLED).
// gRPC calls a call's interceptor from one batch at a time.
class MetricsInterceptor final : public grpc::experimental::Interceptor {
 public:
  MetricsInterceptor(RpcMetrics* metrics, std::string method) : call_(metrics, std::move(method)) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      call_.Handled(methods->GetSendStatus().error_code());
    }
    methods->Proceed();
  }

 private:
  ObservedCall call_;
};

class Factory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  Factory(RpcMetrics* metrics, std::vector<std::string> self_reported)
      : metrics_(metrics), self_reported_(std::move(self_reported)) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    const std::string method = info->method() ? info->method() : "";
    for (const std::string& m : self_reported_) {
      if (m == method) return nullptr;  // no interceptor: no interception path at all
    }
    return new MetricsInterceptor(metrics_, method);
  }

 private:
  RpcMetrics* const metrics_;
  const std::vector<std::string> self_reported_;
};

}  // namespace

RpcMetrics::RpcMetrics(prometheus::Registry* registry, const Clock* clock)
    : clock_(clock),
      started_(&prometheus::BuildCounter()
                    .Name("ddp_coordinator_rpcs_started_total")
                    .Help("RPCs the coordinator started serving, by method")
                    .Register(*registry)),
      handled_(&prometheus::BuildCounter()
                    .Name("ddp_coordinator_rpcs_handled_total")
                    .Help("RPCs the coordinator finished, by method and gRPC status code")
                    .Register(*registry)),
      duration_(&prometheus::BuildHistogram()
                     .Name("ddp_coordinator_rpc_duration_seconds")
                     .Help("time from an RPC's start to its status, by method (for a stream, "
                           "its whole life)")
                     .Register(*registry)) {}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
RpcMetrics::InterceptorFactory(std::vector<std::string> self_reported) {
  return std::make_unique<Factory>(this, std::move(self_reported));
}

std::string RpcMetrics::MethodLabel(absl::string_view method) {
  absl::ConsumePrefix(&method, "/");
  absl::MutexLock lock(&mu_);
  if (auto it = labels_.find(method); it != labels_.end()) return it->second;
  if (labels_.size() >= kMaxMethods) return "other";
  return labels_.emplace(std::string(method), std::string(method)).first->second;
}

void RpcMetrics::Started(absl::string_view method) {
  const std::string label = MethodLabel(method);
  prometheus::Counter* counter;
  {
    absl::MutexLock lock(&mu_);
    auto [it, added] = started_by_method_.emplace(label, nullptr);
    if (added) it->second = &started_->Add({{"method", label}});
    counter = it->second;
  }
  counter->Increment();
}

void RpcMetrics::Handled(absl::string_view method, int code, absl::Duration took) {
  // From 0.5 ms (a status read) to 10 minutes (a worker's stream).
  static const prometheus::Histogram::BucketBoundaries kBuckets = {
      0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
      0.5,    1,     2.5,    5,     10,   30,    60,   300, 600};
  const std::string label = MethodLabel(method);
  prometheus::Counter* counter;
  prometheus::Histogram* histogram;
  {
    absl::MutexLock lock(&mu_);
    auto [c, added_counter] = handled_by_code_.emplace(std::make_pair(label, code), nullptr);
    if (added_counter) c->second = &handled_->Add({{"method", label}, {"code", CodeLabel(code)}});
    counter = c->second;
    auto [h, added_histogram] = duration_by_method_.emplace(label, nullptr);
    if (added_histogram) h->second = &duration_->Add({{"method", label}}, kBuckets);
    histogram = h->second;
  }
  counter->Increment();
  histogram->Observe(absl::ToDoubleSeconds(took));
}

}  // namespace ddp
