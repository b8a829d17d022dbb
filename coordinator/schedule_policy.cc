#include "coordinator/schedule_policy.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/labels.h"
#include "coordinator/schedule_planner.h"

namespace ddp {
namespace schedule_internal {
namespace {

Traits TraitsOf(SchedulingPolicy policy) {
  Traits t;
  switch (policy) {
    case SchedulingPolicy::kFifoGang:
      t.head_blocks = true;
      break;
    case SchedulingPolicy::kPriorityPreempt:
      t.by_priority = t.preempt = t.head_blocks = true;
      break;
    case SchedulingPolicy::kElastic:
      t.start_at_min = t.by_priority = t.shrink = t.preempt = t.grow = true;
      break;
  }
  return t;
}

bool Fits(const SchedWorker& w, const SchedJob& job) {
  return (job.device_kind.empty() || w.device_kind == job.device_kind) &&
         LabelsMatch(w.labels, job.selector) && w.cannot_run.count(job.id) == 0;
}

// "4 cuda workers with labels zone=a,rack=3" ("4 workers" of any kind).
std::string Kind(const SchedJob& job, uint32_t n) {
  std::string s = absl::StrCat(n, job.device_kind.empty() ? "" : " ", job.device_kind,
                               n == 1 ? " worker" : " workers");
  if (!job.selector.empty()) {
    absl::StrAppend(&s, " with labels ", FormatLabels(job.selector));
  }
  return s;
}

}  // namespace

std::string Workers(size_t n) { return absl::StrCat(n, n == 1 ? " worker" : " workers"); }

// What growing or shrinking from `from` to `to` workers is expected to do.
std::string GainNote(const ThroughputModel& model, uint32_t from, uint32_t to) {
  const double before = model.Expected(from);
  if (before <= 0) return "not measured yet, so tried larger";
  return absl::StrFormat("expected %+.0f%% samples/s", 100 * (model.Expected(to) / before - 1));
}

Planner::Planner(const ScheduleInput& in)
    : in_(in), traits_(TraitsOf(in.policy)), alone_(in.jobs.size() == 1) {
  std::map<std::string, int> index;
  for (const SchedJob& job : in.jobs) {
    index.emplace(job.id, static_cast<int>(jobs_.size()));
    Entry& e = jobs_.emplace_back();
    e.job = &job;
    e.plan.job_id = job.id;
    models_.emplace_back(job.throughput);
  }
  for (const SchedWorker& w : in.workers) {
    Slot s;
    s.worker = &w;
    s.free = w.job_id.empty();
    if (!s.free) {
      auto it = index.find(w.job_id);
      s.job = it == index.end() ? kElsewhere : it->second;
      if (s.job >= 0) {
        jobs_[s.job].running = true;
        ++jobs_[s.job].size;
      }
    }
    slots_.push_back(s);
  }
  for (Slot& s : slots_) {
    auto it = index.find(s.worker->reserved_for);
    if (it != index.end() && !jobs_[it->second].running &&
        Fits(*s.worker, *jobs_[it->second].job)) {
      s.promised = it->second;
    }
  }
  for (const Entry& e : jobs_) load_[e.job->owner] += e.size;
}

std::vector<JobPlan> Planner::Decide() {
  for (Entry& e : jobs_) {
    if (e.job->reallocating) e.plan.why = "a change of its allocation is under way";
  }
  ScheduleQueue();
  if (traits_.grow) Grow();
  std::vector<JobPlan> plans;
  for (Entry& e : jobs_) {
    std::sort(e.added.begin(), e.added.end());
    std::sort(e.removed.begin(), e.removed.end());
    for (int w : e.added) e.plan.added.push_back(slots_[w].worker->id);
    for (int w : e.removed) e.plan.removed.push_back(slots_[w].worker->id);
  }
  for (const Slot& s : slots_) {
    if (s.job >= 0) jobs_[s.job].plan.workers.push_back(s.worker->id);
  }
  for (Entry& e : jobs_) plans.push_back(std::move(e.plan));
  return plans;
}

void Planner::ScheduleQueue() {
  std::vector<int> order;
  for (int j = 0; j < static_cast<int>(jobs_.size()); ++j) {
    if (!jobs_[j].running && !jobs_[j].job->reallocating) order.push_back(j);
  }
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    const SchedJob& x = *jobs_[a].job;
    const SchedJob& y = *jobs_[b].job;
    if (traits_.by_priority && x.priority != y.priority) return x.priority > y.priority;
    return x.sequence < y.sequence;
  });
  const SchedJob* head = nullptr;
  for (int j : order) {
    std::string& why = jobs_[j].plan.why;
    why = CannotStart(j);
    if (!why.empty()) continue;  // it would wait whatever: it holds nobody back
    if (head != nullptr) {
      why =
          absl::StrCat("queued behind job ", head->id,
                       traits_.by_priority ? absl::StrCat(" (priority ", head->priority, ")") : "",
                       ", which is ahead of it and waits to start");
      continue;
    }
    if (!Admit(j) && traits_.head_blocks) head = jobs_[j].job;
  }
}

