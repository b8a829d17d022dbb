#include "common/metrics_server.h"

#include <exception>
#include <utility>
#include <vector>

#include "CivetServer.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/net_address.h"
#include "prometheus/exposer.h"

namespace ddp {
namespace {

// civetweb says why it could not start only through its log callback;
// Start runs on one thread at a time per process in practice, and the
// message is read on the thread that wrote it.
thread_local std::string civetweb_error;

int KeepCivetwebMessage(const mg_connection* /*connection*/, const char* message) {
  civetweb_error = message;
  return 1;  // handled: civetweb writes nothing to stderr itself
}

}  // namespace

absl::Status CheckMetricsListen(const std::string& flag, const std::string& listen, bool insecure) {
  if (auto parsed = ParseHostPort(listen, /*allow_port_zero=*/true); !parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", parsed.status().message()));
  }
  if (IsLocalAddress(listen) || insecure) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "refusing to serve metrics on ", listen, " (", flag,
      "): the metrics endpoint has no TLS or tokens, so anyone who reaches it could read the "
      "job's progress. Serve it on loopback (e.g. 127.0.0.1:9400) and let a local Prometheus or "
      "a TLS proxy reach it, pass --insecure on a network you trust, or set ",
      flag, "= (empty) to turn metrics off (see README, \"Metrics\")"));
}

MetricsServer::MetricsServer(std::unique_ptr<prometheus::Exposer> exposer, int port)
    : exposer_(std::move(exposer)), port_(port) {}

MetricsServer::~MetricsServer() = default;

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& flag,
                                                                    const std::string& listen,
                                                                    bool insecure) {
  if (absl::Status s = CheckMetricsListen(flag, listen, insecure); !s.ok()) return s;
  std::unique_ptr<prometheus::Exposer> exposer;
  CivetCallbacks callbacks;
  callbacks.log_message = KeepCivetwebMessage;
  civetweb_error.clear();
  try {
    // Two threads: scrapes are rare and cheap.
    exposer = std::make_unique<prometheus::Exposer>(
        std::vector<std::string>{"listening_ports", listen, "num_threads", "2"}, &callbacks);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("can't serve metrics on ", listen, " (", flag,
                     "): address in use, or not an address of this host? (",
                     civetweb_error.empty() ? e.what() : civetweb_error, ")"));
  }
  const std::vector<int> ports = exposer->GetListeningPorts();
  const int port = ports.empty() ? 0 : ports.front();
  return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(exposer), port));
}

void MetricsServer::Register(const std::shared_ptr<prometheus::Collectable>& collectable) {
  exposer_->RegisterCollectable(collectable);
}

absl::StatusOr<std::unique_ptr<MetricsServer>> StartMetricsServer(const std::string& listen,
                                                                  bool insecure, bool required) {
  if (listen.empty()) return std::unique_ptr<MetricsServer>();
  auto server = MetricsServer::Start("--metrics_listen", listen, insecure);
  if (server.ok()) {
    DDP_LOG(Info) << "serving Prometheus metrics at http://" << listen.substr(0, listen.rfind(':'))
                  << ":" << (*server)->port() << "/metrics";
    return server;
  }
  if (required || !absl::IsUnavailable(server.status())) return server.status();
  DDP_LOG(Warning) << server.status().message()
                   << "; running without metrics (set --metrics_listen to choose another)";
  return std::unique_ptr<MetricsServer>();
}

}  // namespace ddp
