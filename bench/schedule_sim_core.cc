#include "bench/schedule_sim_core.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ddp {

double TrueThroughput(const TraceJob& job, uint32_t n) {
  if (n == 0) return 0;
  return job.t1 * n / (1 + job.a * (n - 1));
}

absl::StatusOr<SchedulingPolicy> ParsePolicyName(const std::string& name) {
  if (name == "fifo-gang") return SchedulingPolicy::kFifoGang;
  if (name == "priority-preempt") return SchedulingPolicy::kPriorityPreempt;
  if (name == "elastic") return SchedulingPolicy::kElastic;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown policy \"", name, "\": fifo-gang, priority-preempt or elastic"));
}

const char* PolicyName(SchedulingPolicy policy) {
  switch (policy) {
    case SchedulingPolicy::kFifoGang:
      return "fifo-gang";
    case SchedulingPolicy::kPriorityPreempt:
      return "priority-preempt";
    case SchedulingPolicy::kElastic:
      return "elastic";
  }
  return "?";
}

namespace {

// The trace's time 0.
const absl::Time kStart = absl::UnixEpoch();

enum class Phase { kNotArrived, kQueued, kRunning, kDone };

struct JobState {
  const TraceJob* spec = nullptr;
  uint64_t sequence = 0;
  Phase phase = Phase::kNotArrived;
  // Worker indices, ascending (the pool's order, so a job's members are in
  // rank order and the highest ranks are released first).
  std::vector<int> held;
  // A shrink or preemption under way: let go when the pause ends.
  std::vector<int> leaving;
  bool preempting = false;
  bool paused = false;
  absl::Time pause_until;
  absl::Time allocated_at = absl::InfinitePast();
  bool checkpointed = false;
  bool started = false;
  double done = 0;
  // Valid while it trains: when it completes at its current rate.
  absl::Time finish_at = absl::InfiniteFuture();
  std::map<uint32_t, double> measured;
  absl::Time queued_since;
  std::string last_why;
  // The segment open since seg_from.
  bool seg_open = false;
  absl::Time seg_from;
  std::vector<int> seg_workers;
  double seg_rate = 0;
  JobOutcome out;

  bool Training() const { return phase == Phase::kRunning && !paused; }
  double Rate() const {
    return Training() ? TrueThroughput(*spec, static_cast<uint32_t>(held.size())) : 0;
  }
};

struct WorkerState {
  std::string id;
  int job = -1;
  int reserved_for = -1;
};

absl::Status CheckTrace(const Trace& trace) {
  if (trace.workers == 0) return absl::InvalidArgumentError("the pool has no workers");
  if (trace.jobs.empty()) return absl::InvalidArgumentError("the trace has no jobs");
  const SimCosts& c = trace.costs;
  if (c.reform_pause < absl::ZeroDuration() || c.checkpoint_pause < absl::ZeroDuration() ||
      c.restart_pause < absl::ZeroDuration() || c.reform_min_interval < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("a cost or interval is negative");
  }
  std::set<std::string> ids;
  for (const TraceJob& job : trace.jobs) {
    auto bad = [&](absl::string_view what) {
      return absl::InvalidArgumentError(absl::StrCat("job \"", job.id, "\": ", what));
    };
    if (job.id.empty()) return absl::InvalidArgumentError("a job without an id");
    if (!ids.insert(job.id).second) return bad("id given twice");
    if (job.min_workers < 1 || job.min_workers > job.max_workers) {
      return bad("needs 1 <= min_workers <= max_workers");
    }
    if (!(job.work > 0) || !(job.t1 > 0)) return bad("work and t1 must be positive");
    if (!(job.a >= 0 && job.a <= 1)) return bad("a must be in [0, 1]");
    if (job.submit < absl::ZeroDuration()) return bad("submitted before the trace starts");
  }
  return absl::OkStatus();
}

class Simulator {
 public:
  Simulator(const Trace& trace, SchedulingPolicy policy) : trace_(trace), policy_(policy) {
    for (uint32_t w = 0; w < trace.workers; ++w) {
      WorkerState worker;
      worker.id = absl::StrCat("w", w < 10 ? "0" : "", w);
      worker_index_[worker.id] = static_cast<int>(workers_.size());
      workers_.push_back(std::move(worker));
    }
    jobs_.resize(trace.jobs.size());
    for (size_t j = 0; j < trace.jobs.size(); ++j) {
      jobs_[j].spec = &trace.jobs[j];
      jobs_[j].out.id = trace.jobs[j].id;
      jobs_[j].out.submit = trace.jobs[j].submit;
      job_index_[trace.jobs[j].id] = static_cast<int>(j);
      arrivals_.push_back(static_cast<int>(j));
    }
    std::stable_sort(arrivals_.begin(), arrivals_.end(),
                     [&](int a, int b) { return trace.jobs[a].submit < trace.jobs[b].submit; });
    for (size_t k = 0; k < arrivals_.size(); ++k) jobs_[arrivals_[k]].sequence = k;
  }

