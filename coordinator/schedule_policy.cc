#include "coordinator/schedule_policy.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace ddp {
namespace {

// ---- Throughput model -------------------------------------------------------

// T(n) = t1 * n / (1 + a * (n - 1)).
struct ScalingModel {
  double t1 = 0;
  double a = 0;
};

double Shape(double n, double a) { return n / (1 + a * (n - 1)); }

// The measurements the model is fitted to (a world of 0 says nothing).
std::vector<std::pair<double, double>> Points(const std::map<uint32_t, double>& measured) {
  std::vector<std::pair<double, double>> points;
  for (const auto& [n, t] : measured) {
    if (n > 0) points.emplace_back(n, t);
  }
  return points;
}

// For a given `a`, the least-squares t1 has a closed form; returns it with
// the squared error it leaves.
std::pair<double, double> FitT1(const std::vector<std::pair<double, double>>& points, double a) {
  double tg = 0, gg = 0;
  for (const auto& [n, t] : points) {
    tg += t * Shape(n, a);
    gg += Shape(n, a) * Shape(n, a);
  }
  const double t1 = gg > 0 ? tg / gg : 0;
  double error = 0;
  for (const auto& [n, t] : points) error += (t - t1 * Shape(n, a)) * (t - t1 * Shape(n, a));
  return {t1, error};
}

// Least squares over a in [0, 1]: a coarse grid (the error need not be
// unimodal over the whole range), then a golden-section search around the
// best grid point. One measurement fits any a, so it gets a = 0.
ScalingModel FitScaling(const std::map<uint32_t, double>& measured) {
  const std::vector<std::pair<double, double>> points = Points(measured);
  if (points.size() <= 1) return {points.empty() ? 0 : FitT1(points, 0).first, 0};
  constexpr int kGrid = 20;
  auto error = [&](double a) { return FitT1(points, a).second; };
  int best = 0;
  for (int i = 1; i <= kGrid; ++i) {
    if (error(double(i) / kGrid) < error(double(best) / kGrid)) best = i;
  }
  double lo = std::max(0.0, double(best - 1) / kGrid);
  double hi = std::min(1.0, double(best + 1) / kGrid);
  const double r = 0.6180339887498949;
  for (int i = 0; i < 60; ++i) {
    const double x1 = hi - r * (hi - lo), x2 = lo + r * (hi - lo);
    if (error(x1) <= error(x2)) {
      hi = x2;
    } else {
      lo = x1;
    }
  }
  const double grid_a = double(best) / kGrid;
  const double a = error(grid_a) < error((lo + hi) / 2) ? grid_a : (lo + hi) / 2;
  return {FitT1(points, a).first, a};
}

double Expected(const std::map<uint32_t, double>& measured, const ScalingModel& model,
                uint32_t world_size) {
  if (world_size == 0) return 0;
  auto it = measured.find(world_size);
  if (it != measured.end()) return it->second;
  return model.t1 * Shape(world_size, model.a);
}

double Gain(const std::map<uint32_t, double>& measured, const ScalingModel& model,
            uint32_t world_size) {
  if (Points(measured).empty()) return 1;
  const double now = Expected(measured, model, world_size);
  const double next = Expected(measured, model, world_size + 1);
  if (now <= 0) return next > 0 ? 1 : 0;
  return next / now - 1;
}

// What growing from `from` to `to` workers is expected to bring.
std::string GainNote(const std::map<uint32_t, double>& measured, const ScalingModel& model,
                     uint32_t from, uint32_t to) {
  const double before = Expected(measured, model, from);
  if (before <= 0) return "not measured yet, so tried larger";
  return absl::StrFormat("expected %+.0f%% samples/s",
                         100 * (Expected(measured, model, to) / before - 1));
}

// ---- The plan ---------------------------------------------------------------

constexpr int kNone = -1;
// Held by a job the input does not list (one that just ended): not free,
// and nobody's to take.
constexpr int kElsewhere = -2;

// What each policy may do; one place says it (see SchedulingPolicy).
struct Traits {
  // A job starts on min_workers; else only on max_workers.
  bool start_at_min = false;
  // Queue order: priority, then sequence; else sequence alone.
  bool by_priority = false;
  bool shrink = false;
  bool preempt = false;
  // A queued job that can't start holds back every job behind it.
  bool head_blocks = false;
  bool grow = false;
};

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

std::string Workers(size_t n) { return absl::StrCat(n, n == 1 ? " worker" : " workers"); }

bool Fits(const SchedWorker& w, const SchedJob& job) {
  if (w.device_kind != job.device_kind) return false;
  for (const auto& [key, value] : job.selector) {
    auto it = w.labels.find(key);
    if (it == w.labels.end() || it->second != value) return false;
  }
  return true;
}

// "4 cuda workers with labels zone=a,rack=3".
std::string Kind(const SchedJob& job, uint32_t n) {
  std::string s = absl::StrCat(n, " ", job.device_kind, n == 1 ? " worker" : " workers");
  if (!job.selector.empty()) {
    absl::StrAppend(&s, " with labels ",
                    absl::StrJoin(job.selector, ",", absl::PairFormatter("=")));
  }
  return s;
}

struct Slot {
  const SchedWorker* worker = nullptr;
  // Let go by its job (or never had one): can be given now.
  bool free = false;
  // The job (index) it belongs to in the plan; kNone when nobody's.
  int job = kNone;
  // The queued job it is promised to; kNone when none (or the promise is
  // void: its job is gone, running, or doesn't fit it).
  int promised = kNone;
  // Kept free this round for a higher queued job that waits for it.
  int held = kNone;
};

struct Entry {
  const SchedJob* job = nullptr;
  // Held workers in the input.
  bool running = false;
  // Workers in the plan.
  uint32_t size = 0;
  JobPlan plan;
  std::vector<int> added, removed;
};

class Planner {
 public:
  explicit Planner(const ScheduleInput& in);
  std::vector<JobPlan> Decide();

