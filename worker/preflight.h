#ifndef DDP_WORKER_PREFLIGHT_H_
#define DDP_WORKER_PREFLIGHT_H_

#include "absl/status/status.h"
#include "ddp/v1/job.pb.h"
#include "worker/input_files.h"

namespace ddp {

// Checks, before a job is accepted, what validation of the spec alone can't:
// the data files are readable, the model loads and its forward fits the
// data, so a bad file fails the submission with a clear INVALID_ARGUMENT
// instead of every worker later. It runs the job's own code: the
// coordinator never calls it, but starts ddp-validate (validate_main.cc), a
// helper process with limits, for each submission. Assumes the coordinator's
// machine sees the same paths as the workers. Every input file is read
// through `inputs` (null: a throwaway one), which records what was read:
// the pins the coordinator keeps with the job.
absl::Status PreflightJob(const v1::JobSpec& spec, InputFiles* inputs = nullptr);

}  // namespace ddp

#endif  // DDP_WORKER_PREFLIGHT_H_