  absl::StatusOr<SimResult> Run() {
    now_ = kStart + trace_.jobs[arrivals_.front()].submit;
    while (ended_ < jobs_.size()) {
      if (++events_ > trace_.max_events) {
        return absl::ResourceExhaustedError(absl::StrCat("more than ", trace_.max_events,
                                                         " events at t=", Seconds(now_), "s with ",
                                                         jobs_.size() - ended_, " jobs left"));
      }
      absl::Time next = NextEventTime();
      if (next == absl::InfiniteFuture()) return Stuck();
      Advance(next);
      HandleEvents();
      if (absl::Status s = Replan(); !s.ok()) return s;
    }
    SimResult result;
    result.policy = policy_;
    result.workers = trace_.workers;
    absl::Time last_end = now_;
    for (JobState& job : jobs_) {
      last_end = std::max(last_end, kStart + job.out.end);
      result.jobs.push_back(std::move(job.out));
    }
    result.makespan = last_end - (kStart + trace_.jobs[arrivals_.front()].submit);
    result.busy_worker_seconds = busy_;
    result.training_worker_seconds = training_;
    result.events = events_;
    result.decisions = decisions_;
    return result;
  }

 private:
  static double Seconds(absl::Time t) { return absl::ToDoubleSeconds(t - kStart); }

  absl::Time NextEventTime() {
    absl::Time next = absl::InfiniteFuture();
    if (next_arrival_ < arrivals_.size()) {
      next = kStart + trace_.jobs[arrivals_[next_arrival_]].submit;
    }
    for (JobState& job : jobs_) {
      if (job.phase == Phase::kRunning && job.paused) next = std::min(next, job.pause_until);
      if (job.Training()) {
        job.finish_at = now_ + absl::Seconds((job.spec->work - job.done) / job.Rate());
        next = std::min(next, job.finish_at);
      }
      if (job.phase == Phase::kQueued || job.phase == Phase::kRunning) {
        absl::Time allowed = job.allocated_at + trace_.costs.reform_min_interval;
        if (allowed > now_) next = std::min(next, allowed);
      }
    }
    return next;
  }

  void Advance(absl::Time to) {
    const double dt = absl::ToDoubleSeconds(to - now_);
    for (JobState& job : jobs_) {
      if (job.phase != Phase::kRunning) continue;
      busy_ += job.held.size() * dt;
      if (job.paused) {
        job.out.paused += to - now_;
      } else {
        training_ += job.held.size() * dt;
        job.done = std::min(job.spec->work, job.done + job.Rate() * dt);
      }
    }
    now_ = to;
  }

