#ifndef DDP_WORKER_PREFLIGHT_H_
#define DDP_WORKER_PREFLIGHT_H_

#include "absl/status/status.h"
#include "ddp/v1/job.pb.h"

namespace ddp {

// Checks, before a job is accepted, what validation of the spec alone can't:
// the data files are readable, the model loads and its forward fits the
// data, so a bad file fails the submission with a clear INVALID_ARGUMENT
// instead of every worker later. It runs the job's own code: the
// coordinator never calls it, but starts ddp-validate (validate_main.cc), a
// helper process with limits, for each submission. Assumes the coordinator's
// machine sees the same paths as the workers.
absl::Status PreflightJob(const v1::JobSpec& spec);

}  // namespace ddp

#endif  // DDP_WORKER_PREFLIGHT_H_
