// The scheduler's decisions as tables: which queued job starts where, who
// shrinks, grows or is preempted for whom, and why a job waits, under the
// three policies; and the throughput model the elastic one grows by. Every
// plan is also checked against the contract's invariants.
#include "coordinator/schedule_policy.h"

#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest-spi.h"
#include "gtest/gtest.h"

namespace ddp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

const absl::Time kNow = absl::FromUnixSeconds(1700000000);

// Workers w1..wN on cpu; pattern[i] is the job worker i+1 belongs to, '.'
// when free.
std::vector<SchedWorker> Pool(const std::string& pattern) {
  std::vector<SchedWorker> pool;
  for (size_t i = 0; i < pattern.size(); ++i) {
    SchedWorker w;
    w.id = absl::StrCat("w", i + 1);
    w.device_kind = "cpu";
    if (pattern[i] != '.') w.job_id = std::string(1, pattern[i]);
    pool.push_back(w);
  }
  return pool;
}

// A cpu job owned by "alice", re-formable every 10s and last changed an hour
// ago.
SchedJob Job(const std::string& id, int64_t priority, uint32_t min, uint32_t max) {
  SchedJob job;
  job.id = id;
  job.owner = "alice";
  job.priority = priority;
  job.min_workers = min;
  job.max_workers = max;
  job.reform_min_interval = absl::Seconds(10);
  job.allocated_at = kNow - absl::Hours(1);
  return job;
}

// Jobs submitted in the order listed (unless they say otherwise).
ScheduleInput Input(SchedulingPolicy policy, std::vector<SchedJob> jobs, const std::string& pool) {
  ScheduleInput in;
  in.policy = policy;
  in.now = kNow;
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (jobs[i].sequence == 0) jobs[i].sequence = i + 1;
  }
  in.jobs = std::move(jobs);
  in.workers = Pool(pool);
  return in;
}

const char* Name(JobAction action) {
  switch (action) {
    case JobAction::kKeep:
      return "keep";
    case JobAction::kStart:
      return "start";
    case JobAction::kShrink:
      return "shrink";
    case JobAction::kGrow:
      return "grow";
    case JobAction::kPreempt:
      return "preempt";
  }
  return "?";
}

// "A shrink w1,w2 -w3,w4>B; B keep": each plan's action, workers, what it
// gains (grow) and what it gives up, for whom.
std::string Show(const std::vector<JobPlan>& plans) {
  std::vector<std::string> parts;
  for (const JobPlan& p : plans) {
    std::string s = absl::StrCat(p.job_id, " ", Name(p.action));
    if (!p.workers.empty()) absl::StrAppend(&s, " ", absl::StrJoin(p.workers, ","));
    if (p.action == JobAction::kGrow) absl::StrAppend(&s, " +", absl::StrJoin(p.added, ","));
    if (!p.removed.empty()) {
      absl::StrAppend(&s, " -", absl::StrJoin(p.removed, ","), ">", p.removed_for);
    }
    parts.push_back(s);
  }
  return absl::StrJoin(parts, "; ");
}

// The test's own reading of "fits", to check the policy's against.
bool FitsJob(const SchedWorker& w, const SchedJob& job) {
  if (!job.device_kind.empty() && w.device_kind != job.device_kind) return false;
  if (w.cannot_run.count(job.id) > 0) return false;
  for (const auto& [key, value] : job.selector) {
    if (!w.labels.count(key) || w.labels.at(key) != value) return false;
  }
  return true;
}

// Whether `w` is promised to a queued job other than `job_id`.
bool PromisedElsewhere(const ScheduleInput& in, const SchedWorker& w, const std::string& job_id) {
  if (w.reserved_for.empty() || w.reserved_for == job_id) return false;
  for (const SchedJob& job : in.jobs) {
    if (job.id != w.reserved_for || !FitsJob(w, job)) continue;
    for (const SchedWorker& other : in.workers) {
      if (other.job_id == job.id) return false;  // running: the promise is void
    }
    return true;
  }
  return false;
}

std::vector<std::string> Minus(const std::vector<std::string>& a,
                               const std::vector<std::string>& b) {
  std::vector<std::string> out;
  for (const std::string& x : a) {
    if (std::find(b.begin(), b.end(), x) == b.end()) out.push_back(x);
  }
  return out;
}

// What DecideSchedule promises whatever the input: no worker twice, every
// worker fits its job, min/max and quotas kept, allocations changed only by
// the action named, never within the reform interval nor while
// reallocating.
void ExpectValidPlan(const ScheduleInput& in, const std::vector<JobPlan>& plans) {
  ASSERT_EQ(plans.size(), in.jobs.size());
  std::map<std::string, int> index;
  for (size_t i = 0; i < in.workers.size(); ++i) index[in.workers[i].id] = static_cast<int>(i);
  std::map<std::string, std::string> holder;
  std::map<std::string, uint32_t> held, held_before;
  for (size_t i = 0; i < plans.size(); ++i) {
    const SchedJob& job = in.jobs[i];
    const JobPlan& plan = plans[i];
    SCOPED_TRACE(absl::StrCat("job ", job.id, ": ", Name(plan.action), " (", plan.why, ")"));
    EXPECT_EQ(plan.job_id, job.id);
    std::vector<std::string> before;
    for (const SchedWorker& w : in.workers) {
      if (w.job_id == job.id) before.push_back(w.id);
    }
    int last = -1;
    for (const std::string& id : plan.workers) {
      ASSERT_TRUE(index.count(id)) << id;
      const SchedWorker& w = in.workers[index[id]];
      EXPECT_GT(index[id], last) << "not in input order";
      last = index[id];
      EXPECT_TRUE(FitsJob(w, job)) << id;
      EXPECT_TRUE(holder.emplace(id, job.id).second) << id << " given twice";
    }
    EXPECT_LE(plan.workers.size(), job.max_workers);
    held[job.owner] += plan.workers.size();
    held_before[job.owner] += before.size();
    const bool changed = plan.action != JobAction::kKeep && plan.action != JobAction::kStart;
    if (changed) {
      EXPECT_FALSE(job.reallocating);
      EXPECT_GE(in.now, job.allocated_at + job.reform_min_interval);
    }
    for (const std::string& id : plan.added) {
      const SchedWorker& w = in.workers[index[id]];
      EXPECT_TRUE(w.job_id.empty()) << id << " was not free";
      EXPECT_FALSE(PromisedElsewhere(in, w, job.id)) << id << " was promised to another job";
    }
    switch (plan.action) {
      case JobAction::kKeep:
        EXPECT_EQ(plan.workers, before);
        break;
      case JobAction::kStart:
        EXPECT_TRUE(before.empty());
        EXPECT_EQ(plan.added, plan.workers);
        EXPECT_GE(plan.workers.size(), job.min_workers);
        break;
      case JobAction::kGrow:
        EXPECT_EQ(Minus(plan.workers, plan.added), before);
        EXPECT_FALSE(plan.added.empty());
        break;
      case JobAction::kShrink:
        EXPECT_EQ(plan.workers, Minus(before, plan.removed));
        EXPECT_GE(plan.workers.size(), job.min_workers);
        break;
      case JobAction::kPreempt:
        EXPECT_TRUE(plan.workers.empty());
        EXPECT_EQ(plan.removed, before);
        break;
    }
    if (plan.action == JobAction::kShrink || plan.action == JobAction::kPreempt) {
      EXPECT_FALSE(plan.removed_for.empty());
      // Shrunk for a job of its priority or higher; preempted only for a
      // higher one.
      for (const SchedJob& other : in.jobs) {
        if (other.id != plan.removed_for) continue;
        if (plan.action == JobAction::kShrink) {
          EXPECT_GE(other.priority, job.priority);
        } else {
          EXPECT_GT(other.priority, job.priority);
        }
      }
    } else {
      EXPECT_TRUE(plan.removed.empty());
    }
  }
  for (const auto& [owner, quota] : in.owner_quota) {
    EXPECT_LE(held[owner], std::max(quota, held_before[owner])) << owner << "'s quota";
  }
}

