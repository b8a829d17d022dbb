#include "coordinator/pending_changes.h"

#include <algorithm>
#include <utility>

#include "coordinator/job_history.h"
#include "coordinator/job_progress.h"

namespace ddp {

size_t PendingChanges::AdmissionsOf(absl::string_view owner) const {
  size_t n = 0;
  for (const Admission& a : admissions_) n += a.job.owner == owner ? 1 : 0;
  return n;
}

PendingChanges::Admission* PendingChanges::FindAdmission(absl::string_view id) {
  for (Admission& a : admissions_) {
    if (a.job.spec.name() == id) return &a;
  }
  return nullptr;
}

void PendingChanges::AddAdmission(QueuedJob job, SubmitAnswer answer) {
  admissions_.push_back({std::move(job), {std::move(answer)}});
}

std::optional<PendingChanges::Admission> PendingChanges::TakeAdmission(absl::string_view id) {
  auto it = std::find_if(admissions_.begin(), admissions_.end(),
                         [id](const Admission& a) { return a.job.spec.name() == id; });
  if (it == admissions_.end()) return std::nullopt;
  Admission taken = std::move(*it);
  admissions_.erase(it);
  return taken;
}

PendingChanges::Cancellation* PendingChanges::FindCancellation(absl::string_view id) {
  auto it = cancellations_.find(id);
  return it == cancellations_.end() ? nullptr : &it->second;
}

void PendingChanges::AddCancellation(const std::string& id, std::string reason,
                                     CancelAnswer answer) {
  Cancellation& c = cancellations_[id];
  c.reason = std::move(reason);
  c.answers.push_back(std::move(answer));
}

std::optional<PendingChanges::Cancellation> PendingChanges::TakeCancellation(absl::string_view id) {
  auto it = cancellations_.find(id);
  if (it == cancellations_.end()) return std::nullopt;
  Cancellation taken = std::move(it->second);
  cancellations_.erase(it);
  return taken;
}

namespace {

bool Active(v1::JobState state) {
  return state == v1::JOB_STATE_WAITING || state == v1::JOB_STATE_RUNNING ||
         state == v1::JOB_STATE_RECOVERING;
}

}  // namespace

void PendingChanges::Overlay(v1::DurableState* state, absl::Time now) const {
  if (!cancellations_.empty()) {
    auto cancel = [this](v1::DurableState* job) {
      if (!job->has_job() || !Active(job->job_state())) return;
      auto it = cancellations_.find(job->job().name());
      if (it == cancellations_.end()) return;
      job->set_job_state(v1::JOB_STATE_CANCELLED);
      job->set_job_message(JobProgress::CancelledMessage(it->second.reason));
      job->clear_generation();
    };
    cancel(state);
    for (v1::DurableState& beside : *state->mutable_jobs_beside()) cancel(&beside);
    auto* queue = state->mutable_queue();
    for (const v1::DurableQueuedJob& q : *queue) {
      auto it = cancellations_.find(q.spec().name());
      if (it == cancellations_.end()) continue;
      *state->add_history() = JobHistory::CancelledWhileQueued(
          q.spec(), q.owner(), absl::FromUnixMicros(q.submitted_unix_micros()), it->second.reason,
          now);
    }
    queue->erase(std::remove_if(queue->begin(), queue->end(),
                                [this](const v1::DurableQueuedJob& q) {
                                  return cancellations_.count(q.spec().name()) > 0;
                                }),
                 queue->end());
  }
  for (const Admission& a : admissions_) {
    JobQueue::FillDurableJob(a.job, state->add_queue());
    state->set_next_queue_sequence(std::max(state->next_queue_sequence(), a.job.sequence + 1));
  }
}

}  // namespace ddp
