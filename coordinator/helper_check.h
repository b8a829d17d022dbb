// The check of a job's model and data that needs LibTorch: ddp-validate run
// in a HelperProcess, its one-line answer read back. The JobValidator runs
// it on a thread of its own.
#ifndef DDP_COORDINATOR_HELPER_CHECK_H_
#define DDP_COORDINATOR_HELPER_CHECK_H_

#include <atomic>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "coordinator/helper_process.h"
#include "coordinator/job_validator.h"
#include "ddp/v1/job.pb.h"

namespace ddp {

// Runs `helper` (ddp-validate) on `spec`, blocking. The helper's own answer
// (INVALID_ARGUMENT naming the field, RESOURCE_EXHAUSTED when memory ran
// out, ...), or: DEADLINE_EXCEEDED naming `timeout` when it ran longer;
// RESOURCE_EXHAUSTED when it used up its CPU seconds or was killed;
// UNAVAILABLE when `stop` ended it; INTERNAL when it could not start,
// crashed or answered nonsense (its stderr's tail is logged).
absl::Status ValidateInHelper(const HelperProcess& helper, const v1::JobSpec& spec,
                              absl::Duration timeout, const std::atomic<bool>& stop);

// ValidateInHelper as a JobValidator::Check. `helper` must outlive it.
JobValidator::Check HelperCheck(const HelperProcess* helper, absl::Duration timeout);

}  // namespace ddp

#endif  // DDP_COORDINATOR_HELPER_CHECK_H_
