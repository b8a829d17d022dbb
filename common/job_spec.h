// Job specs: parsing from JSON, defaults, and validation. Every error names
// the field, so a person can fix the file.
#ifndef DDP_COMMON_JOB_SPEC_H_
#define DDP_COMMON_JOB_SPEC_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ddp/v1/job.pb.h"

namespace ddp {

// Sizes a spec may ask for. Checked by ValidateJobSpec, and again where the
// data is made or read (worker/dataset.cc), so neither trusts the other.
// A synthetic sample is 1x28x28 float32.
inline constexpr uint64_t kSyntheticSampleBytes = 1 * 28 * 28 * sizeof(float);
inline constexpr uint64_t kMaxSyntheticTrainSize = 10'000'000;
inline constexpr uint64_t kMaxSyntheticTestSize = 1'000'000;
// train_size + test_size samples of a synthetic dataset: 4 GiB (1,369,568
// samples) of x; making it takes about twice that at its peak.
inline constexpr uint64_t kMaxSyntheticBytes = uint64_t{4} << 30;
// dataset.train_size of the other kinds (the first train_size samples).
inline constexpr uint64_t kMaxTrainSize = uint64_t{1} << 31;
// Any path in a spec, in bytes (PATH_MAX).
inline constexpr size_t kMaxPathBytes = 4096;
// dataset.kind "shards": the index ddp-pack writes in the folder.
inline constexpr char kShardsIndexName[] = "index.ddp-pack";
// dataset.skip_bad_samples: the bad samples one step report may name, and
// each one's error at most this long (the worker sends no more, the
// coordinator accepts no more).
inline constexpr size_t kMaxBadSamplesPerReport = 8;
inline constexpr size_t kMaxBadSampleBytes = 1024;

// What this build can run. Every build has every backend: NCCL is bound at
// run time (worker/collective/nccl_library.h), so whether it works is the
// worker's question when a generation connects, never the job check's (the
// coordinator runs no NCCL). What is left is LibTorch's reach.
struct BuildCapabilities {
  // LibTorch here can train on CUDA devices (ddp-worker --device cuda:N).
  bool cuda = false;
};
BuildCapabilities ThisBuild();

// Fills in every default the proto comments promise. Idempotent.
v1::JobSpec WithDefaults(v1::JobSpec spec);

// model.kind "program": a user's program on the ddp library trains it; the
// coordinator checks no model or data and assigns only such programs.
bool IsProgramJob(const v1::JobSpec& spec);

// Samples per evaluation forward, at least 1: eval_batch_size, else (a spec
// from before the field) batch_size. The job's check runs this size too.
int64_t EvaluationBatchSize(const v1::JobSpec& spec);

// Checks a spec that already has its defaults. INVALID_ARGUMENT names the
// field: "job.batch_size: must be at least 1 (got 0)". Every number is
// bounded (NaN and infinities refused), every string a client can make
// long is quoted short (common/quote.h). Checks nothing on disk: see
// coordinator/path_policy.h for where files may be, and worker/preflight.h
// for their contents.
absl::Status ValidateJobSpec(const v1::JobSpec& spec, const BuildCapabilities& build);

// Parses protobuf's JSON mapping of JobSpec, rejecting unknown fields and
// keys given twice (common/json_keys.h), then applies defaults and
// validates.
absl::StatusOr<v1::JobSpec> ParseJobSpecJson(absl::string_view json,
                                             const BuildCapabilities& build);

// Reads and parses a JSON job file. NOT_FOUND when it can't be read.
absl::StatusOr<v1::JobSpec> LoadJobSpecFile(const std::string& path,
                                            const BuildCapabilities& build);

// Fingerprint of the fields that shape a job's training state (model, data,
// optimizer kind, seed, batching), as 16 hex digits: a worker's held state
// or a checkpoint is taken up only by a job with the same one.
std::string SpecDigest(const v1::JobSpec& spec);
// The whole spec's fingerprint, with its defaults and without the pins its
// check added: two submissions of one job have the same.
std::string SubmissionDigest(const v1::JobSpec& spec);

// The job `ddp-run` trains with no --job: a CNN on Fashion-MNIST.
v1::JobSpec DefaultJobSpec(uint32_t workers);

}  // namespace ddp

#endif  // DDP_COMMON_JOB_SPEC_H_
