// The Coordinator's whole-job preemption: when shrinking jobs can't free
// enough workers for a higher-priority queued job, the scheduling policy
// preempts whole lower-priority ones that checkpoint (DecideSchedule's
// kPreempt). Every member of the preempted job leaves at the next
// step boundary (a leave vote, as a shrink), rank 0 checkpoints that step,
// and once both are done the job goes back to the queue, in its old place,
// with where it stood (JobRun::FillDurable). When it starts again it resumes
// from that checkpoint (or from a worker still holding the step in memory):
// no step is lost, and every sample is still trained once per epoch.
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/quote.h"
#include "coordinator/coordinator.h"

namespace ddp {
namespace {

// How long a preempted job whose members all left waits for rank 0's
// checkpoint before it is queued without it (rank 0 died, or its disk
// failed): it then resumes from its newest checkpoint, or from a worker
// still holding its state, and says what was lost.
constexpr absl::Duration kPreemptCheckpointWait = absl::Seconds(60);

}  // namespace

void Coordinator::PreemptLocked(JobRun& run, const SchedJob& for_job, Effects* fx) {
  const Generation& g = *run.generations().current();
  // Its workers are kept for that job from now, and go to it as they leave.
  for (const WorkerRecord* w : registry_.All()) {
    if (w->job == run.id()) registry_.Release(registry_.Find(w->id), for_job.id);
  }
  const std::string why = absl::StrCat(
      "preempted for job ", Quote(for_job.id), " (priority ", for_job.priority,
      "): checkpointing at the next step boundary, then queued again to resume from there");
  run.BeginPreemption(for_job.id, why);
  for (const RankCandidate& m : g.members) {
    SendAbortLocked(m.worker_id, g.number, why, /*at_step_boundary=*/true, fx,
                    /*checkpoint=*/true);
  }
  dirty_ = true;
}

void Coordinator::RequeuePreemptedLocked(Effects* fx) {
  const absl::Time now = clock_->Now();
  for (auto it = runs_.begin(); it != runs_.end();) {
    JobRun& run = **it;
    if (!run.active() || !run.preempting() || run.generations().current() != nullptr) {
      ++it;
      continue;
    }
    const JobProgress& job = run.progress();
    const std::optional<uint64_t> checkpoint = job.checkpoint_step();
    const bool saved = checkpoint.has_value() && *checkpoint >= job.committed_step();
    if (!saved && now < run.preempted_at() + kPreemptCheckpointWait) {
      ++it;  // rank 0 is still writing it
      continue;
    }
    if (saved) {
      DDP_LOG(Info) << "job " << run.id()
                    << " is queued again, to resume from its checkpoint of step " << *checkpoint;
    } else {
      DDP_LOG(Warning) << "job " << run.id() << " is queued again without a checkpoint of step "
                       << job.committed_step() << " (none came within "
                       << absl::FormatDuration(kPreemptCheckpointWait)
                       << "): it resumes from a worker still holding that step, else from its "
                          "newest checkpoint ("
                       << (checkpoint ? absl::StrCat("step ", *checkpoint) : "none") << ")";
    }
    auto where = std::make_shared<v1::DurableState>();
    run.FillDurable(where.get());
    QueuedJob queued{run.spec(), run.owner(), run.queue_sequence(), job.submitted_at(),
                     std::move(where)};
    latest_generation_ = std::max(latest_generation_, run.generations().latest());
    it = runs_.erase(it);
    queue_.Requeue(std::move(queued));
    dirty_ = true;
    PersistLocked(fx);
  }
}

}  // namespace ddp
