// The Coordinator's pool side: which job each worker belongs to, and the
// jobs that share the pool. A worker belongs to at most one job at a time
// (WorkerRecord::job); only that job prepares it, forms generations with it
// and hears what it says. A job gets workers when it starts and while it
// wants more; they go back to the pool when it ends, and on to the next job
// without restarting.
//
// AllocateLocked, at every tick and whenever a worker or job changes:
//   - first, running jobs without a generation get what they need to form
//     one (up to min_workers), from free workers: recovery comes first;
//   - with no job running, the queue's first job (that its owner's quota
//     lets start) starts at once and waits for workers as a lone job always
//     has; a lone job with nothing queued takes every worker that fits it,
//     up to max_workers;
//   - otherwise jobs contend, and DecideSchedule (schedule_policy.h, the
//     policy bench/schedule_sim measures) decides: queued jobs start on
//     min_workers, by priority; running ones shrink for them at a step
//     boundary (lower priorities first, then what jobs of the same priority
//     hold above min_workers) or are preempted whole through a checkpoint;
//     spare workers grow running jobs where measured samples/s gains most;
//     no allocation changes within a job's reformMinIntervalSeconds; an
//     owner's jobs never hold more than its quota (coordinator_schedule.cc
//     carries the plan out);
//   - a worker holding a job's state goes to that job before others.
#include <algorithm>
#include <limits>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/labels.h"
#include "common/logging.h"
#include "common/quote.h"
#include "coordinator/coordinator.h"
#include "coordinator/throughput_model.h"
#include "coordinator/worker_fit.h"

