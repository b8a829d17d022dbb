// The Coordinator's status side: the snapshot operators read (GetStatus,
// WatchStatus, the status page, metrics), rebuilt at a tick after a change,
// and the status of any one job on demand.
#include <map>

#include "absl/strings/str_cat.h"
#include "common/quote.h"
#include "coordinator/coordinator.h"
#include "google/protobuf/arena.h"

namespace ddp {

void Coordinator::FillWorkerLocked(const WorkerRecord& worker, absl::Time now,
                                   v1::WorkerStatus* ws) {
  const WorkerRecord* w = &worker;
  ws->set_worker_id(w->id);
  ws->set_host(w->host);
  ws->set_device(w->device.ToString());
  ws->set_pid(w->pid);
  ws->mutable_labels()->insert(w->labels.begin(), w->labels.end());
  ws->set_version(w->version);
  // Its rank in its job's current generation, or once that ended, the
  // last one (operators still want to see who had which rank).
  const Generation* g = w->job.empty() ? nullptr : RunOfLocked(*w).generations().last();
  ws->set_rank(g ? g->RankOf(w->id) : -1);
  ws->set_job_id(w->job);
  ws->set_state(w->state());
  ws->set_detail(w->detail());
  ws->set_generation(w->generation);
  ws->set_epoch(w->epoch);
  ws->set_step(w->step);
  ws->set_last_loss(w->last_loss);
  ws->set_samples_per_sec(w->samples_per_sec);
  *ws->mutable_reduction() = w->reduction;
  *ws->mutable_timings() = w->timings;
  ws->set_step_seconds(w->step_seconds);
  for (const auto& name : w->unused_parameters) ws->add_unused_parameters(name);
  ws->set_seconds_since_heartbeat(absl::ToDoubleSeconds(now - w->last_seen));
  ws->set_phase(w->phase);
  ws->set_reports_dropped(w->reports_dropped);
  *ws->mutable_probe() = w->probe;
  ws->set_stale_messages(w->stale_messages);
  ws->set_unused_parameter_names_dropped(w->unused_names_dropped);
  ws->set_parameter_digest(w->parameter_digest);
  ws->set_digest_step(w->digest_step);
  if (w->held) *ws->mutable_held() = *w->held;
}

void Coordinator::PublishLocked() {
  for (const auto& each : runs_) each->progress().SampleProgress();
  const JobRun& run = PrimaryRunLocked();  // the job the status is about
  // On an arena: at 4,096 workers the snapshot is ~40k small objects, made
  // and (for the one it replaces) freed under mu_ several times a second.
  google::protobuf::ArenaOptions arena_options;
  arena_options.start_block_size = 64 << 10;
  arena_options.max_block_size = 4 << 20;
  auto arena = std::make_shared<google::protobuf::Arena>(arena_options);
  v1::JobStatus* status = google::protobuf::Arena::CreateMessage<v1::JobStatus>(arena.get());
  run.FillStatus(status);
  for (size_t i = 0; i < queue_.size() && i < kQueueInStatus; ++i) {
    *status->add_queue() = queue_.Summary(i, clock_->Now(), QueueWhyLocked(i));
  }
  status->set_queued_jobs(static_cast<uint32_t>(queue_.size()));
  std::map<std::string, uint32_t> held;  // workers each job holds
  for (const WorkerRecord* w : registry_.All()) {
    if (!w->lost() && !w->job.empty()) ++held[w->job];
  }
  for (const auto& each : runs_) {
    v1::JobSummary* s = status->add_jobs();
    *s = each->Summary(clock_->Now());
    s->set_workers(each->active() ? held[each->id()] : 0);
  }
  // What GetStatus answers: the job as above, with a bounded worker list.
  // Its own heap copy: a WatchStatus stream holding it must not keep the
  // whole snapshot's arena alive.
  auto view = std::make_shared<v1::JobStatus>(*status);
  const absl::Time now = clock_->Now();
  uint32_t attached = 0;
  for (const WorkerRecord* w : registry_.All()) {
    attached += w->lost() ? 0 : 1;
    FillWorkerLocked(*w, now, status->add_workers());
  }
  status->set_attached_workers(attached);
  view->set_attached_workers(attached);
  BoundStatusView(*status, options_.status_workers, view.get());
  dirty_ = false;
  published_at_ = now;
  absl::MutexLock lock(&snapshot_mu_);
  snapshot_ = std::shared_ptr<const v1::JobStatus>(std::move(arena), status);
  view_ = std::move(view);
}

std::shared_ptr<const v1::JobStatus> Coordinator::Snapshot() const {
  absl::MutexLock lock(&snapshot_mu_);
  return snapshot_;
}

std::shared_ptr<const v1::JobStatus> Coordinator::StatusView() const {
  absl::MutexLock lock(&snapshot_mu_);
  return view_;
}

v1::JobState Coordinator::job_state() const {
  absl::MutexLock lock(&mu_);
  return PrimaryRunLocked().progress().state();
}

absl::StatusOr<std::shared_ptr<const v1::JobStatus>> Coordinator::JobStatusView(
    const std::string& job_id) {
  if (job_id.empty()) return StatusView();
  absl::MutexLock lock(&mu_);
  JobRun* run = FindRunLocked(job_id);
  const JobHistory::Entry* ended = run == nullptr ? history_.Find(job_id) : nullptr;
  if (run == nullptr && ended == nullptr) {
    if (queue_.Find(job_id) != nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", Quote(job_id), " is queued and has no status yet; GetJob says why it waits"));
    }
    return absl::NotFoundError(absl::StrCat("no job ", Quote(job_id),
                                            " started (ListJobs lists the jobs; of those that "
                                            "ended the coordinator keeps the last ",
                                            history_.entries().size(), ")"));
  }
  // The default view, when it describes this job (the snapshot may still
  // describe the job that was the primary one a tick ago).
  if (run != nullptr && run == &PrimaryRunLocked()) {
    if (std::shared_ptr<const v1::JobStatus> view = StatusView();
        view != nullptr && view->job_id() == job_id) {
      return view;
    }
  }
  v1::JobStatus full;
  if (run != nullptr) {
    run->progress().SampleProgress();
    run->FillStatus(&full);
  } else {
    JobHistory::FillStatus(ended->record, clock_->Now(), &full);
  }
  // The pool's jobs and queue, as the default view has them (at most a
  // tick old): whichever job one asks about, the others stay in sight.
  if (const std::shared_ptr<const v1::JobStatus> pool = StatusView()) {
    *full.mutable_jobs() = pool->jobs();
    *full.mutable_queue() = pool->queue();
    full.set_queued_jobs(pool->queued_jobs());
  }
  const absl::Time now = clock_->Now();
  uint32_t attached = 0;
  for (const WorkerRecord* w : registry_.All()) {
    attached += w->lost() ? 0 : 1;
    if (w->job == job_id) FillWorkerLocked(*w, now, full.add_workers());
  }
  auto view = std::make_shared<v1::JobStatus>(full);
  view->clear_workers();
  view->set_attached_workers(attached);
  BoundStatusView(full, options_.status_workers, view.get());
  return std::shared_ptr<const v1::JobStatus>(std::move(view));
}

}  // namespace ddp
