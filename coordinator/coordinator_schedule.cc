// The Coordinator's scheduling while jobs contend for the pool: it gathers
// DecideSchedule's inputs (schedule_policy.h: the same function
// bench/schedule_sim drives) under its lock and carries the plan out: a
// queued job starts on the workers given, a running one shrinks (its
// joiners let go at once, its highest ranks by a leave vote at the next step
// boundary), is preempted through a checkpoint (coordinator_preemption.cc),
// or grows by admitting free workers at a step boundary.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/job_kinds.h"
#include "common/logging.h"
#include "common/quote.h"
#include "coordinator/coordinator.h"
#include "coordinator/schedule_policy.h"
#include "coordinator/worker_fit.h"

namespace ddp {
namespace {

// Names no job: a worker busy in no job's generation (between states).
constexpr char kBusyElsewhere[] = "\x01busy";

SchedJob SchedJobOf(const v1::JobSpec& spec, const std::string& owner, uint64_t sequence) {
  SchedJob job;
  job.id = spec.name();
  job.owner = owner;
  job.priority = spec.priority();
  job.sequence = sequence;
  job.min_workers = spec.min_workers();
  job.max_workers = spec.max_workers();
  // NCCL needs a GPU; any other backend runs anywhere (worker_fit.h says
  // the rest, per worker).
  job.device_kind = BackendOf(spec) == v1::BACKEND_NCCL ? "cuda" : "";
  job.selector = Labels(spec.worker_selector().begin(), spec.worker_selector().end());
  job.reform_min_interval = absl::Seconds(spec.reform_min_interval_seconds());
  return job;
}

}  // namespace

ScheduleInput Coordinator::ScheduleInputLocked() const {
  ScheduleInput in;
  in.policy = SchedulingPolicy::kElastic;
  in.now = clock_->Now();
  in.owner_quota = options_.owner_quotas;
  // The spec each job is asked about, and what a worker prepared for it.
  struct Asked {
    const v1::JobSpec* spec;
    std::string prepare_key;
  };
  std::vector<Asked> asked;
  for (const auto& owned : runs_) {
    const JobRun& run = *owned;
    if (!run.active() || run.preempting()) continue;
    SchedJob job = SchedJobOf(run.spec(), run.owner(), run.start_sequence());
    FormationInput timing;
    run.lifecycle().FillFormationInput(&timing);
    job.allocated_at = timing.last_formed_at;
    job.reallocating = run.generations().current() == nullptr || run.lifecycle().admitting() ||
                       run.lifecycle().adopting();
    job.preemptible = !run.spec().checkpoint().dir().empty();
    job.throughput = run.progress().throughput();
    for (const WorkerRecord* w : registry_.All()) {
      if (w->job == run.id() && w->capabilities.program()) job.preemptible = false;
    }
    in.jobs.push_back(std::move(job));
    asked.push_back({&run.spec(), run.PrepareKey()});
  }
  for (const QueuedJob& queued : queue_.jobs()) {
    in.jobs.push_back(SchedJobOf(queued.spec, queued.owner, queued.sequence));
    asked.push_back({&queued.spec, ""});
  }
  for (const WorkerRecord* w : registry_.All()) {
    if (w->lost()) continue;
    SchedWorker sw;
    sw.id = w->id;
    sw.device_kind = w->device.is_cuda() ? "cuda" : "cpu";
    sw.labels = w->labels;
    sw.reserved_for = w->promised_to;
    const JobRun* held_by = w->job.empty() ? nullptr : FindRunLocked(w->job);
    if (held_by != nullptr && held_by->active()) {
      sw.job_id = w->job;
    } else if (!IsFree(*w)) {
      // Let go, and still finishing its step in its generation: its job's
      // until it is out.
      // (A job being preempted is not weighed: the worker is busy there.)
      const JobRun* of = RunOfGenerationLocked(w->generation);
      sw.job_id = of != nullptr ? of->id() : kBusyElsewhere;
    }
    for (size_t j = 0; j < asked.size(); ++j) {
      const bool failed_here = w->prepare_failed && !asked[j].prepare_key.empty() &&
                               w->prepare_asked == asked[j].prepare_key;
      if (failed_here || !CanGive(*w, *asked[j].spec)) {
        sw.cannot_run.insert(in.jobs[j].id);
      }
    }
    in.workers.push_back(std::move(sw));
  }
  return in;
}

void Coordinator::ScheduleLocked(Effects* fx) {
  const ScheduleInput in = ScheduleInputLocked();
  const std::vector<JobPlan> plans = DecideSchedule(in);
  // Releases first (shrinks, preemptions), then starts, then growth: each
  // takes only workers the ones before it left free.
  for (const JobPlan& plan : plans) {
    if (plan.action != JobAction::kShrink && plan.action != JobAction::kPreempt) continue;
    JobRun* run = FindRunLocked(plan.job_id);
    const SchedJob* for_job = nullptr;
    for (const SchedJob& job : in.jobs) {
      if (job.id == plan.removed_for) for_job = &job;
    }
    if (run == nullptr || for_job == nullptr) continue;
    DDP_LOG(Info) << "job " << run->id() << " (priority " << run->spec().priority()
                  << "): " << plan.why;
    if (plan.action == JobAction::kPreempt) {
      PreemptLocked(*run, *for_job, fx);
    } else {
      ShrinkLocked(*run, plan.removed, *for_job, fx);
    }
  }
  for (const JobPlan& plan : plans) {
    if (plan.action == JobAction::kStart) {
      std::optional<QueuedJob> queued = queue_.Take(plan.job_id);
      if (!queued) continue;
      queue_waits_.erase(plan.job_id);
      DDP_LOG(Info) << "job " << plan.job_id << " leaves the queue: " << plan.why;
      if (absl::Status s = StartJobLocked(queued->spec, queued->owner, fx, &*queued, &plan.added);
          !s.ok()) {
        DDP_LOG(Error) << "job " << plan.job_id << " could not start, and is dropped: " << s;
      }
    } else if (plan.action == JobAction::kKeep && queue_.Find(plan.job_id) != nullptr) {
      queue_waits_[plan.job_id] = absl::StrCat(plan.why, " (running: ", RunningJobsLocked(), ")");
    }
  }
  for (const JobPlan& plan : plans) {
    if (plan.action != JobAction::kGrow) continue;
    JobRun* run = FindRunLocked(plan.job_id);
    if (run == nullptr) continue;
    DDP_LOG(Info) << "job " << run->id() << ": " << plan.why;
    for (const std::string& id : plan.added) GiveWorkerLocked(*run, registry_.Find(id), fx);
    MaybeFormGenerationLocked(*run, fx);
  }
}

void Coordinator::ShrinkLocked(JobRun& run, const std::vector<std::string>& removed,
                               const SchedJob& for_job, Effects* fx) {
  const Generation& g = *run.generations().current();
  // Joiners still preparing go at once; members leave at the step boundary.
  std::vector<std::string> members;
  for (const std::string& id : removed) {
    registry_.Release(registry_.Find(id), for_job.id);
    if (g.RankOf(id) >= 0) members.push_back(id);
  }
  dirty_ = true;
  if (members.empty()) return;
  const std::string why =
      absl::StrCat("giving ", members.size(), " worker(s) to job ", Quote(for_job.id),
                   " (priority ", for_job.priority, ") at the next step boundary");
  run.BeginLeaveVote(v1::CHANGE_CAUSE_SHRUNK, why, members);
  for (const RankCandidate& m : g.members) {
    SendAbortLocked(m.worker_id, g.number, why, /*at_step_boundary=*/true, fx);
  }
}

}  // namespace ddp