namespace ddp {

bool Coordinator::InPoolLocked(const WorkerRecord& w) const {
  if (w.lost() || !IsFree(w)) return false;
  if (w.job.empty()) return true;
  const JobRun* run = FindRunLocked(w.job);
  return run == nullptr || !run->active();
}

JobRun* Coordinator::FindRunLocked(absl::string_view job_id) const {
  for (const auto& run : runs_) {
    if (run->id() == job_id) return run.get();
  }
  return nullptr;
}

JobRun& Coordinator::RunOfLocked(const WorkerRecord& worker) {
  if (!worker.job.empty()) {
    JobRun* run = FindRunLocked(worker.job);
    return run ? *run : *no_job_;
  }
  // Given up by its job (to another) but still a member of its generation
  // until it leaves at the step boundary: that job hears it till then.
  if (JobRun* run = RunOfGenerationLocked(worker.generation);
      run != nullptr && run->generations().current()->RankOf(worker.id) >= 0) {
    return *run;
  }
  return *no_job_;
}

JobRun* Coordinator::AdoptingRunOfLocked(const std::string& worker_id) const {
  for (const auto& run : runs_) {
    const Generation* g = run->generations().current();
    if (run->lifecycle().adopting() && g != nullptr && g->RankOf(worker_id) >= 0) {
      return run.get();
    }
  }
  return nullptr;
}

JobRun* Coordinator::RunOfGenerationLocked(uint64_t generation) const {
  for (const auto& run : runs_) {
    if (run->active() && run->generations().IsCurrent(generation)) return run.get();
  }
  return nullptr;
}

const JobRun& Coordinator::PrimaryRunLocked() const {
  for (const auto& run : runs_) {
    if (run->active()) return *run;
  }
  return runs_.empty() ? *no_job_ : *runs_.back();
}

std::string Coordinator::RunningJobsLocked() const {
  std::string ids;
  for (const auto& run : runs_) {
    if (run->active()) absl::StrAppend(&ids, ids.empty() ? "" : ", ", Quote(run->id()));
  }
  return ids.empty() ? "none" : ids;
}

bool Coordinator::AnyActiveLocked() const {
  return std::any_of(runs_.begin(), runs_.end(), [](const auto& run) { return run->active(); });
}

uint64_t Coordinator::LatestGenerationLocked() const {
  uint64_t latest = std::max(latest_generation_, no_job_->generations().latest());
  for (const auto& run : runs_) latest = std::max(latest, run->generations().latest());
  return latest;
}

std::vector<JobRun*> Coordinator::RunningByPriorityLocked() const {
  std::vector<JobRun*> runs;
  for (const auto& run : runs_) {
    if (run->active() && !run->preempting()) runs.push_back(run.get());
  }
  std::stable_sort(runs.begin(), runs.end(), [](const JobRun* a, const JobRun* b) {
    return a->spec().priority() > b->spec().priority();
  });
  return runs;
}

uint32_t Coordinator::HeldCountLocked(const JobRun& run) const {
  // A job that ended holds none (its workers only keep showing its ranks).
  if (!run.active()) return 0;
  uint32_t n = 0;
  for (const WorkerRecord* w : registry_.OfJob(run.id())) n += w->lost() ? 0 : 1;
  return n;
}

std::vector<const WorkerRecord*> Coordinator::PoolLocked() const {
  // In no job, or in one that ended: walked by job, not over every worker
  // (a registration among thousands costs what it changes).
  std::vector<const WorkerRecord*> pool;
  for (const std::string& job : registry_.JobsHolding()) {
    if (const JobRun* run = FindRunLocked(job); !job.empty() && run != nullptr && run->active()) {
      continue;
    }
    for (const WorkerRecord* w : registry_.OfJob(job)) {
      if (InPoolLocked(*w)) pool.push_back(w);
    }
  }
  std::sort(pool.begin(), pool.end(), SlotBefore);
  return pool;
}

void Coordinator::AllocateLocked(Effects* fx) {
  RequeuePreemptedLocked(fx);
  // First what running jobs need to train at all: a job without a
  // generation, up to min_workers.
  for (JobRun* run : RunningByPriorityLocked()) {
    const uint32_t has = HeldCountLocked(*run);
    if (run->generations().current() == nullptr && has < run->spec().min_workers()) {
      GiveWorkersLocked(*run, run->spec().min_workers() - has, fx);
    }
  }
  queue_waits_.clear();
  if (!AnyActiveLocked()) StartAloneLocked(fx);
  const std::vector<JobRun*> running = RunningByPriorityLocked();
  if (queue_.empty() && running.size() <= 1 && !AnyPreemptingLocked()) {
    // Alone on the pool: every worker that fits, up to max_workers.
    if (!running.empty()) {
      JobRun& run = *running.front();
      const uint32_t held = HeldCountLocked(run);
      if (held < run.spec().max_workers()) {
        GiveWorkersLocked(run, run.spec().max_workers() - held, fx);
      }
    }
    return;
  }
  ScheduleLocked(fx);
}

bool Coordinator::AnyPreemptingLocked() const {
  return std::any_of(runs_.begin(), runs_.end(),
                     [](const auto& run) { return run->active() && run->preempting(); });
}

void Coordinator::StartAloneLocked(Effects* fx) {
  for (const QueuedJob& job : queue_.jobs()) {
    if (std::string over = OverQuotaLocked(job.spec, job.owner); !over.empty()) {
      queue_waits_[job.spec.name()] = std::move(over);
      continue;
    }
    const std::string id = job.spec.name();
    std::optional<QueuedJob> next = queue_.Take(id);
    DDP_LOG(Info) << "job " << next->spec.name() << " leaves the queue: no job runs";
    if (absl::Status s = StartJobLocked(next->spec, next->owner, fx, &*next); !s.ok()) {
      DDP_LOG(Error) << "job " << next->spec.name() << " could not start, and is dropped: " << s;
      dirty_ = true;
      PersistLocked(fx);
    }
    return;
  }
}

uint32_t Coordinator::QuotaLeftLocked(const std::string& owner) const {
  const auto quota = options_.owner_quotas.find(owner);
  if (quota == options_.owner_quotas.end()) return std::numeric_limits<uint32_t>::max();
  uint32_t held = 0;
  for (const auto& run : runs_) {
    if (run->active() && run->owner() == owner) held += HeldCountLocked(*run);
  }
  return quota->second - std::min(quota->second, held);
}

std::string Coordinator::OverQuotaLocked(const v1::JobSpec& spec, const std::string& owner) const {
  const auto quota = options_.owner_quotas.find(owner);
  if (quota == options_.owner_quotas.end()) return "";
  if (spec.min_workers() > quota->second) {
    return absl::StrCat("it can never start: it needs ", spec.min_workers(),
                        " workers and its owner ", Quote(owner), " may hold at most ",
                        quota->second, " (max_workers in the coordinator's tokens file)");
  }
  const uint32_t left = QuotaLeftLocked(owner);
  if (spec.min_workers() <= left) return "";
  return absl::StrCat("waiting for its owner's quota: ", Quote(owner), "'s running jobs hold ",
                      quota->second - left, " of the ", quota->second,
                      " worker(s) it may hold, and it needs ", spec.min_workers());
}

absl::string_view Coordinator::QueueWhyLocked(size_t index) const {
  const auto why = queue_waits_.find(queue_.jobs()[index].spec.name());
  return why == queue_waits_.end() ? absl::string_view() : why->second;
}

uint32_t Coordinator::GiveWorkersLocked(JobRun& run, uint32_t want, Effects* fx) {
  // Never past its owner's quota.
  want = std::min(want, QuotaLeftLocked(run.owner()));
  std::vector<WorkerRecord*> given;
  // Those holding this job's state first (no preparing), then the rest.
  const std::vector<const WorkerRecord*> pool = PoolLocked();
  for (int pass = 0; pass < 2 && given.size() < want; ++pass) {
    for (const WorkerRecord* w : pool) {
      if (given.size() == want) break;
      if (!CanGive(*w, run.spec())) continue;
      // Let go for a queued job: kept for it.
      if (!w->promised_to.empty() && w->promised_to != run.id() &&
          queue_.Find(w->promised_to) != nullptr) {
        continue;
      }
      if (w->prepare_failed && w->prepare_asked == run.PrepareKey()) continue;
      const bool holds_it = w->held.has_value() && run.IsOwnState(*w->held);
      if (holds_it != (pass == 0)) continue;
      given.push_back(registry_.Find(w->id));
    }
  }
  for (WorkerRecord* w : given) GiveWorkerLocked(run, w, fx);
  if (!given.empty()) MaybeFormGenerationLocked(run, fx);
  return static_cast<uint32_t>(given.size());
}

void Coordinator::GiveWorkerLocked(JobRun& run, WorkerRecord* w, Effects* fx) {
  registry_.Reserve(w, run.id());
  MaybePrepareLocked(run, w, fx);
  dirty_ = true;
}

void Coordinator::RecordEndedLocked() {
  for (const auto& run : runs_) {
    if (run->recorded() || !run->progress().ended()) continue;
    history_.Record(run->Record(), run->start_sequence());
    run->set_recorded();
  }
}

void Coordinator::PruneEndedLocked() {
  RecordEndedLocked();
  size_t ended = 0;
  for (const auto& run : runs_) ended += run->active() ? 0 : 1;
  for (auto it = runs_.begin(); ended > kKeptEndedJobs && it != runs_.end();) {
    if ((*it)->active()) {
      ++it;
      continue;
    }
    latest_generation_ = std::max(latest_generation_, (*it)->generations().latest());
    it = runs_.erase(it);
    --ended;
  }
}

}  // namespace ddp
