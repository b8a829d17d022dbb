// libFuzzer: job specs as users write them (JSON) and as clients send them
// (binary protobuf). Parsing and validation must never crash, hang or
// allocate without bound, and a spec they accept must stay accepted once its
// defaults are filled in (WithDefaults is idempotent); the path policy
// takes whatever paths it names.
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/job_spec.h"
#include "coordinator/path_policy.h"
#include "ddp/v1/job.pb.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const ddp::BuildCapabilities build;
  absl::StatusOr<ddp::v1::JobSpec> parsed = ddp::ParseJobSpecJson(input, build);
  if (parsed.ok()) {
    if (!ddp::ValidateJobSpec(*parsed, build).ok()) __builtin_trap();
    const ddp::v1::JobSpec again = ddp::WithDefaults(*parsed);
    if (again.SerializeAsString() != parsed->SerializeAsString()) __builtin_trap();
    (void)ddp::SpecDigest(*parsed);
    // Paths as a submission's are checked: stat and realpath only.
    static const ddp::PathRoots roots{{"/usr/share/datasets"}, {"/tmp"}};
    (void)ddp::CheckJobPaths(*parsed, roots);
  }
  ddp::v1::JobSpec binary;
  if (binary.ParseFromString(input)) {
    const ddp::v1::JobSpec spec = ddp::WithDefaults(binary);
    if (ddp::ValidateJobSpec(spec, build).ok()) (void)ddp::SpecDigest(spec);
  }
  return 0;
}