  void HandleEvents() {
    for (size_t j = 0; j < jobs_.size(); ++j) {
      JobState& job = jobs_[j];
      if (!job.Training() || job.finish_at > now_) continue;
      job.done = job.spec->work;
      job.phase = Phase::kDone;
      job.out.end = now_ - kStart;
      job.out.work_done = job.done;
      Release(job.held);
      job.held.clear();
      Reshape(job);
      for (WorkerState& w : workers_) {
        if (w.reserved_for == static_cast<int>(j)) w.reserved_for = -1;
      }
      ++ended_;
    }
    for (JobState& job : jobs_) {
      if (job.phase != Phase::kRunning || !job.paused || job.pause_until > now_) continue;
      job.paused = false;
      Release(job.leaving);
      std::vector<int> kept;
      std::set_difference(job.held.begin(), job.held.end(), job.leaving.begin(), job.leaving.end(),
                          std::back_inserter(kept));
      job.held = std::move(kept);
      job.leaving.clear();
      if (job.preempting) {
        job.preempting = false;
        job.phase = Phase::kQueued;
        job.checkpointed = true;
        job.queued_since = now_;
      } else {
        // Its first reports at the new size: what the policy learns from.
        const auto n = static_cast<uint32_t>(job.held.size());
        job.measured[n] = TrueThroughput(*job.spec, n);
      }
      Reshape(job);
    }
    while (next_arrival_ < arrivals_.size() &&
           kStart + trace_.jobs[arrivals_[next_arrival_]].submit <= now_) {
      JobState& job = jobs_[arrivals_[next_arrival_++]];
      job.phase = Phase::kQueued;
      job.queued_since = now_;
    }
  }

  void Release(const std::vector<int>& workers) {
    for (int w : workers) workers_[w].job = -1;
  }

  // Closes the job's open segment at now and opens the next one, after its
  // workers or its rate changed.
  void Reshape(JobState& job) {
    if (job.seg_open && job.seg_from < now_) {
      SimSegment seg;
      seg.from = job.seg_from - kStart;
      seg.to = now_ - kStart;
      for (int w : job.seg_workers) seg.workers.push_back(workers_[w].id);
      seg.rate = job.seg_rate;
      job.out.segments.push_back(std::move(seg));
    }
    job.seg_open = job.phase == Phase::kRunning && !job.held.empty();
    job.seg_from = now_;
    job.seg_workers = job.held;
    job.seg_rate = job.Rate();
  }

  absl::Status Replan() {
    ScheduleInput in;
    in.policy = policy_;
    in.now = now_;
    in.owner_quota = trace_.owner_quota;
    std::vector<int> index;
    for (int j : arrivals_) {
      const JobState& job = jobs_[j];
      if (job.phase != Phase::kQueued && job.phase != Phase::kRunning) continue;
      SchedJob s;
      s.id = job.spec->id;
      s.owner = job.spec->owner;
      s.priority = job.spec->priority;
      s.sequence = job.sequence;
      s.min_workers = job.spec->min_workers;
      s.max_workers = job.spec->max_workers;
      s.reform_min_interval = trace_.costs.reform_min_interval;
      s.allocated_at = job.allocated_at;
      s.reallocating = job.phase == Phase::kRunning && job.paused;
      s.throughput = job.measured;
      s.preemptible = job.spec->preemptible;
      in.jobs.push_back(std::move(s));
      index.push_back(j);
    }
    if (in.jobs.empty()) return absl::OkStatus();
    for (const WorkerState& w : workers_) {
      SchedWorker s;
      s.id = w.id;
      s.device_kind = "cpu";
      if (w.job >= 0) s.job_id = jobs_[w.job].spec->id;
      if (w.reserved_for >= 0) s.reserved_for = jobs_[w.reserved_for].spec->id;
      in.workers.push_back(std::move(s));
    }
    std::vector<JobPlan> plans = DecideSchedule(in);
    ++decisions_;
    if (plans.size() != in.jobs.size()) {
      return Broken("", absl::StrCat(plans.size(), " plans for ", in.jobs.size(), " jobs"));
    }
    std::set<int> claimed;
    for (size_t k = 0; k < plans.size(); ++k) {
      if (absl::Status s = Apply(plans[k], index[k], claimed); !s.ok()) return s;
    }
    return CheckQuotas();
  }