 private:
  void ScheduleQueue();
  // Why queued job `j` can't start whatever the pool does; empty if it can.
  std::string CannotStart(int j);
  // Starts `j` or makes it wait; false when it did not start.
  bool Admit(int j);
  // Frees `more` workers fitting `j` from lower-priority jobs (shrinks, then
  // whole jobs), or disturbs nobody and returns false.
  bool Take(int j, uint32_t more);
  void Shrink(int x, int j, uint32_t n);
  void Preempt(int x, int j);
  void Start(int j, const std::vector<int>& workers);
  // Keeps free workers fitting `j` (up to its need) from later jobs.
  void Hold(int j);
  void Grow();
  void GrowClass(const std::vector<int>& jobs);

  uint32_t Need(const SchedJob& job) const {
    return std::max<uint32_t>(1, traits_.start_at_min ? job.min_workers : job.max_workers);
  }
  const char* NeedName() const { return traits_.start_at_min ? "min_workers" : "max_workers"; }
  bool Settled(const SchedJob& job) const {
    return in_.now >= job.allocated_at + job.reform_min_interval;
  }
  // Running, untouched so far in this plan and not reallocating.
  bool Movable(const Entry& e) const {
    return e.running && e.plan.action == JobAction::kKeep && !e.job->reallocating;
  }
  int Count() const { return static_cast<int>(slots_.size()); }
  bool FreeFor(int w, int j) const;
  uint32_t FittingOf(int x, int j) const;
  uint32_t Shrinkable(int x, int j) const;
  std::vector<int> Victims(int j, bool settled) const;
  std::vector<int> Promised(int j) const;
  std::string ReleaseWhy(int j) const;
  std::string BlockedWhy(int j, size_t free) const;
  bool QuotaAllows(const SchedJob& job, uint32_t more) const;