std::vector<JobPlan> Decide(const ScheduleInput& in) {
  std::vector<JobPlan> plans = DecideSchedule(in);
  ExpectValidPlan(in, plans);
  return plans;
}

const JobPlan& PlanOf(const std::vector<JobPlan>& plans, const std::string& id) {
  for (const JobPlan& p : plans) {
    if (p.job_id == id) return p;
  }
  static const JobPlan kMissing;
  ADD_FAILURE() << "no plan for " << id;
  return kMissing;
}

struct Row {
  std::string name;
  std::string pool;
  std::vector<SchedJob> jobs;
  std::string want;
};

void ExpectRows(SchedulingPolicy policy, const std::vector<Row>& rows) {
  for (const Row& row : rows) {
    SCOPED_TRACE(row.name);
    const ScheduleInput in = Input(policy, row.jobs, row.pool);
    EXPECT_EQ(Show(Decide(in)), row.want);
  }
}

SchedJob Reallocating(SchedJob job) {
  job.reallocating = true;
  return job;
}

// Last changed `seconds` ago.
SchedJob ChangedAgo(SchedJob job, double seconds) {
  job.allocated_at = kNow - absl::Seconds(seconds);
  return job;
}

SchedJob Measured(SchedJob job, std::map<uint32_t, double> throughput) {
  job.throughput = std::move(throughput);
  return job;
}

// ---- The throughput model --------------------------------------------------

TEST(SchedulePolicy, ExpectedThroughput_MeasuredElseFittedModel) {
  struct Row {
    std::map<uint32_t, double> measured;
    uint32_t world;
    double want;
  } rows[] = {
      {{}, 4, 0},
      {{{2, 100}}, 2, 100},
      {{{2, 100}}, 4, 200},                      // one point: a = 0, linear
      {{{1, 100}, {2, 150}}, 4, 200},            // a = 1/3, T1 = 100: 400 / 2
      {{{1, 100}, {2, 100}, {4, 100}}, 3, 100},  // no scaling at all: a = 1
      {{{1, 100}, {2, 250}}, 3, 360},            // superlinear: a clamped to 0, T1 = 120
      {{{1, 100}, {2, 150}, {3, 10}}, 3, 10},    // a measurement wins over the fit
      {{{1, 100}}, 0, 0},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(absl::StrCat("at ", row.world, " from ", row.measured.size(), " points"));
    EXPECT_NEAR(ExpectedThroughput(row.measured, row.world), row.want, 1e-3 * row.want + 1e-9);
  }
}

TEST(SchedulePolicy, MarginalGain_RelativeToCurrentSize) {
  struct Row {
    std::map<uint32_t, double> measured;
    uint32_t world;
    double want;
  } rows[] = {
      {{}, 2, 1},  // unmeasured: tried larger
      {{{2, 100}}, 2, 0.5},
      {{{1, 100}, {2, 150}}, 2, 0.2},  // T(3) = 300 / (5/3) = 180
      {{{1, 100}, {2, 100}, {4, 100}}, 2, 0},
      {{{1, 100}, {2, 150}, {3, 140}}, 2, -0.0667},  // measured worse at 3
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(absl::StrCat("at ", row.world, " from ", row.measured.size(), " points"));
    EXPECT_NEAR(MarginalGain(row.measured, row.world), row.want, 1e-3);
  }
}

// ---- kElastic ---------------------------------------------------------------

TEST(SchedulePolicy, Elastic_QueuedJobs_StartAtMinInPriorityOrder) {
  ExpectRows(SchedulingPolicy::kElastic, {
                                             {"the higher priority first",
                                              "..",
                                              {Job("A", 0, 2, 2), Job("B", 5, 2, 2)},
                                              "A keep; B start w1,w2"},
                                             {"equal priority: the older first",
                                              "..",
                                              {Job("A", 0, 2, 2), Job("B", 0, 2, 2)},
                                              "A start w1,w2; B keep"},
                                             {"at min, not max",
                                              "Z....",
                                              {Job("A", 0, 1, 4), Job("Z", 9, 1, 1)},
                                              "A start w2; Z keep w1"},
                                             {"alone on the pool: all it can use, up to max",
                                              ".....",
                                              {Job("A", 0, 1, 4)},
                                              "A start w1,w2,w3,w4"},
                                             {"a gang: never below min",
                                              "B.",
                                              {Job("A", 0, 2, 4), Job("B", 0, 1, 1)},
                                              "A keep; B keep w1"},
                                             {"both when both fit",
                                              "...",
                                              {Job("A", 0, 2, 4), Job("B", 1, 1, 4)},
                                              "A start w2,w3; B start w1"},
                                         });
}

