// The check of a job's model and data that needs LibTorch: ddp-validate run
// in a HelperProcess, its one-line answer read back. The JobValidator runs
// it on a thread of its own.
#ifndef DDP_COORDINATOR_HELPER_CHECK_H_
#define DDP_COORDINATOR_HELPER_CHECK_H_

#include <atomic>
#include <string>
#include <vector>

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
// crashed or answered nonsense (its stderr's tail is logged). When the job
// passes, `spec`'s input_files are set to what the helper read (each input
// file's real path, size and SHA-256: ExpectedInputs, each exactly once).
absl::Status ValidateInHelper(const HelperProcess& helper, v1::JobSpec& spec,
                              absl::Duration timeout, const std::atomic<bool>& stop);

// The input files a check of `spec` must pin, as the job names them: the
// TorchScript model, a tensors file and its test file, the four
// Fashion-MNIST files.
std::vector<std::string> ExpectedInputs(const v1::JobSpec& spec);

// ValidateInHelper as a JobValidator::Check. `helper` must outlive it.
JobValidator::Check HelperCheck(const HelperProcess* helper, absl::Duration timeout);

}  // namespace ddp

#endif  // DDP_COORDINATOR_HELPER_CHECK_H_