  const ScheduleInput& in_;
  const Traits traits_;
  std::vector<Slot> slots_;
  std::vector<Entry> jobs_;
  // Workers each owner's jobs hold in the plan (with what waiting jobs will
  // start on).
  std::map<std::string, uint32_t> load_;
};

Planner::Planner(const ScheduleInput& in) : in_(in), traits_(TraitsOf(in.policy)) {
  std::map<std::string, int> index;
  for (const SchedJob& job : in.jobs) {
    index.emplace(job.id, static_cast<int>(jobs_.size()));
    Entry& e = jobs_.emplace_back();
    e.job = &job;
    e.plan.job_id = job.id;
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
    return absl::StrCat("can never start: it needs ", Kind(job, need), " (", NeedName(),
                        ") and the pool has ", eligible, " such of ", Workers(slots_.size()),
                        "; attach workers that match or lower ", NeedName());
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
      usable.resize(need);
      std::sort(usable.begin(), usable.end());
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

bool Planner::Take(int j, uint32_t more) {
  if (!traits_.shrink && !traits_.preempt) return false;
  const std::vector<int> candidates = Victims(j, true);
  uint32_t shrinkable = 0;
  for (int x : candidates) shrinkable += Shrinkable(x, j);
  // Whole jobs go only when shrinking can't free enough: lowest priority and
  // newest first, and only as many as needed.
  std::vector<int> victims;
  uint32_t freed = 0;
  if (shrinkable < more) {
    if (!traits_.preempt) return false;
    for (int x : candidates) {
      if (freed + shrinkable >= more) break;
      victims.push_back(x);
      freed += FittingOf(x, j);
      shrinkable -= Shrinkable(x, j);
    }
    if (freed + shrinkable < more) return false;
  }
  for (int x : victims) Preempt(x, j);
  uint32_t left = more - std::min(more, freed);
  for (int x : candidates) {
    if (left == 0) break;
    const uint32_t n = std::min(left, Shrinkable(x, j));
    if (n > 0 && jobs_[x].plan.action == JobAction::kKeep) {
      Shrink(x, j, n);
      left -= n;
    }
  }
  return true;
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
                   traits_.shrink ? " and shrinking lower-priority jobs was not enough" : "");
}

void Planner::Start(int j, const std::vector<int>& workers) {
  Entry& e = jobs_[j];
  for (int w : workers) slots_[w].job = j;
  e.added = workers;
  e.size = static_cast<uint32_t>(workers.size());
  load_[e.job->owner] += e.size;
  e.plan.action = JobAction::kStart;
  e.plan.why = absl::StrCat("starts on ", Workers(e.size), " (", NeedName(), ")");
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
  const std::vector<int> later = Victims(j, false);
  if (later.empty()) {
    return absl::StrCat(why, "; lower-priority jobs can't give enough");
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

void Planner::Grow() {
  std::vector<int> growers;
  for (int x = 0; x < static_cast<int>(jobs_.size()); ++x) {
    const Entry& e = jobs_[x];
    if (Movable(e) && Settled(*e.job) && e.size < e.job->max_workers) {
      growers.push_back(x);
    }
  }
  std::stable_sort(growers.begin(), growers.end(),
                   [&](int a, int b) { return jobs_[a].job->priority > jobs_[b].job->priority; });
  for (size_t begin = 0; begin < growers.size();) {
    size_t end = begin;
    while (end < growers.size() &&
           jobs_[growers[end]].job->priority == jobs_[growers[begin]].job->priority) {
      ++end;
    }
    GrowClass({growers.begin() + begin, growers.begin() + end});
    begin = end;
  }
}

// Within one priority, one worker at a time to the job that gains most at
// its planned size (ties: the older job).
void Planner::GrowClass(const std::vector<int>& jobs) {
  struct Grower {
    int job;
    ScalingModel model;
    uint32_t from;
    // Workers before it are no use to it: free workers only get fewer here.
    int next = 0;
  };
  std::vector<Grower> growers;
  for (int x : jobs) growers.push_back({x, FitScaling(jobs_[x].job->throughput), jobs_[x].size});
  auto next_free = [&](Grower& g) {
    while (g.next < Count() && !FreeFor(g.next, g.job)) ++g.next;
    return g.next < Count();
  };
  for (;;) {
    Grower* best = nullptr;
    double best_gain = 0;
    for (Grower& g : growers) {
      const SchedJob& job = *jobs_[g.job].job;
      const uint32_t size = jobs_[g.job].size;
      if (size >= job.max_workers || !QuotaAllows(job, 1) || !next_free(g)) continue;
      const double gain = Gain(job.throughput, g.model, size);
      if (gain > 0 && (best == nullptr || gain > best_gain ||
                       (gain == best_gain && job.sequence < jobs_[best->job].job->sequence))) {
        best = &g;
        best_gain = gain;
      }
    }
    if (best == nullptr) break;
    Entry& e = jobs_[best->job];
    slots_[best->next].job = best->job;
    e.added.push_back(best->next);
    ++e.size;
    ++load_[e.job->owner];
  }
  for (const Grower& g : growers) {
    Entry& e = jobs_[g.job];
    if (e.added.empty()) continue;
    e.plan.action = JobAction::kGrow;
    e.plan.why = absl::StrCat("grows from ", g.from, " to ", Workers(e.size), " on free workers (",
                              GainNote(e.job->throughput, g.model, g.from, e.size), ")");
  }
}

}  // namespace

double ExpectedThroughput(const std::map<uint32_t, double>& measured, uint32_t world_size) {
  return Expected(measured, FitScaling(measured), world_size);
}

double MarginalGain(const std::map<uint32_t, double>& measured, uint32_t world_size) {
  return Gain(measured, FitScaling(measured), world_size);
}

std::vector<JobPlan> DecideSchedule(const ScheduleInput& in) { return Planner(in).Decide(); }

}  // namespace ddp
