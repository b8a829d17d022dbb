#include "coordinator/job_history.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "coordinator/job_progress.h"

namespace ddp {
namespace {

bool Ended(v1::JobState state) {
  return state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_CANCELLED;
}

// Seconds from submission to the end (to `now` without either).
double Elapsed(const v1::JobRecord& r, absl::Time now) {
  if (r.submitted_unix_micros() == 0) return 0;
  const absl::Time end =
      r.ended_unix_micros() != 0 ? absl::FromUnixMicros(r.ended_unix_micros()) : now;
  return std::max(0.0,
                  absl::ToDoubleSeconds(end - absl::FromUnixMicros(r.submitted_unix_micros())));
}

}  // namespace

void SetTimestamp(int64_t unix_micros, google::protobuf::Timestamp* out) {
  if (unix_micros == 0) return;
  out->set_seconds(unix_micros / 1000000);
  out->set_nanos(static_cast<int32_t>(unix_micros % 1000000) * 1000);
}

void JobHistory::Record(v1::JobRecord record, uint64_t start_sequence) {
  entries_.erase(
      std::remove_if(entries_.begin(), entries_.end(),
                     [&](const Entry& e) { return e.record.job_id() == record.job_id(); }),
      entries_.end());
  entries_.push_back({std::move(record), start_sequence});
  while (entries_.size() > capacity_) entries_.pop_front();
}

const JobHistory::Entry* JobHistory::Find(absl::string_view job_id) const {
  for (const Entry& e : entries_) {
    if (e.record.job_id() == job_id) return &e;
  }
  return nullptr;
}

void JobHistory::FillDurable(v1::DurableState* state) const {
  for (const Entry& e : entries_) *state->add_history() = e.record;
}

void JobHistory::Restore(const v1::DurableState& state, uint64_t* next_start_sequence) {
  entries_.clear();
  const int saved = state.history_size();
  const int first = std::max(0, saved - static_cast<int>(capacity_));
  for (int i = first; i < saved; ++i) {
    const v1::JobRecord& r = state.history(i);
    if (r.job_id().empty() || !Ended(r.state())) continue;
    Record(r, (*next_start_sequence)++);
  }
}

v1::JobRecord JobHistory::CancelledWhileQueued(const v1::JobSpec& spec, const std::string& owner,
                                               absl::Time submitted_at, absl::string_view reason,
                                               absl::Time now) {
  v1::JobRecord r;
  r.set_job_id(spec.name());
  r.set_submission_digest(SubmissionDigest(spec));
  r.set_owner(owner);
  r.set_priority(spec.priority());
  r.set_submitted_unix_micros(absl::ToUnixMicros(submitted_at));
  r.set_ended_unix_micros(absl::ToUnixMicros(now));
  r.set_state(v1::JOB_STATE_CANCELLED);
  r.set_message(absl::StrCat(JobProgress::CancelledMessage(reason), " (while queued)"));
  return r;
}

v1::JobRecord JobHistory::FailedWhileQueued(const v1::JobSpec& spec, const std::string& owner,
                                            absl::Time submitted_at, absl::string_view message,
                                            absl::Time now) {
  v1::JobRecord r = CancelledWhileQueued(spec, owner, submitted_at, "", now);
  r.set_state(v1::JOB_STATE_FAILED);
  r.set_message(std::string(message));
  return r;
}

v1::JobSummary JobHistory::Summary(const v1::JobRecord& r, absl::Time now) {
  v1::JobSummary s;
  s.set_job_id(r.job_id());
  s.set_state(r.state());
  s.set_message(r.message());
  s.set_priority(r.priority());
  s.set_owner(r.owner());
  s.set_age_seconds(
      r.submitted_unix_micros() == 0
          ? 0
          : absl::ToDoubleSeconds(now - absl::FromUnixMicros(r.submitted_unix_micros())));
  s.set_generation(r.latest_generation());
  s.set_global_step(r.global_step());
  s.set_test_accuracy(r.test_accuracy());
  SetTimestamp(r.submitted_unix_micros(), s.mutable_submitted_at());
  SetTimestamp(r.started_unix_micros(), s.mutable_started_at());
  SetTimestamp(r.ended_unix_micros(), s.mutable_ended_at());
  return s;
}

void JobHistory::FillStatus(const v1::JobRecord& r, absl::Time now, v1::JobStatus* status) {
  status->set_job_id(r.job_id());
  status->set_state(r.state());
  status->set_message(r.message());
  status->set_owner(r.owner());
  status->set_generation(r.latest_generation());
  status->set_global_step(r.global_step());
  status->set_test_accuracy(r.test_accuracy());
  status->set_faults(r.faults());
  status->set_elapsed_seconds(Elapsed(r, now));
  SetTimestamp(r.submitted_unix_micros(), status->mutable_submitted_at());
  SetTimestamp(r.started_unix_micros(), status->mutable_started_at());
  SetTimestamp(r.ended_unix_micros(), status->mutable_ended_at());
}

}  // namespace ddp
