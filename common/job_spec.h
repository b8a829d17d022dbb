// Job specs: parsing from JSON, defaults, and validation. Every error names
// the field, so a person can fix the file.
#ifndef DDP_COMMON_JOB_SPEC_H_
#define DDP_COMMON_JOB_SPEC_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ddp/v1/job.pb.h"

namespace ddp {

// What this build can run; a spec asking for more is refused.
struct BuildCapabilities {
  bool nccl = false;
};
BuildCapabilities ThisBuild();

// Fills in every default the proto comments promise. Idempotent.
v1::JobSpec WithDefaults(v1::JobSpec spec);

// Checks a spec that already has its defaults. INVALID_ARGUMENT names the
// field: "job.batch_size: must be at least 1 (got 0)". Checks nothing on
// disk: see coordinator/path_policy.h for where files may be, and
// worker/preflight.h for their contents.
absl::Status ValidateJobSpec(const v1::JobSpec& spec, const BuildCapabilities& build);

// Parses protobuf's JSON mapping of JobSpec, rejecting unknown fields, then
// applies defaults and validates.
absl::StatusOr<v1::JobSpec> ParseJobSpecJson(absl::string_view json,
                                             const BuildCapabilities& build);

// Reads and parses a JSON job file. NOT_FOUND when it can't be read.
absl::StatusOr<v1::JobSpec> LoadJobSpecFile(const std::string& path,
                                            const BuildCapabilities& build);

// Fingerprint of the fields that shape a job's training state (model, data,
// optimizer kind, seed, batching), as 16 hex digits: a worker's held state
// or a checkpoint is taken up only by a job with the same one.
std::string SpecDigest(const v1::JobSpec& spec);

// The job `ddp-run` trains with no --job: a CNN on Fashion-MNIST.
v1::JobSpec DefaultJobSpec(uint32_t workers);

}  // namespace ddp

#endif  // DDP_COMMON_JOB_SPEC_H_
