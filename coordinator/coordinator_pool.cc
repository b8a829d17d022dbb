// The Coordinator's pool side: which job each worker belongs to, and the
// jobs that share the pool. A worker belongs to at most one job at a time
// (WorkerRecord::job); only that job prepares it, forms generations with it
// and hears what it says. A job gets workers when it starts and while it
// wants more; they go back to the pool when it ends, and on to the next job
// without restarting.
//
// The rules (AllocateLocked, at every tick and whenever a worker or job
// changes), each round by priority, then start order:
//   - first, running jobs without a generation get what they need to form
//     one (up to min_workers);
//   - then a queued job starts once min_workers free workers fit it, all
//     at once (gang scheduling): the highest priority first, and no job
//     behind it jumps ahead; with no job running the head starts at once
//     and waits for workers as a lone job always has;
//   - then running jobs grow toward max_workers, but only while no queued
//     job that could ever fit waits for the workers;
//   - a worker holding a job's state goes to that job before others.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/labels.h"
#include "common/logging.h"
#include "common/quote.h"
#include "coordinator/coordinator.h"
#include "coordinator/worker_fit.h"

namespace ddp {
namespace {

// Whether the pool may give `w` to a job of `spec`: a program on the
// library goes only to the job it says it holds (if it says one).
bool Fits(const WorkerRecord& w, const v1::JobSpec& spec) {
  if (!CanRun(w, spec)) return false;
  if (w.capabilities.program() && w.held.has_value() && !w.held->job_id().empty()) {
    return w.held->job_id() == spec.name();
  }
  return true;
}

}  // namespace

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
  if (worker.job.empty()) return *no_job_;
  JobRun* run = FindRunLocked(worker.job);
  return run ? *run : *no_job_;
}

JobRun* Coordinator::RunOfGenerationLocked(uint64_t generation) {
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

void Coordinator::AllocateLocked(Effects* fx) {
  // The running jobs by priority, then start order.
  auto running = [this] {
    std::vector<JobRun*> runs;
    for (const auto& run : runs_) {
      if (run->active()) runs.push_back(run.get());
    }
    std::stable_sort(runs.begin(), runs.end(), [](const JobRun* a, const JobRun* b) {
      return a->spec().priority() > b->spec().priority();
    });
    return runs;
  };
  auto held = [this](const JobRun& run) {
    uint32_t n = 0;
    for (const WorkerRecord* w : registry_.All()) n += !w->lost() && w->job == run.id() ? 1 : 0;
    return n;
  };
  // First what running jobs need to train at all: a job without a
  // generation, up to min_workers.
  for (JobRun* run : running()) {
    const uint32_t has = held(*run);
    if (run->generations().current() == nullptr && has < run->spec().min_workers()) {
      GiveWorkersLocked(*run, run->spec().min_workers() - has, fx);
    }
  }
  // Then queued jobs that fit, each taking its workers as it starts.
  while (StartQueuedLocked(fx)) {
  }
  // Then growth toward max_workers, unless a queued job waits for workers.
  if (queue_head_needs_workers_) return;
  for (JobRun* run : running()) {
    const uint32_t has = held(*run);
    if (has < run->spec().max_workers()) {
      GiveWorkersLocked(*run, run->spec().max_workers() - has, fx);
    }
  }
}

void Coordinator::GiveWorkersLocked(JobRun& run, uint32_t want, Effects* fx) {
  std::vector<WorkerRecord*> given;
  // Those holding this job's state first (no preparing), then the rest.
  for (int pass = 0; pass < 2 && given.size() < want; ++pass) {
    for (const WorkerRecord* w : registry_.All()) {
      if (given.size() == want) break;
      if (!InPoolLocked(*w) || !Fits(*w, run.spec())) continue;
      if (w->prepare_failed && w->prepare_asked == run.PrepareKey()) continue;
      const bool holds_it = w->held.has_value() && run.IsOwnState(*w->held);
      if (holds_it != (pass == 0)) continue;
      given.push_back(registry_.Find(w->id));
    }
  }
  for (WorkerRecord* w : given) {
    registry_.Reserve(w, run.id());
    MaybePrepareLocked(run, w, fx);
    dirty_ = true;
  }
  if (!given.empty()) MaybeFormGenerationLocked(run, fx);
}

bool Coordinator::StartQueuedLocked(Effects* fx) {
  queue_head_waits_.clear();
  queue_head_needs_workers_ = false;
  if (queue_.empty()) return false;
  const QueuedJob& head = queue_.jobs().front();
  const v1::JobSpec& spec = head.spec;
  if (AnyActiveLocked()) {
    const std::string running = absl::StrCat("running: ", RunningJobsLocked());
    uint32_t free = 0, fit_at_all = 0;
    for (const WorkerRecord* w : registry_.All()) {
      if (w->lost() || !Fits(*w, spec)) continue;
      ++fit_at_all;
      if (InPoolLocked(*w)) ++free;
    }
    if (free < spec.min_workers()) {
      const Labels selector(spec.worker_selector().begin(), spec.worker_selector().end());
      if (fit_at_all < spec.min_workers()) {
        // Not enough workers fit it however the pool is shared: it must not
        // hold up the running jobs' growth, and its status says why.
        queue_head_waits_ = absl::StrCat(
            "waiting for workers: it needs ", spec.min_workers(), " that fit it and only ",
            fit_at_all, " attached worker(s) do",
            selector.empty() ? "" : absl::StrCat(" (labels ", FormatLabels(selector), ")"), "; ",
            running);
        return false;
      }
      queue_head_needs_workers_ = true;
      queue_head_waits_ =
          absl::StrCat("waiting for ", spec.min_workers(), " free worker(s) that fit it (", free,
                       " free now; ", running, ")");
      return false;
    }
  }
  std::optional<QueuedJob> next = queue_.PopNext();
  DDP_LOG(Info) << "job " << next->spec.name() << " leaves the queue"
                << (AnyActiveLocked() ? ": enough free workers fit it" : ": no job runs");
  if (absl::Status s = StartJobLocked(next->spec, next->owner, fx); !s.ok()) {
    DDP_LOG(Error) << "job " << next->spec.name() << " could not start, and is dropped: " << s;
    dirty_ = true;
    PersistLocked(fx);
  }
  return true;
}

void Coordinator::PruneEndedLocked() {
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
