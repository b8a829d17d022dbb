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
//   - a queued job that outranks running jobs takes workers from them, down
//     to their min_workers, when that is enough for it to start: the lowest
//     priority gives first, its joiners still preparing at once and its
//     highest ranks by a leave vote at the next step boundary (nothing is
//     lost: CHANGE_CAUSE_SHRUNK), never more often than the giver's
//     reformMinIntervalSeconds (whole-job preemption is not built yet);
//   - then running jobs grow toward max_workers, but only while no queued
//     job that could ever fit waits for the workers: higher priority
//     first; among equal priorities each free worker goes to the job whose
//     measured samples/s gains most from it (JobProgress::throughput,
//     ThroughputModel), ties in start order;
//   - a worker holding a job's state goes to that job before others;
//   - an owner's jobs together never hold more workers than its quota (the
//     tokens file's max_workers): a queued job over it waits, saying so,
//     and the jobs behind it may start first.
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
  uint32_t n = 0;
  for (const WorkerRecord* w : registry_.All()) n += !w->lost() && w->job == run.id() ? 1 : 0;
  return n;
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
  // Then queued jobs that fit, each taking its workers as it starts.
  while (StartQueuedLocked(fx)) {
  }
  // Then growth toward max_workers, unless a queued job waits for workers:
  // the higher priority first, and jobs of one priority as GrowLocked says.
  if (queue_head_needs_workers_) return;
  const std::vector<JobRun*> running = RunningByPriorityLocked();
  for (auto first = running.begin(); first != running.end();) {
    auto end = std::find_if(first, running.end(), [first](const JobRun* run) {
      return run->spec().priority() != (*first)->spec().priority();
    });
    GrowLocked(std::vector<JobRun*>(first, end), fx);
    first = end;
  }
}

void Coordinator::GrowLocked(std::vector<JobRun*> jobs, Effects* fx) {
  std::map<const JobRun*, uint32_t> held;
  for (const JobRun* run : jobs) held[run] = HeldCountLocked(*run);
  auto full = [&held](const JobRun* run) { return held[run] >= run->spec().max_workers(); };
  jobs.erase(std::remove_if(jobs.begin(), jobs.end(), full), jobs.end());
  // One job left: all it can take at once. Of several, one worker at a
  // time to the job whose measured samples/s gains most from it (Pollux's
  // goodput idea; an unmeasured job gains 1, so ties go in start order).
  while (!jobs.empty()) {
    auto best = jobs.begin();
    if (jobs.size() > 1) {
      best = std::max_element(jobs.begin(), jobs.end(), [&held](const JobRun* a, const JobRun* b) {
        return MarginalGain(a->progress().throughput(), held[a]) <
               MarginalGain(b->progress().throughput(), held[b]);
      });
    }
    JobRun& run = **best;
    const uint32_t want = jobs.size() == 1 ? run.spec().max_workers() - held[&run] : 1;
    const uint32_t given = GiveWorkersLocked(run, want, fx);
    held[&run] += given;
    if (given < want || full(&run)) jobs.erase(best);  // full, or nothing fits it
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
  return static_cast<uint32_t>(given.size());
}

bool Coordinator::StartQueuedLocked(Effects* fx) {
  queue_waits_.clear();
  queue_head_needs_workers_ = false;
  const QueuedJob* first = nullptr;
  for (const QueuedJob& job : queue_.jobs()) {
    std::string over = OverQuotaLocked(job.spec, job.owner);
    if (over.empty()) {
      first = &job;
      break;
    }
    queue_waits_[job.spec.name()] = std::move(over);
  }
  if (first == nullptr) return false;
  const QueuedJob& head = *first;
  const v1::JobSpec& spec = head.spec;
  std::string& head_waits = queue_waits_[spec.name()];
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
        head_waits = absl::StrCat(
            "waiting for workers: it needs ", spec.min_workers(), " that fit it and only ",
            fit_at_all, " attached worker(s) do",
            selector.empty() ? "" : absl::StrCat(" (labels ", FormatLabels(selector), ")"), "; ",
            running);
        return false;
      }
      queue_head_needs_workers_ = true;
      head_waits = absl::StrCat("waiting for ", spec.min_workers(), " free worker(s) that fit it (",
                                free, " free now; ", running, ")");
      if (const std::string shrinking = ShrinkForLocked(head, free, fx); !shrinking.empty()) {
        head_waits = shrinking;
      }
      return false;
    }
  }
  queue_waits_.erase(spec.name());
  std::optional<QueuedJob> next = queue_.Take(spec.name());
  DDP_LOG(Info) << "job " << next->spec.name() << " leaves the queue"
                << (AnyActiveLocked() ? ": enough free workers fit it" : ": no job runs");
  if (absl::Status s = StartJobLocked(next->spec, next->owner, fx, &*next); !s.ok()) {
    DDP_LOG(Error) << "job " << next->spec.name() << " could not start, and is dropped: " << s;
    dirty_ = true;
    PersistLocked(fx);
  }
  return true;
}