std::string Planner::CannotStart(int j) {
  const SchedJob& job = *jobs_[j].job;
  const uint32_t need = Need(job);
  const auto eligible = std::count_if(slots_.begin(), slots_.end(),
                                      [&](const Slot& s) { return Fits(*s.worker, job); });
  if (static_cast<uint32_t>(eligible) < need) {
    return absl::StrCat("can't start on the pool as it is: it needs ", Kind(job, need), " (",
                        NeedName(), ") and the pool has ", eligible, " such of ",
                        Workers(slots_.size()), "; attach workers that match or lower ",
                        NeedName());
  }
  auto quota = in_.owner_quota.find(job.owner);
  if (quota == in_.owner_quota.end()) return "";
  if (quota->second < need) {
    return absl::StrCat("can't start while owner ", job.owner, "'s quota (", Workers(quota->second),
                        ") is below the ", need, " it needs (", NeedName(), ")");
  }
  if (!QuotaAllows(job, need)) {
    return absl::StrCat("waits for owner ", job.owner, "'s quota: its jobs may hold ",
                        Workers(quota->second), ", they hold ", load_.at(job.owner),
                        " and this one needs ", need);
  }
  return "";
}

bool Planner::QuotaAllows(const SchedJob& job, uint32_t more) const {
  auto quota = in_.owner_quota.find(job.owner);
  return quota == in_.owner_quota.end() || load_.at(job.owner) + more <= quota->second;
}

bool Planner::Admit(int j) {
  const uint32_t need = Need(*jobs_[j].job);
  std::vector<int> promised = Promised(j);
  const bool releasing =
      std::any_of(promised.begin(), promised.end(), [&](int w) { return !slots_[w].free; });
  // While workers taken for it are still on their way, it takes nothing
  // more: each release is asked for once.
  if (!releasing) {
    std::vector<int> usable = promised;
    for (int w = 0; w < Count(); ++w) {
      if (slots_[w].promised != j && FreeFor(w, j)) usable.push_back(w);
    }
    if (usable.size() >= need) {
      // Alone on the pool it takes all it can use (its quota allowing):
      // nobody else could.
      size_t take = need;
      if (alone_ && traits_.grow) {
        take = std::min<size_t>(usable.size(), jobs_[j].job->max_workers);
        while (take > need && !QuotaAllows(*jobs_[j].job, static_cast<uint32_t>(take))) --take;
      }
      std::sort(usable.begin(), usable.end());
      usable.resize(take);
      Start(j, usable);
      return true;
    }
    if (!Take(j, need - static_cast<uint32_t>(usable.size()))) {
      Hold(j);
      jobs_[j].plan.why = BlockedWhy(j, usable.size());
      return false;
    }
  }
  Hold(j);
  load_[jobs_[j].job->owner] += need;
  jobs_[j].plan.why = ReleaseWhy(j);
  return false;
}

// The order: jobs of lower priority give first, and shrinking (a pause of
// the job, which goes on) before any preemption (a checkpoint, and no
// progress until it starts again); so equal-priority jobs give their workers
// above min_workers before a lower-priority job is preempted whole. Jobs of
// j's own priority are never preempted for it, nor taken below min_workers:
// what they give is what they grew into, which gains them least and gains
// j, at no workers, most.
bool Planner::Take(int j, uint32_t more) {
  if (!traits_.shrink && !traits_.preempt) return false;
  const std::vector<int> lower = Victims(j, true);
  const std::vector<int> peers = traits_.shrink ? Peers(j, true) : std::vector<int>();
  uint32_t shrinkable = 0;
  for (int x : lower) shrinkable += Shrinkable(x, j);
  for (int x : peers) shrinkable += Shrinkable(x, j);
  // Whole jobs go only when shrinking can't free enough: lowest priority and
  // newest first, and only as many as needed.
  std::vector<int> victims;
  uint32_t freed = 0;
  if (shrinkable < more) {
    if (!traits_.preempt) return false;
    for (int x : lower) {
      if (freed + shrinkable >= more) break;
      if (!jobs_[x].job->preemptible) continue;
      victims.push_back(x);
      freed += FittingOf(x, j);
      shrinkable -= Shrinkable(x, j);
    }
    if (freed + shrinkable < more) return false;
  }
  for (int x : victims) Preempt(x, j);
  uint32_t left = more - std::min(more, freed);
  for (int x : lower) {
    if (left == 0) break;
    const uint32_t n = std::min(left, Shrinkable(x, j));
    if (n > 0 && jobs_[x].plan.action == JobAction::kKeep) {
      Shrink(x, j, n);
      left -= n;
    }
  }
  if (left > 0) ShrinkPeers(j, peers, left);
  return true;
}

