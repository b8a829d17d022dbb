// Runs the slow checks of submitted jobs (a helper process per job) on
// threads of its own, never on the caller's: at most `concurrency` at once,
// at most `max_waiting` waiting behind them; a job beyond that is refused at
// once with RESOURCE_EXHAUSTED, so no client can make the coordinator hold
// an unbounded queue.
//
// Knows nothing of what a check does (see job_checks.h) nor of gRPC.
#ifndef DDP_COORDINATOR_JOB_VALIDATOR_H_
#define DDP_COORDINATOR_JOB_VALIDATOR_H_

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "ddp/v1/job.pb.h"

namespace ddp {

class JobValidator {
 public:
  // Checks one job, blocking its validator thread, and may add to its spec
  // what the check found (the input files' pins). `stop` becomes true when
  // the validator shuts down: the check should then end soon (CANCELLED).
  using Check = std::function<absl::Status(v1::JobSpec&, const std::atomic<bool>& stop)>;
  using Done = std::function<void(absl::Status)>;

  struct Options {
    int concurrency = 2;
    int max_waiting = 4;
  };

  JobValidator(Options options, Check check);
  JobValidator(const JobValidator&) = delete;
  JobValidator& operator=(const JobValidator&) = delete;
  ~JobValidator();  // Shutdown()

  // Never blocks. `done` runs exactly once, with the check's status: on a
  // validator thread, or on the caller's when the job is refused
  // (RESOURCE_EXHAUSTED: too many waiting; UNAVAILABLE: shutting down).
  // Thread-safe.
  void Validate(v1::JobSpec spec, Done done);
  // The same, the check's additions made to `*spec` before `done` runs.
  void Validate(std::shared_ptr<v1::JobSpec> spec, Done done);

  // Refuses new jobs, fails the waiting ones with UNAVAILABLE, stops the
  // running checks and waits for their threads. Call before what the `done`
  // callbacks use goes away. Thread-safe; idempotent; never call it from a
  // `done` callback.
  void Shutdown();

 private:
  struct Pending {
    std::shared_ptr<v1::JobSpec> spec;
    Done done;
  };

  void Loop();
  // How many jobs may be queued now: one per idle thread, plus max_waiting.
  size_t Capacity() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  const Check check_;
  std::atomic<bool> stop_{false};
  absl::Mutex mu_;
  std::deque<Pending> waiting_ ABSL_GUARDED_BY(mu_);
  // Checks running now (taken off waiting_, not yet done).
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  // Started once, in the constructor; joined by Shutdown.
  std::vector<std::thread> threads_;
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_JOB_VALIDATOR_H_
