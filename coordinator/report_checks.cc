#include "coordinator/report_checks.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ddp {

absl::Status CheckStep(uint64_t step, uint64_t start_step) {
  if (step > start_step && step - start_step > kMaxStepAdvance) {
    return absl::InvalidArgumentError(
        absl::StrCat("step ", step, " is more than ", kMaxStepAdvance,
                     " (2^40) steps beyond the generation's start step ", start_step,
                     "; the message was dropped"));
  }
  return absl::OkStatus();
}

absl::Status CheckHeartbeat(const v1::Heartbeat& heartbeat, uint64_t start_step) {
  if (absl::Status s = CheckStep(heartbeat.step(), start_step); !s.ok()) return s;
  const double bound = heartbeat.phase_bound_seconds();
  if (!(bound >= 0 && bound <= kMaxPhaseBoundSeconds)) {
    return absl::InvalidArgumentError(absl::StrCat("heartbeat phase_bound_seconds ", bound,
                                                   " is not in [0, ", kMaxPhaseBoundSeconds,
                                                   "]; the message was dropped"));
  }
  return absl::OkStatus();
}

namespace {

// The coordinator keeps a report's per-parameter digests for a few steps,
// and the names for the job: both bounded here.
absl::Status CheckParameterDigests(const v1::StepReport& report) {
  const size_t digests = report.parameter_digests_size();
  const size_t names = report.parameter_digest_names_size();
  if (digests > kMaxParameterDigests || names > kMaxParameterDigests) {
    return absl::InvalidArgumentError(
        absl::StrCat("step report of step ", report.step(), ": ", std::max(digests, names),
                     " per-parameter digests or names; the limit is ", kMaxParameterDigests,
                     " (one per run of consecutive parameters beyond); the batch was dropped"));
  }
  if (names > 0 && names != digests) {
    return absl::InvalidArgumentError(absl::StrCat("step report of step ", report.step(), ": ",
                                                   names, " parameter digest names for ", digests,
                                                   " digests; the batch was dropped"));
  }
  for (const std::string& name : report.parameter_digest_names()) {
    if (name.size() > kMaxParameterDigestNameBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "step report of step ", report.step(), ": a parameter digest name is ", name.size(),
          " bytes; the limit is ", kMaxParameterDigestNameBytes, "; the batch was dropped"));
    }
  }
  return absl::OkStatus();
}

// What a report says of skipped samples ends up in the job's status:
// bounded here.
absl::Status CheckBadSamples(const v1::StepReport& report) {
  if (report.samples_skipped() > kMaxSkippedPerReport) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step report of step ", report.step(), ": samples_skipped ", report.samples_skipped(),
        " is over ", kMaxSkippedPerReport, "; the batch was dropped"));
  }
  if (static_cast<size_t>(report.newly_bad_samples_size()) > kMaxBadSamplesPerReport) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step report of step ", report.step(), ": ", report.newly_bad_samples_size(),
        " newly bad samples; the limit is ", kMaxBadSamplesPerReport, "; the batch was dropped"));
  }
  for (const std::string& bad : report.newly_bad_samples()) {
    if (bad.size() > kMaxBadSampleBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "step report of step ", report.step(), ": a bad sample's error is ", bad.size(),
          " bytes; the limit is ", kMaxBadSampleBytes, "; the batch was dropped"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckReportBatch(const v1::StepReportBatch& batch, uint64_t start_step) {
  if (static_cast<size_t>(batch.reports_size()) > kMaxReportsPerBatch) {
    return absl::ResourceExhaustedError(
        absl::StrCat("a step report batch holds ", batch.reports_size(), " reports; the limit is ",
                     kMaxReportsPerBatch, "; it was dropped"));
  }
  for (const v1::StepReport& report : batch.reports()) {
    if (absl::Status s = CheckStep(report.step(), start_step); !s.ok()) return s;
    // Durations end up in status, metrics and the status page: a NaN or a
    // negative time would poison every sum and chart built on them.
    const v1::StepTimings& t = report.timings();
    const std::pair<const char*, double> durations[] = {
        {"step_seconds", report.step_seconds()},
        {"timings.data_ms", t.data_ms()},
        {"timings.forward_ms", t.forward_ms()},
        {"timings.backward_ms", t.backward_ms()},
        {"timings.allreduce_wait_ms", t.allreduce_wait_ms()},
        {"timings.optimizer_ms", t.optimizer_ms()}};
    for (const auto& [name, value] : durations) {
      if (!(std::isfinite(value) && value >= 0)) {
        return absl::InvalidArgumentError(absl::StrCat("step report of step ", report.step(), ": ",
                                                       name, " must be a finite number >= 0 (got ",
                                                       value, "); the batch was dropped"));
      }
    }
    if (report.parameter_digest().size() > kMaxDigestBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("step report of step ", report.step(), ": parameter_digest is ",
                       report.parameter_digest().size(), " bytes; the limit is ", kMaxDigestBytes,
                       "; the batch was dropped"));
    }
    if (absl::Status s = CheckParameterDigests(report); !s.ok()) return s;
    if (absl::Status s = CheckBadSamples(report); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace ddp