TEST(SchedulePolicy, Elastic_HigherPriorityWaits_ShrinksLowerBeforePreempting) {
  ExpectRows(SchedulingPolicy::kElastic,
             {
                 {"A shrinks by two for B",
                  "AAAA",
                  {Job("A", 0, 2, 4), Job("B", 10, 2, 2)},
                  "A shrink w1,w2 -w3,w4>B; B keep"},
                 {"A is preempted for C, shrinking can't give four",
                  "AAAA",
                  {Job("A", 0, 2, 4), Job("C", 10, 4, 4)},
                  "A preempt -w1,w2,w3,w4>C; C keep"},
                 {"free workers first, then only what is missing",
                  "AAA.",
                  {Job("A", 0, 1, 3), Job("B", 10, 2, 2)},
                  "A shrink w1,w2 -w3>B; B keep"},
                 {"the lowest priority shrinks first",
                  "AADD",
                  {Job("A", 0, 1, 2), Job("D", 1, 1, 2), Job("B", 10, 1, 1)},
                  "A shrink w1 -w2>B; D keep w3,w4; B keep"},
                 {"then the next",
                  "AADD",
                  {Job("A", 0, 1, 2), Job("D", 1, 1, 2), Job("B", 10, 2, 2)},
                  "A shrink w1 -w2>B; D shrink w3 -w4>B; B keep"},
                 {"equal priority: the newest shrinks first",
                  "AADD",
                  {Job("A", 0, 1, 2), Job("D", 0, 1, 2), Job("B", 10, 1, 1)},
                  "A keep w1,w2; D shrink w3 -w4>B; B keep"},
                 {"preempts the newest lowest, then shrinks the rest",
                  "AADD",
                  {Job("A", 0, 1, 2), Job("D", 0, 2, 2), Job("C", 10, 3, 3)},
                  "A shrink w1 -w2>C; D preempt -w3,w4>C; C keep"},
                 {"never a higher priority, nor an equal one below min: not enough, nobody moves",
                  "AAEE",
                  {Job("A", 10, 1, 2), Job("E", 20, 1, 2), Job("C", 10, 2, 2)},
                  "A keep w1,w2; E keep w3,w4; C keep"},
                 {"not enough even so: nobody is disturbed",
                  "AAEE",
                  {Job("A", 0, 2, 2), Job("E", 20, 2, 2), Job("C", 10, 4, 4)},
                  "A keep w1,w2; E keep w3,w4; C keep"},
             });
}

// Workers a running job grew into above its min_workers go back to a queued
// job of its own priority (which, at no workers, gains most from them).
TEST(SchedulePolicy, Elastic_EqualPriorityWaits_TakesOnlyWorkersAboveMin) {
  ExpectRows(SchedulingPolicy::kElastic,
             {
                 {"an equal-priority job gives what it holds above min",
                  "AAAA",
                  {Job("A", 0, 2, 4), Job("B", 0, 2, 2)},
                  "A shrink w1,w2 -w3,w4>B; B keep"},
                 {"never below min: not enough, nobody moves",
                  "AAAA",
                  {Job("A", 0, 3, 4), Job("B", 0, 2, 2)},
                  "A keep w1,w2,w3,w4; B keep"},
                 {"never preempted for equal priority",
                  "AAAA",
                  {Job("A", 0, 4, 4), Job("B", 0, 1, 1)},
                  "A keep w1,w2,w3,w4; B keep"},
                 {"only what is missing",
                  "AAA.",
                  {Job("A", 0, 1, 3), Job("B", 0, 2, 2)},
                  "A shrink w1,w2 -w3>B; B keep"},
                 {"lower priority gives first",
                  "AALL",
                  {Job("A", 5, 1, 2), Job("L", 0, 1, 2), Job("B", 5, 1, 1)},
                  "A keep w1,w2; L shrink w3 -w4>B; B keep"},
                 {"then equal priority, before a lower job is preempted",
                  "AALL",
                  {Job("A", 5, 1, 2), Job("L", 0, 2, 2), Job("B", 5, 1, 1)},
                  "A shrink w1 -w2>B; L keep w3,w4; B keep"},
                 {"preempts a lower job only when every shrink is not enough",
                  "AALL",
                  {Job("A", 5, 1, 2), Job("L", 0, 2, 2), Job("B", 5, 3, 3)},
                  "A shrink w1 -w2>B; L preempt -w3,w4>B; B keep"},
                 {"a higher priority is never shrunk for it",
                  "HH",
                  {Job("H", 10, 1, 2), Job("B", 5, 1, 1)},
                  "H keep w1,w2; B keep"},
             });
  const ScheduleInput in =
      Input(SchedulingPolicy::kElastic, {Job("A", 0, 2, 4), Job("B", 0, 2, 2)}, "AAAA");
  const std::vector<JobPlan> plans = Decide(in);
  EXPECT_THAT(PlanOf(plans, "A").why,
              AllOf(HasSubstr("from 4 to 2 workers for job B (priority 0)"),
                    HasSubstr("of the jobs of its priority it loses least")));
  EXPECT_EQ(PlanOf(plans, "B").why, "waiting for 2 workers released by job A");
}

TEST(SchedulePolicy, Elastic_EqualPriorityWaits_TheJobThatLosesLeastGives) {
  const std::map<uint32_t, double> linear = {{1, 100}, {2, 200}};  // loses 1/(n-1) at n
  const std::map<uint32_t, double> poor = {{1, 100}, {2, 150}};    // 3 -> 2: 1/5, 2 -> 1: 1/2
  ExpectRows(SchedulingPolicy::kElastic,
             {
                 {"the poorly scaling one",
                  "AAABBB",
                  {Measured(Job("A", 0, 1, 4), linear), Measured(Job("B", 0, 1, 4), poor),
                   Job("C", 0, 1, 1)},
                  "A keep w1,w2,w3; B shrink w4,w5 -w6>C; C keep"},
                 {"whatever the order",
                  "AAABBB",
                  {Measured(Job("A", 0, 1, 4), poor), Measured(Job("B", 0, 1, 4), linear),
                   Job("C", 0, 1, 1)},
                  "A shrink w1,w2 -w3>C; B keep w4,w5,w6; C keep"},
                 {"one worker at a time: the loss at the planned size",
                  "AAAABBB",
                  {Measured(Job("A", 0, 1, 4), linear), Measured(Job("B", 0, 1, 3), poor),
                   Job("C", 0, 2, 2)},
                  "A shrink w1,w2,w3 -w4>C; B shrink w5,w6 -w7>C; C keep"},
                 {"equal losses: the newest gives",
                  "AABB",
                  {Job("A", 0, 1, 2), Job("B", 0, 1, 2), Job("C", 0, 1, 1)},
                  "A keep w1,w2; B shrink w3 -w4>C; C keep"},
             });
  const ScheduleInput in = Input(
      SchedulingPolicy::kElastic,
      {Measured(Job("A", 0, 1, 4), linear), Measured(Job("B", 0, 1, 4), poor), Job("C", 0, 1, 1)},
      "AAABBB");
  EXPECT_THAT(PlanOf(Decide(in), "B").why, HasSubstr("loses least (expected -17% samples/s)"));
}