  absl::Status Broken(absl::string_view job, absl::string_view what) const {
    return absl::InternalError(absl::StrCat("policy ", PolicyName(policy_), " at t=", Seconds(now_),
                                            "s", job.empty() ? "" : ", job ", job, ": ", what));
  }

  // Worker ids to indices, ascending; false on an unknown or repeated id.
  bool Resolve(const std::vector<std::string>& ids, std::vector<int>* out) const {
    out->clear();
    for (const std::string& id : ids) {
      auto it = worker_index_.find(id);
      if (it == worker_index_.end()) return false;
      out->push_back(it->second);
    }
    std::sort(out->begin(), out->end());
    return std::adjacent_find(out->begin(), out->end()) == out->end();
  }

  absl::Status Apply(const JobPlan& plan, int j, std::set<int>& claimed) {
    JobState& job = jobs_[j];
    const TraceJob& spec = *job.spec;
    auto broken = [&](absl::string_view what) { return Broken(spec.id, what); };
    if (plan.job_id != spec.id) return broken(absl::StrCat("its plan names ", plan.job_id));
    job.last_why = plan.why;
    std::vector<int> workers, added, removed;
    if (!Resolve(plan.workers, &workers) || !Resolve(plan.added, &added) ||
        !Resolve(plan.removed, &removed)) {
      return broken("a plan names an unknown worker, or one twice");
    }
    const bool running = job.phase == Phase::kRunning;
    std::vector<int> final_workers = job.held;
    if (running) {
      std::vector<int> kept;
      std::set_difference(job.held.begin(), job.held.end(), job.leaving.begin(), job.leaving.end(),
                          std::back_inserter(kept));
      final_workers = kept;
    }
    if (plan.action == JobAction::kKeep) {
      // Mid-shrink or mid-preemption the leaving workers are still the job's
      // (SchedWorker::job_id), so a plan may list them or not.
      if (workers != final_workers && workers != job.held) {
        return broken("kept, but its plan lists other workers");
      }
      return absl::OkStatus();
    }
    if (plan.action == JobAction::kStart ? running : !running) {
      return broken(running ? "started while running" : "resized or preempted while queued");
    }
    if (running && job.paused) return broken("changed while reallocating");
    if (running && now_ - job.allocated_at < trace_.costs.reform_min_interval) {
      return broken("changed within reform_min_interval of its last change");
    }
    for (int w : added) {
      if (workers_[w].job >= 0 || !claimed.insert(w).second) {
        return broken(absl::StrCat("given ", workers_[w].id, ", which is not free"));
      }
    }
    for (int w : removed) {
      if (!std::binary_search(job.held.begin(), job.held.end(), w)) {
        return broken(absl::StrCat("gives up ", workers_[w].id, ", which it does not hold"));
      }
    }
    std::vector<int> expected;
    switch (plan.action) {
      case JobAction::kStart:
      case JobAction::kGrow:
        std::set_union(job.held.begin(), job.held.end(), added.begin(), added.end(),
                       std::back_inserter(expected));
        if (added.empty() || !removed.empty()) return broken("a start or grow adds nothing");
        break;
      case JobAction::kShrink:
      case JobAction::kPreempt:
        std::set_difference(job.held.begin(), job.held.end(), removed.begin(), removed.end(),
                            std::back_inserter(expected));
        if (removed.empty() || !added.empty())
          return broken("a shrink or preemption removes nothing");
        break;
      case JobAction::kKeep:
        break;
    }
    if (workers != expected) return broken("its plan's workers don't add up");
    const size_t n = expected.size();
    if (plan.action == JobAction::kPreempt ? n != 0
                                           : n < spec.min_workers || n > spec.max_workers) {
      return broken(absl::StrCat("left on ", n, " workers (min ", spec.min_workers, ", max ",
                                 spec.max_workers, ")"));
    }
    int reserve = -1;
    if (!plan.removed_for.empty()) {
      auto it = job_index_.find(plan.removed_for);
      if (it == job_index_.end() || jobs_[it->second].phase == Phase::kDone ||
          jobs_[it->second].phase == Phase::kNotArrived) {
        return broken(absl::StrCat("its workers are promised to ", plan.removed_for,
                                   ", which is not waiting"));
      }
      reserve = it->second;
    }

    job.allocated_at = now_;
    job.paused = true;
    switch (plan.action) {
      case JobAction::kStart:
        job.phase = Phase::kRunning;
        job.pause_until =
            now_ + (job.checkpointed ? trace_.costs.restart_pause : trace_.costs.reform_pause);
        job.out.queued += now_ - job.queued_since;
        if (!job.started) job.out.first_start = now_ - kStart;
        job.started = true;
        ++job.out.starts;
        // Workers promised to it that it did not take are free for anyone:
        // the promise must not come back if it is queued again.
        for (WorkerState& w : workers_) {
          if (w.reserved_for == j) w.reserved_for = -1;
        }
        break;
      case JobAction::kGrow:
        job.pause_until = now_ + trace_.costs.reform_pause;
        ++job.out.grows;
        break;
      case JobAction::kShrink:
        job.pause_until = now_ + trace_.costs.reform_pause;
        ++job.out.shrinks;
        break;
      case JobAction::kPreempt:
        job.pause_until = now_ + trace_.costs.checkpoint_pause;
        job.preempting = true;
        ++job.out.preemptions;
        break;
      case JobAction::kKeep:
        break;
    }
    for (int w : added) {
      workers_[w].job = j;
      workers_[w].reserved_for = -1;
    }
    for (int w : removed) workers_[w].reserved_for = reserve;
    job.held =
        plan.action == JobAction::kStart || plan.action == JobAction::kGrow ? expected : job.held;
    job.leaving = removed;
    Reshape(job);
    return absl::OkStatus();
  }

