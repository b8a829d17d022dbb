// Runs a worker's jobs in this process, one generation at a time, keeping
// the job's training state between them: what a job's process does with the
// daemon's messages (worker/process/job_host.h), and what a daemon started
// with --in_process_jobs does itself.
#ifndef DDP_WORKER_IN_PROCESS_JOBS_H_
#define DDP_WORKER_IN_PROCESS_JOBS_H_

#include <atomic>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "worker/generation_run.h"
#include "worker/link/outbox.h"
#include "worker/link/progress_board.h"
#include "worker/process/job_runner.h"
#include "worker/state_preparer.h"

namespace ddp {

class InProcessJobs final : public JobRunner {
 public:
  // Every run gets `env` (its stub from Assign, or made by
  // env.leader_stubs for the target when Assign has none). `outbox` and
  // `board` outlive it.
  InProcessJobs(GenerationRun::Environment env, Outbox* outbox, ProgressBoard* board);
  ~InProcessJobs() override;

  void Assign(const v1::Assignment& assignment, const std::string& target,
              std::shared_ptr<v1::Coordinator::StubInterface> stub) override;
  void Abort(const v1::Abort& abort) override;
  void AbortAny(const std::string& reason) override;
  void Prepare(const v1::Prepare& prepare) override;
  void Stop() override;
  void Claim(v1::RegisterRequest* request) override;

 private:
  void AbortGeneration(uint64_t generation, const std::string& reason);

  const GenerationRun::Environment env_;
  Outbox* const outbox_;
  ProgressBoard* const board_;
  std::atomic<bool> stopping_{false};
  StateSlot slot_;
  StatePreparer preparer_;

  absl::Mutex mu_;
  std::unique_ptr<GenerationRun> run_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ddp

#endif  // DDP_WORKER_IN_PROCESS_JOBS_H_
