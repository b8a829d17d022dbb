// Serves Prometheus metrics over HTTP (prometheus-cpp's Exposer on civetweb)
// at /metrics. Metrics carry no TLS and no tokens, so the address must be
// loopback unless the operator says --insecure (the same rule the
// coordinator's gRPC API has without TLS and tokens).
//
// Thread-safe: collectables are called on civetweb's threads at each scrape,
// so their Collect() must not wait on anything slow.
#ifndef DDP_COMMON_METRICS_SERVER_H_
#define DDP_COMMON_METRICS_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace prometheus {
class Collectable;
class Exposer;
}  // namespace prometheus

namespace ddp {

// OK when `listen` (HOST:PORT, port 0 picks one) may be served: loopback, or
// any address with `insecure`. INVALID_ARGUMENT for a malformed address,
// FAILED_PRECONDITION (saying what to do) for a non-loopback one without
// `insecure`. `flag` names the flag in messages.
absl::Status CheckMetricsListen(const std::string& flag, const std::string& listen, bool insecure);

// A daemon's --metrics_listen: null when `listen` is empty (metrics off).
// When `required` is false (the flag's default), an address that can't be
// bound is logged and metrics are off, so a second daemon on one machine
// still runs; an address given explicitly that can't be bound is an error.
// Errors: CheckMetricsListen's, and UNAVAILABLE.
class MetricsServer;
absl::StatusOr<std::unique_ptr<MetricsServer>> StartMetricsServer(const std::string& listen,
                                                                  bool insecure, bool required);

class MetricsServer {
 public:
  // Listens on `listen` (checked with CheckMetricsListen first).
  // UNAVAILABLE when the address can't be bound.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& flag,
                                                              const std::string& listen,
                                                              bool insecure);
  ~MetricsServer();

  // Adds what each scrape of /metrics returns. The server keeps only a weak
  // reference: the owner keeps `collectable` alive while it should appear.
  void Register(const std::shared_ptr<prometheus::Collectable>& collectable);
  // The port bound (useful with port 0).
  int port() const { return port_; }

 private:
  MetricsServer(std::unique_ptr<prometheus::Exposer> exposer, int port);

  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_;
};

}  // namespace ddp

#endif  // DDP_COMMON_METRICS_SERVER_H_
