// Serves Prometheus metrics (the text exposition format) at /metrics on an
// HttpServer: loopback by default; elsewhere with TLS and tokens, or
// --insecure (HttpServer's rules, the gRPC API's).
//
// Thread-safe: collectables are called on the server's threads at each
// scrape, so their Collect() must not wait on anything slow.
#ifndef DDP_COMMON_METRICS_SERVER_H_
#define DDP_COMMON_METRICS_SERVER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/http_server.h"

namespace prometheus {
class Collectable;
}  // namespace prometheus

namespace ddp {

class MetricsServer {
 public:
  // Listens on `listen` with `access` (HttpServer::Start's errors).
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& listen,
                                                              const HttpAccess& access);
  ~MetricsServer();

  // Adds what each scrape of /metrics returns. The server keeps only a weak
  // reference: the owner keeps `collectable` alive while it should appear.
  void Register(const std::shared_ptr<prometheus::Collectable>& collectable);
  // The port bound (useful with port 0), and "http(s)://HOST:PORT".
  int port() const { return http_->port(); }
  std::string url() const { return http_->url(); }

 private:
  MetricsServer() = default;
  HttpResponse Scrape(absl::string_view method, absl::string_view path) const;

  mutable absl::Mutex mu_;
  std::vector<std::weak_ptr<prometheus::Collectable>> collectables_ ABSL_GUARDED_BY(mu_);
  // Last: stops serving (and calling Scrape) before the rest goes.
  std::unique_ptr<HttpServer> http_;
};

// A daemon's --metrics_listen: null when `listen` is empty (metrics off).
// When `required` is false (the flag's default), an address that can't be
// bound is logged and metrics are off, so a second daemon on one machine
// still runs; an address given explicitly that can't be bound is an error.
absl::StatusOr<std::unique_ptr<MetricsServer>> StartMetricsServer(const std::string& listen,
                                                                  const HttpAccess& access,
                                                                  bool required);

}  // namespace ddp

#endif  // DDP_COMMON_METRICS_SERVER_H_
