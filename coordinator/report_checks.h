// What a member's step reports and heartbeats may say, checked before any
// of it is taken: a refused batch changes nothing, and the worker is told
// why (Rejected). Pure functions.
#ifndef DDP_COORDINATOR_REPORT_CHECKS_H_
#define DDP_COORDINATOR_REPORT_CHECKS_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "common/job_spec.h"
#include "ddp/v1/worker.pb.h"

namespace ddp {

// Reports in one StepReportBatch (RESOURCE_EXHAUSTED beyond). A worker's
// reporter sends a few dozen at most.
inline constexpr size_t kMaxReportsPerBatch = 10'000;
// A step more than this beyond its generation's start step is refused
// (INVALID_ARGUMENT): no job takes 2^40 steps, and a step near 2^64 would
// become the job's committed step.
inline constexpr uint64_t kMaxStepAdvance = uint64_t{1} << 40;
// Bytes of a parameter digest (ParameterDigest gives 16 hex digits).
inline constexpr size_t kMaxDigestBytes = 64;
// Per-parameter digests in one report, and bytes of each one's name (the
// library sends at most these: worker/api/session_impl.h).
inline constexpr size_t kMaxParameterDigests = 4096;
inline constexpr size_t kMaxParameterDigestNameBytes = 256;
// The samples one report may say were replaced (dataset.skip_bad_samples:
// a batch's worth, however large); the bad samples it may name are bounded
// in common/job_spec.h.
inline constexpr uint64_t kMaxSkippedPerReport = uint64_t{1} << 32;

// OK when `step` is at most kMaxStepAdvance beyond `start_step`.
absl::Status CheckStep(uint64_t step, uint64_t start_step);

// A phase's own bound a heartbeat claims, in seconds (INVALID_ARGUMENT
// beyond): finite, non-negative, and at most a day, as eval_timeout_seconds.
inline constexpr double kMaxPhaseBoundSeconds = 86400;
absl::Status CheckHeartbeat(const v1::Heartbeat& heartbeat, uint64_t start_step);

// Every report of `batch`, in a generation that started at `start_step`:
// the batch size, each step, a finite non-negative step_seconds, the digest
// size, the per-parameter digests and their names (counts and sizes). A NaN or infinite loss is
// allowed (a diverging model reports one); it is shown as it is.
absl::Status CheckReportBatch(const v1::StepReportBatch& batch, uint64_t start_step);

}  // namespace ddp

#endif  // DDP_COORDINATOR_REPORT_CHECKS_H_
