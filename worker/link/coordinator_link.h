// A worker's line to the coordinator, for the ddp-worker daemon and for a
// program on the ddp library alike: attach (waiting and reconnecting with
// backoff while the coordinator is not there), register, then send
// heartbeats and what the outbox holds while handing what the coordinator
// sends (assignments, aborts) to a Handler.
//
// Training does not depend on the line: a lost stream only queues reports
// (bounded) until the coordinator is back, and the worker registers again
// claiming its generation and rank. Only the coordinator ends a generation:
// an Abort, or closing the stream with ABORTED (marked lost or evicted).
//
// With several coordinators (Options::coordinator is a comma list), the
// link follows the leader (common/coordinator_targets.h): a standby's
// answer naming the leader sends it there at once, without a backoff (a few
// times in a row at most); a coordinator it can't reach sends it on to the
// next address of the list after the backoff, which doubles once per round
// through the list rather than per address.
//
// A register that is refused says why in the log: refusals that retrying
// can't cure (a wrong token or role, another version, a malformed request)
// end Run with 2 and last_error() says why; a duplicate device is retried,
// saying so; a coordinator that can't be reached, or doesn't answer the
// register within register_timeout, is retried with backoff, logging the
// gRPC error the first time and then once every complaint_interval.
#ifndef DDP_WORKER_LINK_COORDINATOR_LINK_H_
#define DDP_WORKER_LINK_COORDINATOR_LINK_H_

#include <atomic>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/coordinator_targets.h"
#include "common/credentials.h"
#include "common/log_limiter.h"
#include "common/store_client.h"
#include "ddp/v1/coordinator.grpc.pb.h"
#include "worker/link/outbox.h"
#include "worker/link/progress_board.h"

namespace ddp {

// A stub to the coordinator at `target` with `security`; without a token
// and with `find_local_token`, the worker token a local coordinator made.
std::shared_ptr<v1::Coordinator::StubInterface> NewCoordinatorStub(const std::string& target,
                                                                   ClientSecurity security,
                                                                   bool find_local_token);

// The bearer token calls to `target` carry: security's, or (none there,
// and `find_local_token`) the worker token a local coordinator at `target`
// made; "" when there is none.
std::string WorkerTokenFor(const std::string& target, const ClientSecurity& security,
                           bool find_local_token);

class CoordinatorLink {
 public:
  struct Options {
    // HOST:PORT, or a comma list of them (the leader is followed); checked
    // by the caller (ParseCoordinatorList).
    std::string coordinator = "127.0.0.1:29400";
    // TLS and the bearer token for every call to the coordinator.
    ClientSecurity security;
    // Without a token: look for the worker token a local coordinator made
    // (common/local_tokens.h) at every connection, since the coordinator
    // may start after this worker.
    bool find_local_token = false;
    absl::Duration min_backoff = absl::Milliseconds(100);
    absl::Duration max_backoff = absl::Seconds(5);
    // A register not answered within this (a silent TCP listener, an HTTP
    // server, a TLS/plaintext mismatch that hangs) is given up and retried.
    absl::Duration register_timeout = absl::Seconds(10);
    // Repeated connection errors and refusals are logged at most this often.
    absl::Duration complaint_interval = absl::Minutes(1);
  };

  // What the worker does with the line. Called on Run's thread; each call
  // must return soon (the stream is read meanwhile).
  class Handler {
   public:
    virtual ~Handler() = default;
    // The register to send now: host, device, name, threads, and what the
    // worker trains in or holds (the link adds machine id, pid, version).
    virtual v1::RegisterRequest MakeRegister() = 0;
    virtual void OnAssignment(const v1::Assignment& assignment,
                              std::shared_ptr<v1::Coordinator::StubInterface> stub) = 0;
    virtual void OnAbort(const v1::Abort& abort) = 0;
    // Build the job's training state ahead of an assignment (ddp-workers
    // only: the coordinator sends it to no program).
    virtual void OnPrepare(const v1::Prepare& /*prepare*/) {}
    // The coordinator closed the stream with ABORTED: it dropped this worker
    // from its generation, which goes on without it.
    virtual void OnDropped(const std::string& why) = 0;
    // A Stop from the coordinator (with its reason), or Shutdown: Run is
    // about to return 0.
    virtual void OnStopping(const std::string& reason) = 0;
    // The same with the whole Stop (for Shutdown, one with only a reason),
    // for a handler that needs how the job ended.
    virtual void OnStop(const v1::Stop& stop) { OnStopping(stop.reason()); }
  };

  // `clock` (heartbeats, backoff, the register's timeout), `handler`,
  // `outbox` and `board` outlive the link.
  CoordinatorLink(const Clock* clock, Options options, Handler* handler, Outbox* outbox,
                  const ProgressBoard* board);

  // Runs until Shutdown or a Stop (returns 0), or a registration the
  // coordinator refuses for good (returns 2).
  int Run();
  // Ends Run soon. Thread-safe.
  void Shutdown();
  // Whether a register was ever answered. Thread-safe.
  bool ever_attached() const { return ever_attached_; }
  // Why the last register failed ("" once one succeeded). Thread-safe.
  std::string last_error() const;
  // Makes stubs to any coordinator address with this link's TLS and token
  // (and its local token lookup, per address): for a StoreClient to follow
  // the leader. It holds copies of what it needs, so it may outlive the
  // link. Thread-safe.
  StoreClient::StubFactory stub_factory() const;
  // The coordinator address of the session now serving: what a handler's
  // call came from. Run's thread only (the handler's calls).
  const std::string& session_target() const { return session_target_; }

 private:
  enum class SessionEnd { kRetry, kStopped, kFatal };
  using Stream = grpc::ClientReaderWriterInterface<v1::WorkerMessage, v1::CoordinatorMessage>;
  // One connection to the current target: register, serve the stream
  // until it ends, say why; next_ says where the next one goes.
  SessionEnd RunSession();
  SessionEnd Attach(const std::string& target,
                    const std::shared_ptr<v1::Coordinator::StubInterface>& stub,
                    grpc::ClientContext& context);
  void OnAttached(const std::string& target, const v1::Registered& registered);
  // Hands what the coordinator sends to the handler until the stream ends
  // (kRetry) or a Stop (kStopped, `stop` set).
  SessionEnd Serve(Stream& stream, const std::shared_ptr<v1::Coordinator::StubInterface>& stub,
                   v1::Stop* stop);
  void OnStreamClosed(const std::string& target, const grpc::Status& status);
  // The register to `target` got no Registered: log why (rate-limited) and
  // decide; `next` is where the next try goes.
  SessionEnd OnRegisterFailed(const std::string& target, const grpc::Status& status, bool timed_out,
                              const CoordinatorTargets::Next& next);
  void SendLoop(Stream* stream, absl::Duration heartbeat_interval, std::atomic<bool>* done);
  v1::RegisterRequest MakeRegister();

  const Clock* const clock_;
  const Options options_;
  Handler* const handler_;
  Outbox* const outbox_;
  const ProgressBoard* const board_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> ever_attached_{false};
  CoordinatorTargets targets_{options_.coordinator};
  // Touched only by Run's thread.
  LogLimiter complaints_{options_.complaint_interval};
  absl::Time unreachable_since_ = absl::InfiniteFuture();
  CoordinatorTargets::Next next_;
  bool attached_ = false;  // in the session now ending
  std::string session_target_;

  mutable absl::Mutex mu_;
  grpc::ClientContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::string last_error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ddp

#endif  // DDP_WORKER_LINK_COORDINATOR_LINK_H_
