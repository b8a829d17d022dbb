// Runs each job a daemon is given in a process of its own (JobProcess),
// kept across the job's generations, so that job code (a model's native
// ops included) never runs where the daemon's coordinator link, heartbeats
// and credentials live. The daemon passes on what the coordinator says,
// and what the process says (its state changes, step reports, epoch and
// checkpoint results) goes up the daemon's outbox.
//
// A process that dies (a segfault in native code, killed) is that rank
// lost, not the worker: the daemon says so with the signal (the generation
// FAILED, then IDLE holding nothing), the survivors re-form, and the
// coordinator's next Prepare starts a new process that joins at a step
// boundary.
#ifndef DDP_WORKER_PROCESS_ISOLATED_JOBS_H_
#define DDP_WORKER_PROCESS_ISOLATED_JOBS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "ddp/v1/job_process.pb.h"
#include "worker/link/outbox.h"
#include "worker/process/job_process.h"
#include "worker/process/job_runner.h"
#include "worker/process/shared_board.h"

namespace ddp {

class WorkerMetrics;

class IsolatedJobs final : public JobRunner {
 public:
  struct Options {
    // The daemon's own binary, run with kJobProcessFlag.
    std::string binary;
    // The daemon's settings for every job's process (job, spec and tokens
    // are filled per process).
    v1::JobProcessStart settings;
    // Each coordinator address's bearer token, looked up as a process
    // starts (the process can't read token files).
    std::function<std::map<std::string, std::string>()> tokens;
    // Step reports up to the coordinator (off only to measure their cost).
    bool send_reports = true;
    // When set, every committed step feeds its Prometheus series.
    WorkerMetrics* metrics = nullptr;
  };

  // `outbox` and `board` outlive it. Launches a process for the first job.
  IsolatedJobs(Options options, Outbox* outbox, SharedBoard* board);
  // Ends the job's process (it leaves its generation first).
  ~IsolatedJobs() override;

  void Assign(const v1::Assignment& assignment, const std::string& target,
              std::shared_ptr<v1::Coordinator::StubInterface> stub) override;
  void Abort(const v1::Abort& abort) override;
  void AbortAny(const std::string& reason) override;
  void Prepare(const v1::Prepare& prepare) override;
  void Stop() override;
  void Claim(v1::RegisterRequest* request) override;

 private:
  // A process launched (loading, then waiting for its job), or an error.
  // On the thread that made the agent or the link's (PR_SET_PDEATHSIG
  // follows the launching thread).
  absl::StatusOr<std::shared_ptr<JobProcess>> LaunchLocked(uint64_t* serial)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Keeps a launched process ready for the next job (logged if it can't).
  void LaunchSpareLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A live process for (job, spec): the one running, or a new one after
  // ending it. Called on the link's thread.
  absl::Status EnsureProcess(const std::string& job_id, const v1::JobSpec& spec);
  // Ends the current process, if any, waiting for its last messages (and
  // the spare, with `spare_too`).
  void EndProcess(bool spare_too = false);
  void Send(const v1::ToJobProcess& message);
  void OnMessage(uint64_t serial, v1::FromJobProcess message);
  void OnDeath(uint64_t serial, const std::string& how);
  // Says that generation `generation` (0: none) failed with `detail` (a
  // fault, UNAVAILABLE: the job goes on without this rank), and that the
  // worker is free, holding nothing.
  void PushFailure(uint64_t generation, const std::string& detail);

  const Options options_;
  Outbox* const outbox_;
  SharedBoard* const board_;

  mutable absl::Mutex mu_;
  // Never ended under mu_: a process's reader thread takes mu_ (OnMessage,
  // OnDeath), and ending a process joins its reader.
  std::shared_ptr<JobProcess> process_ ABSL_GUARDED_BY(mu_);
  // A process launched ahead, waiting for the next job, and its serial.
  std::shared_ptr<JobProcess> spare_ ABSL_GUARDED_BY(mu_);
  uint64_t spare_serial_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t launched_ ABSL_GUARDED_BY(mu_) = 0;
  // Which process is current (its launch serial; 0: none): the messages of
  // an ended one still go up, its claim and death don't count.
  uint64_t serial_ ABSL_GUARDED_BY(mu_) = 0;
  pid_t pid_ ABSL_GUARDED_BY(mu_) = 0;
  std::string job_id_ ABSL_GUARDED_BY(mu_);
  std::string spec_digest_ ABSL_GUARDED_BY(mu_);
  bool dead_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // The generation assigned whose end the process has not said (0: none).
  uint64_t live_generation_ ABSL_GUARDED_BY(mu_) = 0;
  v1::JobProcessClaim claim_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ddp

#endif  // DDP_WORKER_PROCESS_ISOLATED_JOBS_H_