TEST(SchedulePolicy, Elastic_EqualPriorityWaits_ReformIntervalAndReallocationRespected) {
  ExpectRows(SchedulingPolicy::kElastic,
             {
                 {"no shrink at 5s",
                  "AAAA",
                  {ChangedAgo(Job("A", 0, 2, 4), 5), Job("B", 0, 2, 2)},
                  "A keep w1,w2,w3,w4; B keep"},
                 {"shrinks at 10s",
                  "AAAA",
                  {ChangedAgo(Job("A", 0, 2, 4), 10), Job("B", 0, 2, 2)},
                  "A shrink w1,w2 -w3,w4>B; B keep"},
                 {"not while reallocating",
                  "AAAA",
                  {Reallocating(Job("A", 0, 2, 4)), Job("B", 0, 2, 2)},
                  "A keep w1,w2,w3,w4; B keep"},
                 {"an unsettled peer is passed over (it would be the one, as the newest)",
                  "AABB",
                  {Job("A", 0, 1, 2), ChangedAgo(Job("B", 0, 1, 2), 5), Job("C", 0, 1, 1)},
                  "A shrink w1 -w2>C; B keep w3,w4; C keep"},
                 {"not enough settled yet: nobody moves",
                  "AABB",
                  {Job("A", 0, 1, 2), ChangedAgo(Job("B", 0, 1, 2), 5), Job("C", 0, 2, 2)},
                  "A keep w1,w2; B keep w3,w4; C keep"},
             });
  const ScheduleInput in = Input(SchedulingPolicy::kElastic,
                                 {ChangedAgo(Job("A", 0, 2, 4), 4), Job("B", 0, 2, 2)}, "AAAA");
  EXPECT_THAT(
      PlanOf(Decide(in), "B").why,
      AllOf(HasSubstr("pool is full"), HasSubstr("job A (priority 0) may give workers in 6.0s")));
}

TEST(SchedulePolicy, Elastic_WaitingJob_SaysWhoReleasesWorkers) {
  const ScheduleInput in =
      Input(SchedulingPolicy::kElastic, {Job("A", 0, 2, 4), Job("B", 10, 2, 2)}, "AAAA");
  const std::vector<JobPlan> plans = Decide(in);
  EXPECT_THAT(PlanOf(plans, "A").why, AllOf(HasSubstr("from 4 to 2 workers"), HasSubstr("job B")));
  EXPECT_EQ(PlanOf(plans, "B").why, "waiting for 2 workers released by job A");
  const ScheduleInput in2 =
      Input(SchedulingPolicy::kElastic, {Job("A", 0, 2, 4), Job("C", 10, 4, 4)}, "AAAA");
  EXPECT_THAT(PlanOf(Decide(in2), "A").why, HasSubstr("preempted for job C (priority 10)"));
}

TEST(SchedulePolicy, Elastic_WithinReformInterval_NothingChangesUntilItPasses) {
  ExpectRows(SchedulingPolicy::kElastic,
             {
                 {"no shrink at 5s",
                  "AAAA",
                  {ChangedAgo(Job("A", 0, 2, 4), 5), Job("B", 10, 2, 2)},
                  "A keep w1,w2,w3,w4; B keep"},
                 {"shrinks at 10s",
                  "AAAA",
                  {ChangedAgo(Job("A", 0, 2, 4), 10), Job("B", 10, 2, 2)},
                  "A shrink w1,w2 -w3,w4>B; B keep"},
                 {"no preemption at 5s",
                  "AAAA",
                  {ChangedAgo(Job("A", 0, 2, 4), 5), Job("C", 10, 4, 4)},
                  "A keep w1,w2,w3,w4; C keep"},
                 {"no growth at 5s", "AA..", {ChangedAgo(Job("A", 0, 2, 4), 5)}, "A keep w1,w2"},
                 {"grows at 10s",
                  "AA..",
                  {ChangedAgo(Job("A", 0, 2, 4), 10)},
                  "A grow w1,w2,w3,w4 +w3,w4"},
             });
  const ScheduleInput in = Input(SchedulingPolicy::kElastic,
                                 {ChangedAgo(Job("A", 0, 2, 4), 4), Job("B", 10, 2, 2)}, "AAAA");
  EXPECT_THAT(
      PlanOf(Decide(in), "B").why,
      AllOf(HasSubstr("pool is full"), HasSubstr("job A (priority 0) may give workers in 6.0s")));
}

TEST(SchedulePolicy, Elastic_ReallocatingJob_IsLeftAlone) {
  ExpectRows(SchedulingPolicy::kElastic,
             {
                 {"not shrunk",
                  "AAAA",
                  {Reallocating(Job("A", 0, 2, 4)), Job("B", 10, 2, 2)},
                  "A keep w1,w2,w3,w4; B keep"},
                 {"not grown", "AA..", {Reallocating(Job("A", 0, 2, 4))}, "A keep w1,w2"},
                 {"a queued one not started", "..", {Reallocating(Job("A", 0, 2, 4))}, "A keep"},
             });
}

