// What a worker daemon does with the jobs the coordinator gives it: run an
// assignment, leave it, build a job's state ahead, and say what it trains
// in or holds. Two kinds: in this process (InProcessJobs: a job's process
// runs its jobs so) and in a process per job (IsolatedJobs: the daemon).
#ifndef DDP_WORKER_PROCESS_JOB_RUNNER_H_
#define DDP_WORKER_PROCESS_JOB_RUNNER_H_

#include <memory>
#include <string>

#include "ddp/v1/coordinator.grpc.pb.h"

namespace ddp {

class JobRunner {
 public:
  virtual ~JobRunner() = default;
  // Runs `assignment`, from the coordinator at `target` (reached through
  // `stub`), after leaving any generation in flight. Returns soon.
  virtual void Assign(const v1::Assignment& assignment, const std::string& target,
                      std::shared_ptr<v1::Coordinator::StubInterface> stub) = 0;
  // Leaves the generation `abort` names, at once or at a step boundary.
  virtual void Abort(const v1::Abort& abort) = 0;
  // Leaves whatever generation is in flight, keeping the job's state.
  virtual void AbortAny(const std::string& reason) = 0;
  // Builds the job's state ahead of an assignment. Returns soon.
  virtual void Prepare(const v1::Prepare& prepare) = 0;
  // Ends the generation in flight for good: the worker is stopping.
  virtual void Stop() = 0;
  // Fills what the worker trains in or holds into its register.
  virtual void Claim(v1::RegisterRequest* request) = 0;
};

}  // namespace ddp

#endif  // DDP_WORKER_PROCESS_JOB_RUNNER_H_
