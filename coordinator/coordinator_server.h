// ddp-coordinator's composition root: builds the core and every part around
// it (job checks, durable state, the gRPC server and its services, metrics,
// the status page, the ticker), serves, and takes them down in order. Like
// Ray's GcsServer, one Init... per part; main.cc only turns flags into
// Options.
//
// Threads: Start, Wait and Stop are called from one thread (main's), in that
// order. The ticker is a thread of its own; gRPC and the HTTP servers have
// theirs.
#ifndef DDP_COORDINATOR_COORDINATOR_SERVER_H_
#define DDP_COORDINATOR_COORDINATOR_SERVER_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/http_server.h"
#include "common/metrics_server.h"
#include "common/tokens.h"
#include "coordinator/authorizer.h"
#include "coordinator/coordinator.h"
#include "coordinator/coordinator_metrics.h"
#include "coordinator/health_service.h"
#include "coordinator/helper_process.h"
#include "coordinator/job_validator.h"
#include "coordinator/leadership.h"
#include "coordinator/path_policy.h"
#include "coordinator/rpc_metrics.h"
#include "coordinator/service.h"
#include "coordinator/shared_listener.h"
#include "coordinator/state_store.h"
#include "coordinator/status_history.h"
#include "coordinator/status_page.h"
#include "coordinator/status_watchers.h"
#include "grpcpp/grpcpp.h"
#include "prometheus/registry.h"

namespace ddp {

// What the server's transport and callers must prove.
struct CoordinatorSecurity {
  std::shared_ptr<grpc::ServerCredentials> credentials;
  std::unique_ptr<Authorizer> authorizer;  // null: every call allowed
  // Made at start (no --tokens_file, on loopback): written to their local
  // files once the port is known (common/local_tokens.h).
  std::vector<TokenEntry> local_tokens;
  // The metrics and the status page: the same certificate, CA and tokens.
  HttpAccess http;
  // "plaintext", "TLS" or "mutual TLS", for the log.
  std::string transport;
  // The tokens file's max_workers per owner.
  OwnerQuotas owner_quotas;
  std::map<std::string, OwnerLimits> owner_limits;
};

class CoordinatorServer {
 public:
  // Everything from the flags, checked already (main.cc).
  struct Options {
    std::string listen;     // --listen
    std::string job_file;   // --job; empty: none
    std::string state_dir;  // --state_dir; empty: memory only
    // Where the state is kept when not in --state_dir (etcd); with it, the
    // leadership that lets this coordinator act (null: it always may).
    std::unique_ptr<StateStore> state_store;
    const Leadership* leadership = nullptr;
    // More series for the metrics endpoint (etcd's request latencies).
    std::shared_ptr<prometheus::Registry> extra_metrics;
    // When set (a coordinator that fails over), the gRPC server takes its
    // connections from this socket instead of binding --listen itself.
    SharedListener* listener = nullptr;
    std::string port_file;        // --port_file
    std::string status_file;      // --status_file
    bool exit_when_done = false;  // --exit_when_done
    size_t max_watch_streams = StatusWatchers::kDefaultMaxWatches;
    std::string metrics_listen;     // empty: off
    bool metrics_required = false;  // an explicit address: failing to bind is an error
    std::string http_listen;        // the status page; empty: off
    std::string http_port_file;     // --http_port_file
    bool http_required = false;
    Coordinator::Options core;  // validate_job and state_store are set here
    PathRoots roots;
    JobValidator::Options validation;
    absl::Duration validate_timeout = absl::Seconds(60);
    std::string data_root, output_root;  // as given, for the log
    std::unique_ptr<HelperProcess> helper;
    CoordinatorSecurity security;
  };

  explicit CoordinatorServer(Options options);
  CoordinatorServer(const CoordinatorServer&) = delete;
  CoordinatorServer& operator=(const CoordinatorServer&) = delete;
  ~CoordinatorServer();  // Stop()

  // Builds every part and serves. On an error (to be logged) ddp-coordinator
  // exits with failure_exit_code().
  absl::Status Start();
  int failure_exit_code() const { return failure_exit_code_; }
  // Until SIGINT or SIGTERM, or (exit_when_done) the job ended and its
  // workers hung up, or this coordinator no longer leads. Returns the exit
  // code: 0, the ended job's, or kLostLeadership.
  int Wait();
  static constexpr int kLostLeadership = 75;  // EX_TEMPFAIL
  // Stops checks, saves the state, ends every stream and the servers.
  // Idempotent.
  void Stop();

  // The gRPC port, once started.
  int port() const { return port_; }

 private:
  absl::Status InitValidation();
  absl::Status InitCore();
  absl::Status SubmitStartJob();
  absl::Status InitGrpcServer();
  absl::Status InitMetrics();
  absl::Status InitStatusPage();
  absl::Status ServeMetrics();
  absl::Status ServeStatusPage();
  // Whether a page or metrics port that `failed` to bind is waited for
  // (tried again each second from the ticker, RetryPorts): a leader's, whose
  // deposed predecessor on this machine may still hold it.
  bool WaitForPort(const absl::Status& failed) const;
  void RetryPorts();
  absl::Status AnnounceServing();
  void StartTicker();
  void TickLoop();
  // Whether exit_when_done's job has ended and its workers went (or had
  // their moment to), setting exit_code.
  bool JobOver(absl::Time& ended_at, int& exit_code);
  void WriteStatusFile();

  Options options_;
  int failure_exit_code_ = 2;
  int port_ = 0;
  // Local token files written for a port the system picked: removed at a
  // clean stop (nothing restarts on that port to need them).
  bool remove_local_tokens_ = false;
  bool stopped_ = false;
  // Declared in the order they are built: each is destroyed before what it
  // uses.
  std::unique_ptr<JobValidator> validator_;
  std::unique_ptr<StateStore> state_store_;  // from state_dir or Options
  std::unique_ptr<Coordinator> core_;
  std::unique_ptr<StatusWatchers> watchers_;
  HealthService health_;
  std::shared_ptr<prometheus::Registry> rpc_registry_;
  std::unique_ptr<RpcMetrics> rpc_metrics_;
  std::shared_ptr<CoordinatorMetrics> core_metrics_;
  std::unique_ptr<CoordinatorService> service_;
  std::unique_ptr<grpc::Server> grpc_server_;
  // Where options_.listener hands connections to grpc_server_.
  std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor_;
  std::unique_ptr<MetricsServer> metrics_server_;
  std::unique_ptr<StatusHistory> history_;
  std::unique_ptr<StatusPageHandler> page_handler_;
  std::unique_ptr<HttpServer> page_;
  // Ports waited for (WaitForPort); the ticker's alone once it runs.
  bool metrics_retry_ = false;
  bool page_retry_ = false;
  std::atomic<bool> stopping_{false};
  std::thread ticker_;
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_COORDINATOR_SERVER_H_