TEST(SchedulePolicy, Elastic_PromisedWorkers_GoToTheirJobOnceFreeAndAreTakenOnce) {
  struct Case {
    std::string name;
    std::string pool;
    // Which workers (1-based) are promised to B.
    std::vector<int> promised;
    std::vector<SchedJob> jobs;
    std::string want;
    std::string b_why;
  } cases[] = {
      {"still busy: B waits",
       "AAAA",
       {3, 4},
       {Reallocating(Job("A", 0, 2, 4)), Job("B", 10, 2, 2)},
       "A keep w1,w2,w3,w4; B keep",
       "waiting for 2 workers released by job A"},
      {"still busy and A could shrink again: nothing more is taken",
       "AAAA",
       {3, 4},
       {Job("A", 0, 2, 4), Job("B", 10, 2, 2)},
       "A keep w1,w2,w3,w4; B keep",
       "waiting for 2 workers released by job A"},
      {"free: B starts on them",
       "AA..",
       {3, 4},
       {Job("A", 0, 2, 4), Job("B", 10, 2, 2)},
       "A keep w1,w2; B start w3,w4",
       "starts on 2 workers (min_workers)"},
      {"a higher job can't have them",
       "AA..",
       {3, 4},
       {Job("A", 30, 2, 2), Job("B", 0, 2, 2), Job("D", 20, 2, 2)},
       "A keep w1,w2; B start w3,w4; D keep",
       ""},
      {"one still busy: the free one and the rest of the need are kept for B",
       "AAA..",
       {3, 4},
       {Reallocating(Job("A", 0, 2, 4)), Job("B", 10, 3, 3), Job("E", 0, 1, 1)},
       "A keep w1,w2,w3; B keep; E keep",
       "waiting for 1 worker released by job A"},
      {"growth leaves them alone",
       "AA..",
       {3, 4},
       {Job("A", 20, 2, 4), Job("B", 0, 3, 3)},
       "A keep w1,w2; B keep",
       ""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    ScheduleInput in = Input(SchedulingPolicy::kElastic, c.jobs, c.pool);
    for (int w : c.promised) in.workers[w - 1].reserved_for = "B";
    const std::vector<JobPlan> plans = Decide(in);
    EXPECT_EQ(Show(plans), c.want);
    if (!c.b_why.empty()) {
      EXPECT_EQ(PlanOf(plans, "B").why, c.b_why);
    }
  }
}

TEST(SchedulePolicy, Elastic_StalePromises_AreVoid) {
  // To a job gone, or one that runs already: anyone may have the worker.
  for (const char* to : {"Z", "A"}) {
    SCOPED_TRACE(to);
    ScheduleInput in =
        Input(SchedulingPolicy::kElastic, {Job("A", 0, 1, 1), Job("D", 0, 1, 1)}, "A.");
    in.workers[1].reserved_for = to;
    EXPECT_EQ(Show(Decide(in)), "A keep w1; D start w2");
  }
}

TEST(SchedulePolicy, Elastic_BlockedHigherJob_KeepsFittingFreeWorkersButNotOthers) {
  ScheduleInput in =
      Input(SchedulingPolicy::kElastic,
            {Job("E", 20, 2, 2), Job("H", 10, 3, 3), Job("L", 0, 1, 1), Job("G", 0, 1, 1)}, "EE..");
  // One free worker H can't use: L may start there; the other is kept for H.
  in.workers[3].device_kind = "cuda";
  in.jobs[3].device_kind = "cuda";
  const std::vector<JobPlan> plans = Decide(in);
  EXPECT_EQ(Show(plans), "E keep w1,w2; H keep; L keep; G start w4");
  EXPECT_THAT(PlanOf(plans, "L").why, HasSubstr("queued behind job H (priority 10)"));
  EXPECT_THAT(PlanOf(plans, "H").why, HasSubstr("the pool is full: it needs 3 cpu workers"));
}

TEST(SchedulePolicy, Elastic_SpareWorkers_GoWhereMeasuredThroughputGainsMost) {
  const std::map<uint32_t, double> linear = {{1, 100}, {2, 200}};  // gains 1/2, then 1/3
  const std::map<uint32_t, double> poor = {{1, 100}, {2, 150}};    // gains 1/5 at 2
  ExpectRows(SchedulingPolicy::kElastic,
             {
                 {"the larger gain",
                  "AABB.",
                  {Measured(Job("A", 0, 1, 4), poor), Measured(Job("B", 0, 1, 4), linear)},
                  "A keep w1,w2; B grow w3,w4,w5 +w5"},
                 {"the larger gain, whatever the order",
                  "AABB.",
                  {Measured(Job("A", 0, 1, 4), linear), Measured(Job("B", 0, 1, 4), poor)},
                  "A grow w1,w2,w5 +w5; B keep w3,w4"},
                 {"one at a time: the gain at the planned size",
                  "AABB..",
                  {Measured(Job("A", 0, 1, 3), linear), Measured(Job("B", 0, 1, 4), poor)},
                  "A grow w1,w2,w5 +w5; B grow w3,w4,w6 +w6"},
                 {"both to the linear one while it gains more",
                  "AABB..",
                  {Measured(Job("A", 0, 1, 4), linear), Measured(Job("B", 0, 1, 4), poor)},
                  "A grow w1,w2,w5,w6 +w5,w6; B keep w3,w4"},
                 {"an unmeasured job is tried larger",
                  "AABB.",
                  {Measured(Job("A", 0, 1, 4), linear), Job("B", 0, 1, 4)},
                  "A keep w1,w2; B grow w3,w4,w5 +w5"},
                 {"equal gains: the older job",
                  "AABB.",
                  {Job("A", 0, 1, 4), Job("B", 0, 1, 4)},
                  "A grow w1,w2,w5 +w5; B keep w3,w4"},
                 {"no gain: no growth",
                  "AAZ.",
                  {Measured(Job("A", 0, 1, 4), {{1, 100}, {2, 100}, {3, 100}}), Job("Z", 9, 1, 1)},
                  "A keep w1,w2; Z keep w3"},
                 {"alone, it grows whatever the gain: nobody else could use them",
                  "AA.",
                  {Measured(Job("A", 0, 1, 4), {{1, 100}, {2, 100}, {3, 100}})},
                  "A grow w1,w2,w3 +w3"},
             });
  const ScheduleInput in =
      Input(SchedulingPolicy::kElastic, {Measured(Job("A", 0, 1, 4), linear)}, "AA.");
  EXPECT_EQ(PlanOf(Decide(in), "A").why,
            "grows from 2 to 3 workers on free workers (expected +50% samples/s)");
}

TEST(SchedulePolicy, Elastic_Growth_HigherPriorityFirstUpToMax) {
  const std::map<uint32_t, double> linear = {{1, 100}, {2, 200}};
  ExpectRows(
      SchedulingPolicy::kElastic,
      {
          {"the higher priority first, though it gains less",
           "AB...",
           {Measured(Job("A", 0, 1, 4), linear), Measured(Job("B", 5, 1, 2), {{1, 100}, {2, 110}})},
           "A grow w1,w4,w5 +w4,w5; B grow w2,w3 +w3"},
          {"never past max", "A....", {Job("A", 0, 1, 3)}, "A grow w1,w2,w3 +w2,w3"},
          {"a job started now does not grow too",
           "A...",
           {Job("A", 0, 1, 1), Job("B", 0, 1, 4)},
           "A keep w1; B start w2"},
      });
}

// A grow pauses the job: it is worth one only for a gain of 10% or more.
TEST(SchedulePolicy, Elastic_Growth_OnlyWhenTheRoundGainsEnough) {
  // a = 0.6: T(2) = 125, T(3) = 136 (+9%), T(4) = 143 (+14%).
  const std::map<uint32_t, double> poor = {{1, 100}, {2, 125}};
  ExpectRows(SchedulingPolicy::kElastic,
             {
                 {"one more worker gains 9%: not worth a pause",
                  "AAZ.",
                  {Measured(Job("A", 0, 1, 4), poor), Job("Z", 9, 1, 1)},
                  "A keep w1,w2; Z keep w3"},
                 {"two gain 14%: both in one grow",
                  "AAZ..",
                  {Measured(Job("A", 0, 1, 4), poor), Job("Z", 9, 1, 1)},
                  "A grow w1,w2,w4,w5 +w4,w5; Z keep w3"},
                 {"one each would gain 9% each: the newer is left out, the older gets both",
                  "AABB..",
                  {Measured(Job("A", 0, 1, 4), poor), Measured(Job("B", 0, 1, 4), poor)},
                  "A grow w1,w2,w5,w6 +w5,w6; B keep w3,w4"},
                 {"an unmeasured job is tried larger whatever it gains",
                  "AAAAAAAAAAAA.",
                  {Job("A", 0, 1, 16)},
                  "A grow w1,w2,w3,w4,w5,w6,w7,w8,w9,w10,w11,w12,w13 +w13"},
             });
  const ScheduleInput in =
      Input(SchedulingPolicy::kElastic, {Measured(Job("A", 0, 1, 4), poor)}, "AA..");
  EXPECT_EQ(PlanOf(Decide(in), "A").why,
            "grows from 2 to 4 workers on free workers (expected +14% samples/s)");
}

TEST(SchedulePolicy, Elastic_SelectorAndDeviceKind_AreRespected) {
  ScheduleInput in = Input(SchedulingPolicy::kElastic,
                           {Job("A", 0, 2, 2), Job("B", 0, 1, 1), Job("C", 0, 1, 1)}, "....");
  const std::map<std::string, std::string> zones[] = {
      {{"zone", "a"}}, {{"zone", "b"}}, {}, {{"zone", "a"}, {"rack", "3"}}};
  for (int i = 0; i < 4; ++i) {
    in.workers[i].labels = zones[i];
    in.workers[i].device_kind = i == 2 ? "cpu" : "cuda";
  }
  in.jobs[0].device_kind = "cuda";
  in.jobs[0].selector = {{"zone", "a"}};
  in.jobs[2].device_kind = "cuda";
  EXPECT_EQ(Show(Decide(in)), "A start w1,w4; B start w3; C start w2");

  // A shrink gives up only workers the waiting job can use.
  in = Input(SchedulingPolicy::kElastic, {Job("L", 0, 1, 4), Job("H", 10, 2, 2)}, "LLLL");
  for (int i : {0, 1, 2}) in.workers[i].labels = {{"zone", "a"}};
  in.workers[3].labels = {{"zone", "b"}};
  in.jobs[1].selector = {{"zone", "a"}};
  EXPECT_EQ(Show(Decide(in)), "L shrink w1,w4 -w2,w3>H; H keep");
}

// What the coordinator knows beyond kind and labels: a worker that can't run
// a job (a library program, a failed prepare) is not given to it; a job of
// no kind takes any worker; a job that can't be preempted is only shrunk.
TEST(SchedulePolicy, Elastic_CannotRunAnyKindAndNotPreemptible_AreRespected) {
  ScheduleInput in =
      Input(SchedulingPolicy::kElastic, {Job("A", 0, 2, 2), Job("B", 0, 1, 1)}, "...");
  in.workers[0].cannot_run = {"A"};
  in.workers[2].device_kind = "cuda";
  in.jobs[0].device_kind = "";
  EXPECT_EQ(Show(Decide(in)), "A start w2,w3; B start w1");

  SchedJob a = Job("A", 0, 2, 4);
  a.preemptible = false;
  SchedJob shrinkable = Job("A", 0, 1, 4);
  shrinkable.preemptible = false;
  ExpectRows(SchedulingPolicy::kElastic,
             {
                 {"not preemptible: C, needing four, waits; A is not even shrunk",
                  "AAAA",
                  {a, Job("C", 10, 4, 4)},
                  "A keep w1,w2,w3,w4; C keep"},
                 {"a preemptible one goes instead, and A shrinks",
                  "AAADD",
                  {Job("D", 0, 2, 2), shrinkable, Job("C", 10, 4, 4)},
                  "D preempt -w4,w5>C; A shrink w1 -w2,w3>C; C keep"},
             });
}

// Once a job preempted for another has let its workers go, they go to that
// job, not back to the preempted one (queued again, of lower priority).
TEST(SchedulePolicy, Elastic_PreemptedWorkers_GoToTheJobTheyWereTakenFor) {
  SchedJob b = Job("B", 0, 2, 2);
  b.preemptible = false;
  ScheduleInput in = Input(
      SchedulingPolicy::kElastic,
      {Job("A", 0, 2, 4), b, Job("C", 5, 1, 2), Job("D", 0, 1, 1), Job("E", 10, 2, 2)}, "BB..");
  in.workers[2].reserved_for = "E";
  EXPECT_EQ(Show(Decide(in)), "A keep; B keep w1,w2; C keep; D keep; E start w3,w4");
}

TEST(SchedulePolicy, NeverFits_SaysWhatItNeedsAndHoldsNobodyBack) {
  for (SchedulingPolicy policy : {SchedulingPolicy::kElastic, SchedulingPolicy::kFifoGang,
                                  SchedulingPolicy::kPriorityPreempt}) {
    SCOPED_TRACE(static_cast<int>(policy));
    ScheduleInput in = Input(policy, {Job("A", 10, 2, 2), Job("B", 0, 1, 1)}, "...");
    in.jobs[0].device_kind = "cuda";
    in.jobs[0].selector = {{"zone", "c"}};
    const std::vector<JobPlan> plans = Decide(in);
    EXPECT_EQ(Show(plans), "A keep; B start w1");
    EXPECT_THAT(PlanOf(plans, "A").why, AllOf(HasSubstr("can't start on the pool as it is"),
                                              HasSubstr("2 cuda workers with labels zone=c"),
                                              HasSubstr("the pool has 0 such of 3 workers")));
  }
}

TEST(SchedulePolicy, Quota_CapsStartsAndGrowthPerOwner) {
  struct Case {
    std::string name;
    std::string pool;
    std::vector<SchedJob> jobs;
    uint32_t quota;
    std::string want;
  } cases[] = {
      {"a start over quota waits",
       "AA..",
       {Job("A", 0, 2, 2), Job("B", 0, 2, 2)},
       3,
       "A keep w1,w2; B keep"},
      {"within quota it starts",
       "AA..",
       {Job("A", 0, 2, 2), Job("B", 0, 2, 2)},
       4,
       "A keep w1,w2; B start w3,w4"},
      {"jobs starting together count",
       "......",
       {Job("A", 0, 2, 2), Job("B", 0, 2, 2), Job("C", 0, 2, 2)},
       4,
       "A start w1,w2; B start w3,w4; C keep"},
      {"growth stops at the quota", "AA..", {Job("A", 0, 2, 4)}, 3, "A grow w1,w2,w3 +w3"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    ScheduleInput in = Input(SchedulingPolicy::kElastic, c.jobs, c.pool);
    in.owner_quota = {{"alice", c.quota}};
    EXPECT_EQ(Show(Decide(in)), c.want);
  }
  ScheduleInput in =
      Input(SchedulingPolicy::kElastic, {Job("A", 0, 2, 2), Job("B", 0, 2, 2)}, "AA..");
  in.owner_quota = {{"alice", 3}};
  EXPECT_EQ(PlanOf(Decide(in), "B").why,
            "waits for owner alice's quota: its jobs may hold 3 workers, they hold 2 and this one "
            "needs 2");
  in.owner_quota = {{"alice", 1}};
  EXPECT_THAT(PlanOf(Decide(in), "B").why, HasSubstr("quota (1 worker) is below the 2 it needs"));
}

TEST(SchedulePolicy, Quota_AJobWaitingForARelease_CountsAgainstItsOwner) {
  // B waits for two of bob's workers (and keeps the two free ones): C, of
  // the same owner, waits for the quota, not only behind B.
  ScheduleInput in = Input(SchedulingPolicy::kElastic,
                           {Job("A", 0, 2, 4), Job("B", 10, 4, 4), Job("C", 5, 2, 2)}, "AAAA..");
  in.jobs[0].owner = "bob";
  in.owner_quota = {{"alice", 4}};
  const std::vector<JobPlan> plans = Decide(in);
  EXPECT_EQ(Show(plans), "A shrink w1,w2 -w3,w4>B; B keep; C keep");
  EXPECT_THAT(PlanOf(plans, "C").why, HasSubstr("alice's quota"));
}

// Carries the plan out at once (every step boundary passed, every release
// done) and returns the input `later` on.
ScheduleInput Apply(ScheduleInput in, const std::vector<JobPlan>& plans, absl::Duration later) {
  auto has = [](const std::vector<std::string>& ids, const std::string& id) {
    return std::find(ids.begin(), ids.end(), id) != ids.end();
  };
  for (size_t i = 0; i < plans.size(); ++i) {
    if (plans[i].action != JobAction::kKeep) in.jobs[i].allocated_at = in.now;
    for (SchedWorker& w : in.workers) {
      if (has(plans[i].removed, w.id)) {
        w.job_id.clear();
        w.reserved_for = plans[i].removed_for;
      }
      if (has(plans[i].added, w.id)) {
        w.job_id = in.jobs[i].id;
        w.reserved_for.clear();
      }
    }
  }
  in.now += later;
  return in;
}

// The job ends: its workers go back to the pool.
void Finish(ScheduleInput* in, const std::string& id) {
  for (SchedWorker& w : in->workers) {
    if (w.job_id == id) w.job_id.clear();
  }
  in->jobs.erase(std::find_if(in->jobs.begin(), in->jobs.end(),
                              [&](const SchedJob& job) { return job.id == id; }));
}

// The two real-process scenarios, round by round.
TEST(SchedulePolicy, Elastic_Story_ShrinkForBThenGrowBackThenPreemptForC) {
  ScheduleInput in = Input(SchedulingPolicy::kElastic, {Job("A", 0, 2, 4)}, "AAAA");
  in.jobs.push_back(Job("B", 10, 2, 2));
  in.jobs.back().sequence = 2;
  std::vector<JobPlan> plans = Decide(in);
  EXPECT_EQ(Show(plans), "A shrink w1,w2 -w3,w4>B; B keep");
  in = Apply(in, plans, absl::Seconds(1));
  plans = Decide(in);
  EXPECT_EQ(Show(plans), "A keep w1,w2; B start w3,w4");
  in = Apply(in, plans, absl::Seconds(60));
  in.jobs.push_back(Job("C", 10, 4, 4));
  in.jobs.back().sequence = 3;
  plans = Decide(in);
  EXPECT_EQ(Show(plans), "A keep w1,w2; B keep w3,w4; C keep");  // B can't be taken from
  Finish(&in, "B");
  plans = Decide(in);
  EXPECT_EQ(Show(plans), "A preempt -w1,w2>C; C keep");
  in = Apply(in, plans, absl::Seconds(1));
  plans = Decide(in);
  EXPECT_EQ(Show(plans), "A keep; C start w1,w2,w3,w4");
  in = Apply(in, plans, absl::Seconds(60));
  Finish(&in, "C");
  plans = Decide(in);
  EXPECT_EQ(Show(plans), "A start w1,w2,w3,w4");  // alone again: all it can use
  in = Apply(in, plans, absl::Seconds(60));
  EXPECT_EQ(Show(Decide(in)), "A keep w1,w2,w3,w4");
}

// ---- The baselines ---------------------------------------------------------

TEST(SchedulePolicy, FifoGang_HeadOfLineBlocksAndNothingMoves) {
  ExpectRows(SchedulingPolicy::kFifoGang,
             {
                 {"at max only", "....", {Job("A", 0, 1, 3)}, "A start w1,w2,w3"},
                 {"the head blocks a job that would fit",
                  "A...",
                  {Job("A", 0, 1, 1), Job("B", 0, 4, 4), Job("C", 0, 1, 1)},
                  "A keep w1; B keep; C keep"},
                 {"priority is ignored, nobody preempted",
                  "AAA.",
                  {Job("A", 0, 1, 3), Job("B", 0, 2, 2), Job("C", 10, 1, 1)},
                  "A keep w1,w2,w3; B keep; C keep"},
                 {"nothing grows", "A..", {Job("A", 0, 1, 3)}, "A keep w1"},
             });
  const ScheduleInput in = Input(SchedulingPolicy::kFifoGang,
                                 {Job("A", 0, 1, 1), Job("B", 0, 4, 4), Job("C", 0, 1, 1)}, "A...");
  EXPECT_THAT(PlanOf(Decide(in), "C").why, HasSubstr("queued behind job B,"));
}

TEST(SchedulePolicy, PriorityPreempt_PreemptsWholeJobsAndBlocksBehind) {
  ExpectRows(SchedulingPolicy::kPriorityPreempt,
             {
                 {"a whole job, where elastic would shrink",
                  "AAAA",
                  {Job("A", 0, 2, 4), Job("B", 10, 2, 2)},
                  "A preempt -w1,w2,w3,w4>B; B keep"},
                 {"the lowest, newest first, only as many as needed",
                  "AADD",
                  {Job("A", 0, 2, 2), Job("D", 0, 2, 2), Job("B", 10, 2, 2)},
                  "A keep w1,w2; D preempt -w3,w4>B; B keep"},
                 {"at max", "....", {Job("A", 0, 1, 3)}, "A start w1,w2,w3"},
                 {"blocked: lower and equal jobs behind wait",
                  "EE..",
                  {Job("E", 20, 2, 2), Job("C", 10, 4, 4), Job("D", 5, 1, 1), Job("F", 10, 1, 1)},
                  "E keep w1,w2; C keep; D keep; F keep"},
                 {"a higher job is not blocked",
                  "EE..",
                  {Job("E", 20, 2, 2), Job("C", 10, 4, 4), Job("H", 30, 1, 1)},
                  "E keep w1,w2; C keep; H start w3"},
             });
}

// ---- The invariants, over inputs nobody wrote by hand --------------------

// A pool of cpu and cuda workers in two zones, jobs queued and running (on
// workers that fit them), some reallocating or recently changed, promises
// and quotas: whatever the policy, the plan keeps the contract.
ScheduleInput RandomInput(std::mt19937* rng, SchedulingPolicy policy) {
  auto pick = [&](int n) { return static_cast<int>((*rng)() % n); };
  ScheduleInput in = Input(policy, {}, std::string(4 + pick(12), '.'));
  for (SchedWorker& w : in.workers) {
    w.device_kind = pick(4) == 0 ? "cuda" : "cpu";
    w.labels = {{"zone", pick(2) ? "a" : "b"}};
  }
  const int jobs = 1 + pick(6);
  for (int j = 0; j < jobs; ++j) {
    const uint32_t min = 1 + pick(3);
    SchedJob job = Job(std::string(1, 'A' + j), pick(3) * 10, min, min + pick(3));
    job.sequence = j + 1;
    job.owner = pick(2) ? "alice" : "bob";
    if (pick(4) == 0) job.device_kind = "cuda";
    if (pick(3) == 0) job.selector = {{"zone", "a"}};
    job.reallocating = pick(5) == 0;
    job.allocated_at = kNow - absl::Seconds(pick(20));
    if (pick(2)) job.throughput = {{1, 100}, {2, 100.0 + pick(100)}};
    if (pick(2)) {  // running, on free workers that fit it
      const uint32_t size = job.min_workers + pick(job.max_workers - job.min_workers + 1);
      std::vector<SchedWorker*> taken;
      for (SchedWorker& w : in.workers) {
        if (taken.size() < size && w.job_id.empty() && FitsJob(w, job)) taken.push_back(&w);
      }
      for (SchedWorker* w : taken) w->job_id = job.id;
    }
    in.jobs.push_back(job);
  }
  for (SchedWorker& w : in.workers) {
    if (pick(4) == 0) w.reserved_for = std::string(1, 'A' + pick(jobs + 1));
  }
  if (pick(2)) in.owner_quota["alice"] = pick(8);
  return in;
}

TEST(SchedulePolicy, AnyInput_PlanKeepsTheContract) {
  std::mt19937 rng(24);
  for (int i = 0; i < 3000; ++i) {
    for (SchedulingPolicy policy : {SchedulingPolicy::kElastic, SchedulingPolicy::kFifoGang,
                                    SchedulingPolicy::kPriorityPreempt}) {
      const ScheduleInput in = RandomInput(&rng, policy);
      SCOPED_TRACE(absl::StrCat("input ", i, " policy ", static_cast<int>(policy)));
      ExpectValidPlan(in, DecideSchedule(in));
      if (HasFailure()) return;
    }
  }
}

TEST(SchedulePolicy, ExpectValidPlan_CatchesAWorkerGivenTwice) {
  const ScheduleInput in =
      Input(SchedulingPolicy::kElastic, {Job("A", 0, 1, 1), Job("B", 0, 1, 1)}, "..");
  std::vector<JobPlan> plans = DecideSchedule(in);
  plans[1].workers = plans[1].added = plans[0].workers;
  EXPECT_NONFATAL_FAILURE(ExpectValidPlan(in, plans), "given twice");
}

}  // namespace
}  // namespace ddp