std::string Coordinator::ShrinkForLocked(const QueuedJob& head, uint32_t free, Effects* fx) {
  const v1::JobSpec& spec = head.spec;
  // Workers already given up for it, still leaving their generation.
  uint32_t leaving = 0;
  for (const WorkerRecord* w : registry_.All()) {
    if (!w->lost() && w->job.empty() && !IsFree(*w) && Fits(*w, spec)) ++leaving;
  }
  const std::string wanted =
      absl::StrCat(spec.min_workers(), " worker(s) that fit it (", free, " free");
  if (free + leaving >= spec.min_workers()) {
    return absl::StrCat("waiting for ", wanted, ", ", leaving,
                        " leaving lower-priority jobs at a step boundary)");
  }
  // What each lower-priority running job can give without going below its
  // min_workers: the workers it holds outside its generation (joiners still
  // preparing) at once, its highest ranks by a leave vote. The lowest
  // priority gives first, and of equal priorities the last to start.
  struct Giver {
    JobRun* run;
    std::vector<WorkerRecord*> idle, members;
    bool rate_limited;
    // Every worker it holds that fits the head, and whether it may be
    // preempted whole (it checkpoints, and no library program trains in it).
    uint32_t fitting;
    bool preemptable;
  };
  std::vector<Giver> givers;
  uint32_t can_give = 0;
  const absl::Time now = clock_->Now();
  for (const auto& owned : runs_) {
    JobRun& run = *owned;
    const Generation* g = run.generations().current();
    if (!run.active() || run.spec().priority() >= spec.priority() || g == nullptr ||
        run.lifecycle().admitting() || run.lifecycle().adopting()) {
      continue;
    }
    Giver giver{&run, {}, {}, false, 0, !run.spec().checkpoint().dir().empty()};
    for (const WorkerRecord* w : registry_.All()) {
      if (w->job != run.id() || w->lost()) continue;
      if (w->capabilities.program()) giver.preemptable = false;
      if (!Fits(*w, spec)) continue;
      ++giver.fitting;
      if (IsFree(*w) && g->RankOf(w->id) < 0) giver.idle.push_back(registry_.Find(w->id));
    }
    const size_t spare =
        g->members.size() - std::min<size_t>(g->members.size(), run.spec().min_workers());
    for (auto m = g->members.rbegin(); m != g->members.rend() && giver.members.size() < spare;
         ++m) {
      WorkerRecord* w = registry_.Find(m->worker_id);
      if (w != nullptr && !w->lost() && Fits(*w, spec)) giver.members.push_back(w);
    }
    FormationInput timing;
    run.lifecycle().FillFormationInput(&timing);
    giver.rate_limited =
        now < timing.last_formed_at + absl::Seconds(run.spec().reform_min_interval_seconds());
    giver.preemptable = giver.preemptable && !giver.rate_limited;
    can_give += static_cast<uint32_t>(giver.idle.size() + giver.members.size());
    givers.push_back(std::move(giver));
  }
  std::stable_sort(givers.begin(), givers.end(), [](const Giver& a, const Giver& b) {
    if (a.run->spec().priority() != b.run->spec().priority()) {
      return a.run->spec().priority() < b.run->spec().priority();
    }
    return a.run->start_sequence() > b.run->start_sequence();
  });
  // Shrinking not enough: whole jobs that checkpoint go back to the queue,
  // the lowest priority (then the last started) first, while that lets the
  // head start; else nobody is disturbed.
  uint32_t reachable = free + leaving + can_give;
  std::vector<Giver*> victims;
  for (Giver& giver : givers) {
    if (reachable >= spec.min_workers()) break;
    if (!giver.preemptable) continue;
    victims.push_back(&giver);
    reachable += giver.fitting - static_cast<uint32_t>(giver.idle.size() + giver.members.size());
  }
  if (reachable < spec.min_workers()) return "";  // shrinking and preempting would not do
  uint32_t coming = free + leaving;
  for (Giver* victim : victims) {
    PreemptLocked(*victim->run, head, fx);
    coming += victim->fitting;
  }
  uint32_t still = spec.min_workers() - std::min(spec.min_workers(), coming);
  std::string waits_for;
  for (Giver& giver : givers) {
    if (giver.run->preempting()) continue;
    for (WorkerRecord* w : giver.idle) {
      if (still == 0) break;
      registry_.Release(w);
      --still;
    }
    if (still == 0) break;
    if (giver.members.empty()) continue;
    if (giver.rate_limited) {
      // reformMinIntervalSeconds: no job is re-formed more often, for
      // anyone; it gives its workers once that has passed.
      absl::StrAppend(&waits_for, waits_for.empty() ? "" : ", ", Quote(giver.run->id()));
      continue;
    }
    std::vector<std::string> giving;
    for (WorkerRecord* w : giver.members) {
      if (giving.size() == still) break;
      registry_.Release(w);
      giving.push_back(w->id);
    }
    still -= static_cast<uint32_t>(giving.size());
    const Generation& g = *giver.run->generations().current();
    const std::string why =
        absl::StrCat("giving ", giving.size(), " worker(s) to job ", Quote(spec.name()),
                     " (priority ", spec.priority(), ") at the next step boundary");
    DDP_LOG(Info) << "job " << giver.run->id() << " (priority " << giver.run->spec().priority()
                  << "): " << why << " of generation " << g.number;
    giver.run->BeginLeaveVote(v1::CHANGE_CAUSE_SHRUNK, why, giving);
    for (const RankCandidate& m : g.members) {
      SendAbortLocked(m.worker_id, g.number, why, /*at_step_boundary=*/true, fx);
    }
  }
  dirty_ = true;
  if (!victims.empty()) {
    std::string names;
    for (const Giver* victim : victims) {
      absl::StrAppend(&names, names.empty() ? "" : ", ", Quote(victim->run->id()));
    }
    return absl::StrCat("waiting for ", wanted, "; preempting ", names,
                        " (checkpointed at the next step boundary, then queued again)",
                        still == 0 ? "" : " and shrinking lower-priority jobs", ")");
  }
  return absl::StrCat("waiting for ", wanted, "; lower-priority jobs give the rest",
                      waits_for.empty()
                          ? ""
                          : absl::StrCat(", ", waits_for, " once reformMinIntervalSeconds passed"),
                      ")");
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
