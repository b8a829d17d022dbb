#ifndef DDP_WORKER_PREFLIGHT_H_
#define DDP_WORKER_PREFLIGHT_H_

#include "absl/status/status.h"
#include "ddp/v1/job.pb.h"

namespace ddp {

// Checks, before a job is accepted, what validation of the spec alone can't:
// the data files are readable, the model loads and its forward fits the
// data. The coordinator runs it on submission, so a bad file fails the
// submission with a clear INVALID_ARGUMENT instead of every worker later.
// Assumes the coordinator sees the same paths as the workers.
absl::Status PreflightJob(const v1::JobSpec& spec);

}  // namespace ddp

#endif  // DDP_WORKER_PREFLIGHT_H_
