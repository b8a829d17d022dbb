#include "coordinator/job_queue.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ddp {
namespace {

// Higher priority first, then the earlier submission.
bool StartsBefore(const QueuedJob& a, const QueuedJob& b) {
  if (a.spec.priority() != b.spec.priority()) return a.spec.priority() > b.spec.priority();
  return a.sequence < b.sequence;
}

}  // namespace

absl::Status JobQueue::CheckRoom(size_t reserved) const {
  if (jobs_.size() + reserved < kMaxQueuedJobs) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat("the queue is full (", kMaxQueuedJobs,
                   " jobs wait for the pool); cancel one (CancelJob) or submit again later"));
}

absl::Status JobQueue::Add(QueuedJob job, size_t reserved) {
  if (Find(job.spec.name()) != nullptr) {
    return absl::AlreadyExistsError(
        absl::StrCat("job \"", job.spec.name(), "\" is already queued"));
  }
  if (absl::Status s = CheckRoom(reserved); !s.ok()) return s;
  next_sequence_ = std::max(next_sequence_, job.sequence + 1);
  Insert(std::move(job));
  return absl::OkStatus();
}

void JobQueue::Requeue(QueuedJob job) { Insert(std::move(job)); }

std::optional<size_t> JobQueue::IndexOf(absl::string_view id) const {
  for (size_t i = 0; i < jobs_.size(); ++i) {
    if (jobs_[i].spec.name() == id) return i;
  }
  return std::nullopt;
}

const QueuedJob* JobQueue::Find(absl::string_view id) const {
  const std::optional<size_t> i = IndexOf(id);
  return i ? &jobs_[*i] : nullptr;
}

bool JobQueue::Remove(absl::string_view id) { return Take(id).has_value(); }

std::optional<QueuedJob> JobQueue::Take(absl::string_view id) {
  const std::optional<size_t> i = IndexOf(id);
  if (!i) return std::nullopt;
  QueuedJob job = std::move(jobs_[*i]);
  jobs_.erase(jobs_.begin() + static_cast<std::ptrdiff_t>(*i));
  return job;
}

v1::JobSummary JobQueue::Summary(size_t index, absl::Time now, absl::string_view why) const {
  const QueuedJob& job = jobs_[index];
  v1::JobSummary s;
  s.set_job_id(job.spec.name());
  s.set_state(v1::JOB_STATE_QUEUED);
  s.set_priority(job.spec.priority());
  s.set_owner(job.owner);
  s.set_queue_position(static_cast<uint32_t>(index + 1));
  s.set_age_seconds(absl::ToDoubleSeconds(now - job.submitted_at));
  std::string preempted;
  if (job.preempted != nullptr) {
    const uint64_t step = job.preempted->global_step();
    const uint64_t checkpoint = job.preempted->last_checkpoint_step();
    s.set_global_step(step);
    preempted = absl::StrCat("preempted at step ", step, "; ");
    if (checkpoint >= step) {
      absl::StrAppend(&preempted, "resumes from its checkpoint of step ", checkpoint, ". ");
    } else {
      absl::StrAppend(&preempted,
                      "no checkpoint of that step came: it resumes from a worker still holding "
                      "it, else from ",
                      checkpoint > 0 ? absl::StrCat("its checkpoint of step ", checkpoint)
                                     : std::string("the start"),
                      ". ");
    }
  }
  if (!why.empty()) {
    s.set_message(absl::StrCat(preempted, why));
  } else if (index > 0) {
    s.set_message(
        absl::StrCat(preempted, "waiting for ", index, index == 1 ? " job" : " jobs",
                     " queued ahead of it (higher priority, or submitted earlier) to start"));
  } else {
    s.set_message(absl::StrCat(preempted, "next: starts at the coordinator's next tick"));
  }
  return s;
}

void JobQueue::FillDurableJob(const QueuedJob& job, v1::DurableQueuedJob* d) {
  *d->mutable_spec() = job.spec;
  d->set_owner(job.owner);
  d->set_sequence(job.sequence);
  d->set_submitted_unix_micros(absl::ToUnixMicros(job.submitted_at));
  if (job.preempted != nullptr) *d->mutable_preempted() = *job.preempted;
}

void JobQueue::FillDurable(v1::DurableState* state) const {
  for (const QueuedJob& job : jobs_) FillDurableJob(job, state->add_queue());
  state->set_next_queue_sequence(next_sequence_);
}

void JobQueue::Restore(const v1::DurableState& state) {
  jobs_.clear();
  for (const v1::DurableQueuedJob& d : state.queue()) {
    QueuedJob job{d.spec(), d.owner(), d.sequence(),
                  absl::FromUnixMicros(d.submitted_unix_micros())};
    if (d.has_preempted()) job.preempted = std::make_shared<const v1::DurableState>(d.preempted());
    Insert(std::move(job));
  }
  next_sequence_ = state.next_queue_sequence();
  for (const QueuedJob& job : jobs_) next_sequence_ = std::max(next_sequence_, job.sequence + 1);
}

void JobQueue::Insert(QueuedJob job) {
  jobs_.insert(std::upper_bound(jobs_.begin(), jobs_.end(), job, StartsBefore), std::move(job));
}

}  // namespace ddp
