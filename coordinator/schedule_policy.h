// Which job trains on which workers, as a pure function of the jobs, the
// workers, each job's measured throughput and the time. The coordinator
// gathers the inputs under its lock and carries the plan out (forms a
// generation on the workers given, asks named members to leave at a step
// boundary, checkpoints and re-queues a job); bench/schedule_sim drives the
// same function over a trace of jobs. Only decides, so it is tested as a
// table.
#ifndef DDP_COORDINATOR_SCHEDULE_POLICY_H_
#define DDP_COORDINATOR_SCHEDULE_POLICY_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/labels.h"
#include "coordinator/throughput_model.h"  // ExpectedThroughput, MarginalGain

namespace ddp {

enum class SchedulingPolicy {
  // Jobs in submission order, each on max_workers or not at all (a gang);
  // the queue's head blocks everything behind it; nothing is preempted,
  // shrunk or grown. What Kueue's StrictFIFO and Slurm without backfill do.
  kFifoGang,
  // The highest priority first (then submission order), each on
  // max_workers; a job that can't start preempts whole running jobs of
  // lower priority, lowest and newest first; a job that can't start even so
  // blocks the lower-priority jobs behind it. Determined AI's priority
  // scheduler.
  kPriorityPreempt,
  // Ours: priorities; a queued job starts at min_workers (a gang), taking
  // workers at a step boundary from running jobs before it preempts any:
  // first from lower-priority jobs down to their min_workers, then from
  // jobs of its own priority, only what they hold above min_workers, each
  // worker from the one that loses least samples/s by it (Pollux's idea: a
  // job at no workers gains more from them than one that grew into them);
  // only then whole lower-priority jobs (never one of its own priority).
  // Spare workers grow running jobs toward max_workers, higher priority
  // first and, among equal priority, where the measured throughput gains
  // most (never where it gains nothing), and a job only when the round's
  // growth is expected to raise its samples/s by 10% or more (each grow
  // pauses it). A job starts on exactly min_workers and grows from there
  // once its reform interval has passed. A job alone (the input's only one)
  // starts on every free worker that fits it, up to max_workers, and grows
  // to max_workers whatever the gain: nobody else could use them (what the
  // coordinator has always done for a lone job). A queued job that can't start
  // keeps the free workers that fit it (up to min_workers) from the jobs
  // behind it and from growth, so smaller jobs can't starve it; they start
  // on free workers it can't use.
  kElastic,
};

// An attached worker that can train.
struct SchedWorker {
  std::string id;
  // "cpu" or "cuda".
  std::string device_kind;
  // What the worker declared with --labels.
  Labels labels;
  // The job it belongs to now; empty when free.
  std::string job_id;
  // Promised to this job by an earlier plan, to go to it once `job_id` has
  // let it go (a shrink or preemption under way); empty when not promised.
  // A promise to a job that is gone, runs already or that the worker doesn't
  // fit is void. While any worker promised to a job is still busy, nothing
  // more is taken for it.
  std::string reserved_for;
  // Jobs it can't run for reasons of its own, beyond kind and labels (the
  // coordinator's: a library program runs only its own job, an NCCL job
  // needs NCCL, a job it failed to prepare for).
  std::set<std::string> cannot_run;
};

// A job that has not ended: queued, or holding workers.
struct SchedJob {
  std::string id;
  // Who submitted it (the token's owner): quotas count per owner.
  std::string owner;
  // Higher first.
  int64_t priority = 0;
  // Submission order: lower first among equal priority.
  uint64_t sequence = 0;
  uint32_t min_workers = 1;
  uint32_t max_workers = 1;
  // The device kind every worker of the job must have; empty: any.
  std::string device_kind = "cpu";
  // Labels every worker of the job must carry with these values.
  Labels selector;
  // A running job's allocation changes at most this often
  // (reformMinIntervalSeconds); starting and preemption count as changes.
  absl::Duration reform_min_interval;
  // When its allocation last changed; InfinitePast if never.
  absl::Time allocated_at = absl::InfinitePast();
  // A start, shrink, grow or preemption of it is under way: its allocation
  // is left as it is until that is done.
  bool reallocating = false;
  // It may be preempted whole (it checkpoints); else it is only shrunk.
  bool preemptible = true;
  // Measured samples/s at each world size it has trained at.
  std::map<uint32_t, double> throughput;
};

struct ScheduleInput {
  SchedulingPolicy policy = SchedulingPolicy::kElastic;
  // In no particular order; the plan is in this order.
  std::vector<SchedJob> jobs;
  // Attached, healthy workers, in the order a job's members should be
  // released in reverse (the coordinator lists a job's members in rank
  // order, so the highest ranks leave first).
  std::vector<SchedWorker> workers;
  // The most workers an owner's jobs may hold together; an owner not named
  // has no limit.
  std::map<std::string, uint32_t> owner_quota;
  absl::Time now;
};

enum class JobAction {
  // Stays as it is: queued (`why` says what it waits for), or running on
  // the workers it has.
  kKeep,
  // Queued: starts on `workers` (all of them free now).
  kStart,
  // Running: `removed` leave it at the next step boundary; it goes on with
  // `workers`.
  kShrink,
  // Running: admits `added` (free now) at the next step boundary.
  kGrow,
  // Running: checkpoints at the next step boundary, lets all its workers go
  // and goes back to the queue, to resume from that checkpoint later.
  kPreempt,
};

struct JobPlan {
  std::string job_id;
  JobAction action = JobAction::kKeep;
  // The job's workers once the plan is carried out, in input order.
  std::vector<std::string> workers;
  // kStart, kGrow: the workers it gets.
  std::vector<std::string> added;
  // kShrink, kPreempt: the workers it gives up.
  std::vector<std::string> removed;
  // kShrink and kPreempt: the job the removed workers are promised to
  // (SchedWorker::reserved_for in the next input).
  std::string removed_for;
  // For operators, one line: why a queued job waits (the pool is full, a
  // higher-priority job is ahead, its owner's quota, it can never fit and
  // why), or why a running job shrank, grew or was preempted.
  std::string why;
};

// One plan per input job, in input order. Under every policy a job that can
// never start (too few fitting workers in the whole pool) or that waits for
// its owner's quota holds no other job back. Never gives a worker to two jobs,
// never gives a job a worker that doesn't fit it (device kind, selector),
// never puts a job below min_workers except by preempting it whole or above
// max_workers, shrinks a job only for one of its priority or higher and
// preempts one only for a higher one, never lets an owner's jobs hold more
// than its quota, and never changes a running job's allocation within
// reform_min_interval of its last change, nor one that is reallocating.
std::vector<JobPlan> DecideSchedule(const ScheduleInput& in);

}  // namespace ddp

#endif  // DDP_COORDINATOR_SCHEDULE_POLICY_H_