  absl::Status CheckQuotas() const {
    std::map<std::string, size_t> held;
    for (const JobState& job : jobs_) {
      if (job.phase == Phase::kRunning) {
        held[job.spec->owner] += job.held.size() - job.leaving.size();
      }
    }
    for (const auto& [owner, quota] : trace_.owner_quota) {
      if (held[owner] > quota) {
        return Broken("", absl::StrCat("owner ", owner, " holds ", held[owner],
                                       " workers, over its quota of ", quota));
      }
    }
    return absl::OkStatus();
  }

  absl::Status Stuck() const {
    std::vector<std::string> waiting;
    for (const JobState& job : jobs_) {
      if (job.phase == Phase::kQueued && waiting.size() < 5) {
        waiting.push_back(absl::StrCat(job.spec->id, " (", job.last_why, ")"));
      }
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "stuck at t=", Seconds(now_), "s: ", jobs_.size() - ended_,
        " jobs left and nothing will change; waiting: ", absl::StrJoin(waiting, "; ")));
  }

  const Trace& trace_;
  const SchedulingPolicy policy_;
  std::vector<WorkerState> workers_;
  std::vector<JobState> jobs_;
  absl::flat_hash_map<std::string, int> worker_index_;
  absl::flat_hash_map<std::string, int> job_index_;
  // Job indices in submission order.
  std::vector<int> arrivals_;
  size_t next_arrival_ = 0;
  absl::Time now_;
  size_t ended_ = 0;
  uint64_t events_ = 0;
  uint64_t decisions_ = 0;
  double busy_ = 0;
  double training_ = 0;
};

}  // namespace

absl::StatusOr<SimResult> Simulate(const Trace& trace, SchedulingPolicy policy) {
  if (absl::Status s = CheckTrace(trace); !s.ok()) return s;
  return Simulator(trace, policy).Run();
}

}  // namespace ddp