// One worker at a time from the peer whose last worker gains least at its
// planned size (the smallest loss of goodput; ties: the newest job).
void Planner::ShrinkPeers(int j, const std::vector<int>& peers, uint32_t n) {
  std::map<int, uint32_t> give;
  for (; n > 0; --n) {
    int best = kNone;
    double best_loss = 0;
    for (int x : peers) {
      if (give[x] >= Shrinkable(x, j)) continue;
      const double loss = models_[x].Gain(jobs_[x].size - give[x] - 1);
      if (best == kNone || loss < best_loss ||
          (loss == best_loss && jobs_[x].job->sequence > jobs_[best].job->sequence)) {
        best = x;
        best_loss = loss;
      }
    }
    if (best == kNone) return;  // Take counted enough: not reached
    ++give[best];
  }
  for (const auto& [x, count] : give) {
    if (count == 0) continue;
    const uint32_t from = jobs_[x].size;
    Shrink(x, j, count);
    absl::StrAppend(&jobs_[x].plan.why, "; of the jobs of its priority it loses least (",
                    GainNote(models_[x], from, jobs_[x].size), ")");
  }
}

void Planner::Shrink(int x, int j, uint32_t n) {
  Entry& e = jobs_[x];
  const uint32_t from = e.size;
  // The highest ranks leave first.
  for (int w = Count() - 1; w >= 0 && n > 0; --w) {
    Slot& s = slots_[w];
    if (s.job != x || !Fits(*s.worker, *jobs_[j].job)) continue;
    s.job = kNone;
    s.promised = j;
    e.removed.push_back(w);
    --e.size;
    --n;
  }
  load_[e.job->owner] -= from - e.size;
  e.plan.action = JobAction::kShrink;
  e.plan.removed_for = jobs_[j].job->id;
  e.plan.why = absl::StrCat("shrinks from ", from, " to ", Workers(e.size), " for job ",
                            jobs_[j].job->id, " (priority ", jobs_[j].job->priority, ")");
}

void Planner::Preempt(int x, int j) {
  Entry& e = jobs_[x];
  const SchedJob& job = *jobs_[j].job;
  for (int w = 0; w < Count(); ++w) {
    Slot& s = slots_[w];
    if (s.job != x) continue;
    s.job = kNone;
    // Those that don't fit it go back to the pool.
    if (Fits(*s.worker, job)) s.promised = j;
    e.removed.push_back(w);
  }
  load_[e.job->owner] -= e.size;
  e.size = 0;
  e.plan.action = JobAction::kPreempt;
  e.plan.removed_for = job.id;
  e.plan.why =
      absl::StrCat("preempted for job ", job.id, " (priority ", job.priority, "), which needs ",
                   Kind(job, Need(job)),
                   traits_.shrink ? " and shrinking jobs to their min_workers was not enough" : "");
}

void Planner::Start(int j, const std::vector<int>& workers) {
  Entry& e = jobs_[j];
  for (int w : workers) slots_[w].job = j;
  e.added = workers;
  e.size = static_cast<uint32_t>(workers.size());
  load_[e.job->owner] += e.size;
  e.plan.action = JobAction::kStart;
  e.plan.why = absl::StrCat(
      "starts on ", Workers(e.size), " (",
      e.size > Need(*e.job) ? "alone on the pool: up to max_workers" : NeedName(), ")");
}

void Planner::Hold(int j) {
  const uint32_t need = Need(*jobs_[j].job);
  uint32_t have = static_cast<uint32_t>(Promised(j).size());
  for (int w = 0; w < Count() && have < need; ++w) {
    if (slots_[w].promised != j && slots_[w].held == kNone && FreeFor(w, j)) {
      slots_[w].held = j;
      ++have;
    }
  }
}

bool Planner::FreeFor(int w, int j) const {
  const Slot& s = slots_[w];
  return s.free && s.job == kNone && (s.promised == kNone || s.promised == j) &&
         (s.held == kNone || s.held == j) && Fits(*s.worker, *jobs_[j].job);
}

