// A discrete-event simulation of many training jobs sharing one pool of
// workers, scheduled by the coordinator's own DecideSchedule
// (coordinator/schedule_policy.h): the same function, not a copy, so what
// bench/scheduling.py reports is what the coordinator would decide.
//
// The model. A job has `work` samples to process and a true throughput curve
// T(n) = t1 * n / (1 + a * (n - 1)) on n workers. The policy never sees the
// curve: it sees T(n) only for the sizes the job has trained at (measured
// once a start, grow or shrink has finished). Events are arrivals, the end of
// a pause, completions, and the moment a job's reform_min_interval runs out
// (the only way the clock changes a decision); on every event the policy is
// asked again and its plan is carried out:
//   kStart, kGrow  the job holds its new workers at once and trains after a
//                  re-formation pause (a preempted job's start restores its
//                  checkpoint instead: restart_pause);
//   kShrink        the job keeps every worker through the re-formation
//                  pause, then lets the removed ones go;
//   kPreempt       the job checkpoints (checkpoint_pause, holding its
//                  workers), then lets them all go and is queued again; no
//                  work is lost.
// During a pause the job makes no progress and is `reallocating`; workers it
// is letting go are `reserved_for` the job the plan named until a plan gives
// them to a job or that job ends. A plan that breaks the policy's contract
// stops the run with an error that names it.
#ifndef DDP_BENCH_SCHEDULE_SIM_CORE_H_
#define DDP_BENCH_SCHEDULE_SIM_CORE_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/schedule_policy.h"

namespace ddp {

// What a re-allocation costs, and how often one is allowed.
struct SimCosts {
  // A start, grow or shrink: the job makes no progress for this long
  // (rendezvous, communicator, state broadcast).
  absl::Duration reform_pause = absl::Seconds(10);
  // A preemption: the checkpoint at a step boundary, holding the workers.
  absl::Duration checkpoint_pause = absl::Seconds(30);
  // A preempted job's next start: restoring the checkpoint (instead of
  // reform_pause).
  absl::Duration restart_pause = absl::Seconds(30);
  // Every job's reform_min_interval.
  absl::Duration reform_min_interval = absl::Seconds(60);
};

struct TraceJob {
  std::string id;
  std::string owner;
  int64_t priority = 0;
  // After the trace's start.
  absl::Duration submit;
  // Samples to process.
  double work = 0;
  // Samples/s on one worker, and the scaling parameter a in [0, 1] of
  // T(n) = t1 * n / (1 + a * (n - 1)).
  double t1 = 1;
  double a = 0;
  uint32_t min_workers = 1;
  uint32_t max_workers = 1;
  // It checkpoints, so it may be preempted whole; else it is only shrunk.
  bool preemptible = true;
};

struct Trace {
  uint32_t workers = 64;
  SimCosts costs;
  std::map<std::string, uint32_t> owner_quota;
  // The run fails, rather than spin, past this many events.
  uint64_t max_events = 1000000;
  std::vector<TraceJob> jobs;
};

// The job's true samples/s on n workers.
double TrueThroughput(const TraceJob& job, uint32_t n);

// A stretch of time over which a job held the same workers at the same rate.
struct SimSegment {
  absl::Duration from;
  absl::Duration to;
  std::vector<std::string> workers;
  // Samples/s: 0 during a pause.
  double rate = 0;
};

struct JobOutcome {
  std::string id;
  absl::Duration submit;
  absl::Duration first_start;
  absl::Duration end;
  // All the time it spent queued: before its first start and after each
  // preemption.
  absl::Duration queued;
  // Held workers without progress (the pauses).
  absl::Duration paused;
  uint32_t starts = 0;
  uint32_t grows = 0;
  uint32_t shrinks = 0;
  uint32_t preemptions = 0;
  double work_done = 0;
  // In time order; touching, never overlapping.
  std::vector<SimSegment> segments;
};

struct SimResult {
  SchedulingPolicy policy = SchedulingPolicy::kElastic;
  uint32_t workers = 0;
  // In the trace's order.
  std::vector<JobOutcome> jobs;
  // From the first submission to the last completion.
  absl::Duration makespan;
  // Worker-seconds held by some job, and held by a job that was training
  // (not in a pause).
  double busy_worker_seconds = 0;
  double training_worker_seconds = 0;
  uint64_t events = 0;
  uint64_t decisions = 0;
};

// Runs the trace to the end under `policy`. INVALID_ARGUMENT: a trace that
// can't be simulated (no jobs, duplicate ids, min > max, ...);
// INTERNAL: the policy broke its contract (named); FAILED_PRECONDITION:
// jobs remain and nothing can change any more (a job that never fits);
// RESOURCE_EXHAUSTED: more than trace.max_events events.
absl::StatusOr<SimResult> Simulate(const Trace& trace, SchedulingPolicy policy);

// "fifo-gang", "priority-preempt", "elastic".
absl::StatusOr<SchedulingPolicy> ParsePolicyName(const std::string& name);
const char* PolicyName(SchedulingPolicy policy);

}  // namespace ddp

#endif  // DDP_BENCH_SCHEDULE_SIM_CORE_H_
