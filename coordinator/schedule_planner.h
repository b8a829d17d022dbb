// The planner behind DecideSchedule (schedule_policy.h), by concern:
// schedule_policy.cc starts queued jobs (shrinking and preempting running ones
// for them), schedule_growth.cc gives what is left to running jobs. Internal
// to those two files.
//
// Not thread-safe: one Planner per DecideSchedule call.
#ifndef DDP_COORDINATOR_SCHEDULE_PLANNER_H_
#define DDP_COORDINATOR_SCHEDULE_PLANNER_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "coordinator/schedule_policy.h"
#include "coordinator/throughput_model.h"

namespace ddp {
namespace schedule_internal {

inline constexpr int kNone = -1;
// Held by a job the input does not list (one that just ended): not free,
// and nobody's to take.
inline constexpr int kElsewhere = -2;

// What each policy may do; one place says it (see SchedulingPolicy).
struct Traits {
  // A job starts on min_workers; else only on max_workers.
  bool start_at_min = false;
  // Queue order: priority, then sequence; else sequence alone.
  bool by_priority = false;
  // A queued job may take the workers running jobs hold above min_workers:
  // of lower priority first, then of its own (see Planner::Take).
  bool shrink = false;
  bool preempt = false;
  // A queued job that can't start holds back every job behind it.
  bool head_blocks = false;
  bool grow = false;
};

// "1 worker", "3 workers".
std::string Workers(size_t n);
// What growing or shrinking from `from` to `to` workers is expected to do.
std::string GainNote(const ThroughputModel& model, uint32_t from, uint32_t to);

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
  // Frees `more` workers fitting `j` from running jobs (shrinks of lower,
  // then of equal priority, then whole lower-priority jobs), or disturbs
  // nobody and returns false.
  bool Take(int j, uint32_t more);
  // Takes `n` workers above min_workers from `peers` (of j's priority), each
  // from the one that loses least by it.
  void ShrinkPeers(int j, const std::vector<int>& peers, uint32_t n);
  void Shrink(int x, int j, uint32_t n);
  void Preempt(int x, int j);
  void Start(int j, const std::vector<int>& workers);
  // Keeps free workers fitting `j` (up to its need) from later jobs.
  void Hold(int j);
  void Grow();
  void GrowClass(const std::vector<int>& jobs);
  // Gives free workers to `jobs` (of one priority), one at a time, each to
  // the job that gains most by it.
  void PlanGrowth(const std::vector<int>& jobs);

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
  std::vector<int> Peers(int j, bool settled) const;
  std::vector<int> Promised(int j) const;
  std::string ReleaseWhy(int j) const;
  std::string BlockedWhy(int j, size_t free) const;
  bool QuotaAllows(const SchedJob& job, uint32_t more) const;

  const ScheduleInput& in_;
  const Traits traits_;
  // The input's only job (no other running or queued): under kElastic it
  // starts on all it can use and grows without the kMinGrowth rule.
  const bool alone_;
  std::vector<Slot> slots_;
  std::vector<Entry> jobs_;
  // Each job's throughput model, fitted once (by jobs_ index).
  std::vector<ThroughputModel> models_;
  // Workers each owner's jobs hold in the plan (with what waiting jobs will
  // start on).
  std::map<std::string, uint32_t> load_;
};

}  // namespace schedule_internal
}  // namespace ddp

#endif  // DDP_COORDINATOR_SCHEDULE_PLANNER_H_
