// The worker daemon's life: attach to the coordinator (waiting and
// reconnecting with backoff while it is not there), register, send
// heartbeats and queued reports, and run each assignment it is given, one
// generation at a time, keeping the job's training state between them.
//
// Training does not depend on the coordinator being up: a lost stream does
// not end the generation in flight (reports queue, bounded, until the
// coordinator is back, and the worker re-registers saying which generation
// and rank it trains in). Only the coordinator ends a generation: an Abort,
// or closing the stream with ABORTED (this worker was marked lost or
// evicted).
//
// A register that is refused says why in the log: refusals that retrying
// can't cure (a wrong token or role, another version, a malformed request)
// end Run with 2; a duplicate device is retried, saying so; a coordinator
// that can't be reached, or doesn't answer the register within
// register_timeout, is retried with backoff, logging the gRPC error the
// first time and then once every complaint_interval.
#ifndef DDP_WORKER_AGENT_H_
#define DDP_WORKER_AGENT_H_

#include <atomic>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/credentials.h"
#include "common/device.h"
#include "common/log_limiter.h"
#include "ddp/v1/coordinator.grpc.pb.h"
#include "worker/generation_run.h"
#include "worker/outbox.h"

namespace ddp {

class WorkerMetrics;

class WorkerAgent {
 public:
  struct Options {
    std::string coordinator = "127.0.0.1:29400";
    // Where peers reach this worker, and the name it registers under.
    std::string host;
    Device device;
    std::string name;
    // Intra-op and BLAS threads (0: every core).
    int threads = 0;
    // When set, one JSON line per training step is appended here.
    std::string metrics_file;
    // When set, steps and the report queue feed these Prometheus series;
    // must outlive the agent.
    WorkerMetrics* metrics = nullptr;
    // When set, each step's dataset indices are logged here (a debug aid:
    // tests prove from it that every sample is trained once).
    std::string index_log;
    // Test-only fault injection (see GenerationRun::Environment).
    std::string debug_hang_file;
    // Step reports to the coordinator (off only to measure what they cost).
    bool send_reports = true;
    absl::Duration min_backoff = absl::Milliseconds(100);
    absl::Duration max_backoff = absl::Seconds(5);
    // TLS and the bearer token for every call to the coordinator.
    ClientSecurity security;
    // A register not answered within this (a silent TCP listener, an HTTP
    // server, a TLS/plaintext mismatch that hangs) is given up and retried.
    absl::Duration register_timeout = absl::Seconds(10);
    // Repeated connection errors and refusals are logged at most this often.
    absl::Duration complaint_interval = absl::Minutes(1);
  };

  explicit WorkerAgent(Options options);
  ~WorkerAgent();

  // Runs until Shutdown or a Stop from the coordinator (returns 0), or a
  // registration the coordinator refuses for good (returns 2).
  int Run();
  // Ends Run soon. Thread-safe.
  void Shutdown();

 private:
  enum class SessionEnd { kRetry, kStopped, kFatal };
  SessionEnd RunSession();
  // The register got no Registered: log why (rate-limited) and decide.
  SessionEnd OnRegisterFailed(const grpc::Status& status, bool timed_out);
  void SendLoop(
      grpc::ClientReaderWriterInterface<v1::WorkerMessage, v1::CoordinatorMessage>* stream,
      absl::Duration heartbeat_interval, std::atomic<bool>* done);
  void StartGeneration(const v1::Assignment& assignment,
                       std::shared_ptr<v1::Coordinator::StubInterface> stub);
  void OnAbort(const v1::Abort& abort);
  void AbortGeneration(uint64_t generation, const std::string& reason);
  v1::RegisterRequest MakeRegister();

  const Options options_;
  Outbox outbox_;
  ProgressBoard board_;
  std::atomic<bool> stopping_{false};
  // Touched only by Run's thread.
  LogLimiter complaints_{options_.complaint_interval};
  absl::Time unreachable_since_ = absl::InfiniteFuture();
  // Declared after the outbox: a checkpoint writer inside the state may
  // still report to the outbox while it finishes.
  StateSlot slot_;

  absl::Mutex mu_;
  grpc::ClientContext* session_context_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::unique_ptr<GenerationRun> run_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ddp

#endif  // DDP_WORKER_AGENT_H_