uint32_t Planner::FittingOf(int x, int j) const {
  return static_cast<uint32_t>(std::count_if(slots_.begin(), slots_.end(), [&](const Slot& s) {
    return s.job == x && Fits(*s.worker, *jobs_[j].job);
  }));
}

uint32_t Planner::Shrinkable(int x, int j) const {
  const Entry& e = jobs_[x];
  if (!traits_.shrink || e.size <= e.job->min_workers) return 0;
  return std::min(FittingOf(x, j), e.size - e.job->min_workers);
}

// Running jobs of lower priority than `j`, with workers that fit it, that may
// change now (`settled`) or only once their reform interval has passed:
// lowest priority first, then newest.
std::vector<int> Planner::Victims(int j, bool settled) const {
  std::vector<int> out;
  for (int x = 0; x < static_cast<int>(jobs_.size()); ++x) {
    const Entry& e = jobs_[x];
    if (Movable(e) && Settled(*e.job) == settled && e.job->priority < jobs_[j].job->priority &&
        FittingOf(x, j) > 0) {
      out.push_back(x);
    }
  }
  std::sort(out.begin(), out.end(), [&](int a, int b) {
    const SchedJob& x = *jobs_[a].job;
    const SchedJob& y = *jobs_[b].job;
    if (x.priority != y.priority) return x.priority < y.priority;
    return x.sequence > y.sequence;
  });
  return out;
}

// Running jobs of j's priority that hold workers fitting it above their
// min_workers and may change now (`settled`) or only later.
std::vector<int> Planner::Peers(int j, bool settled) const {
  std::vector<int> out;
  for (int x = 0; x < static_cast<int>(jobs_.size()); ++x) {
    const Entry& e = jobs_[x];
    if (Movable(e) && Settled(*e.job) == settled && e.job->priority == jobs_[j].job->priority &&
        e.size > e.job->min_workers && FittingOf(x, j) > 0) {
      out.push_back(x);
    }
  }
  return out;
}

std::vector<int> Planner::Promised(int j) const {
  std::vector<int> out;
  for (int w = 0; w < Count(); ++w) {
    if (slots_[w].promised == j) out.push_back(w);
  }
  return out;
}

std::string Planner::ReleaseWhy(int j) const {
  std::vector<std::string> from;
  size_t busy = 0;
  for (int w : Promised(j)) {
    const SchedWorker& worker = *slots_[w].worker;
    if (slots_[w].free) continue;
    ++busy;
    if (std::find(from.begin(), from.end(), worker.job_id) == from.end()) {
      from.push_back(worker.job_id);
    }
  }
  return absl::StrCat("waiting for ", Workers(busy), " released by job",
                      from.size() == 1 ? " " : "s ", absl::StrJoin(from, ", "));
}

std::string Planner::BlockedWhy(int j, size_t free) const {
  const SchedJob& job = *jobs_[j].job;
  const uint32_t need = Need(job);
  // Free workers it fits that a higher job keeps: it is queued behind that.
  for (const Slot& s : slots_) {
    const int other = s.held != kNone ? s.held : s.promised;
    if (s.free && s.job == kNone && other != kNone && other != j && Fits(*s.worker, job)) {
      return absl::StrCat("queued behind job ", jobs_[other].job->id, " (priority ",
                          jobs_[other].job->priority, "), which waits for the same workers; ", free,
                          " of the ", Kind(job, need), " it needs are free for it");
    }
  }
  std::string why = absl::StrCat("the pool is full: it needs ", Kind(job, need), " (", NeedName(),
                                 ") and ", free, free == 1 ? " is" : " are", " free");
  if (!traits_.shrink && !traits_.preempt) return why;
  std::vector<int> later = Victims(j, false);
  for (int x : Peers(j, false)) later.push_back(x);
  if (later.empty()) {
    return absl::StrCat(why,
                        "; jobs of lower priority, and of its own above their min_workers, "
                        "can't give enough");
  }
  // The one whose interval ends first.
  auto ready_at = [&](int x) {
    return jobs_[x].job->allocated_at + jobs_[x].job->reform_min_interval;
  };
  const int first = *std::min_element(later.begin(), later.end(),
                                      [&](int a, int b) { return ready_at(a) < ready_at(b); });
  return absl::StrCat(why, absl::StrFormat("; job %s (priority %d) may give workers in %.1fs "
                                           "(reform_min_interval)",
                                           jobs_[first].job->id, jobs_[first].job->priority,
                                           absl::ToDoubleSeconds(ready_at(first) - in_.now)));
}

}  // namespace schedule_internal

std::vector<JobPlan> DecideSchedule(const ScheduleInput& in) {
  return schedule_internal::Planner(in).Decide();
}

}  // namespace ddp
