// Whether a worker can run a job: its kind (a ddp-worker or a program on
// the library), its labels against the job's selector, and its device
// against the job's backend. The pool asks it before giving a worker to a
// job, and a job before taking a worker into a generation.
#ifndef DDP_COORDINATOR_WORKER_FIT_H_
#define DDP_COORDINATOR_WORKER_FIT_H_

#include "coordinator/worker_registry.h"
#include "ddp/v1/job.pb.h"

namespace ddp {

bool CanRun(const WorkerRecord& w, const v1::JobSpec& spec);

// Whether the pool may give `w` to a job of `spec`: it can run it, and a
// program on the library goes only to the job it says it holds (if it says
// one).
bool CanGive(const WorkerRecord& w, const v1::JobSpec& spec);

}  // namespace ddp

#endif  // DDP_COORDINATOR_WORKER_FIT_H_
