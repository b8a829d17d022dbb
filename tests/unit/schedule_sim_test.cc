// The scheduling simulator (bench/schedule_sim_core) over a small trace with
// the real policy, for each policy: what it reports must be a schedule that
// could have happened. Every job ends with all its work done, no worker is in
// two jobs at once, and no job runs under its min or over its max.
#include "bench/schedule_sim_core.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "bench/schedule_sim_json.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ddp {
namespace {

using ::testing::HasSubstr;

TraceJob Job(std::string id, double submit_s, uint32_t min, uint32_t max, int64_t priority,
             double minutes_on_max, double a) {
  TraceJob job;
  job.id = std::move(id);
  job.owner = job.id.back() % 2 ? "alice" : "bob";
  job.priority = priority;
  job.submit = absl::Seconds(submit_s);
  job.t1 = 10;
  job.a = a;
  job.min_workers = min;
  job.max_workers = max;
  job.work = minutes_on_max * 60 * TrueThroughput(job, max);
  return job;
}

// 12 jobs on 8 workers: gangs that don't all fit, a high-priority job that
// must take workers from running ones, jobs that can grow.
Trace SmallTrace() {
  Trace trace;
  trace.workers = 8;
  trace.jobs = {
      Job("j00", 0, 2, 4, 0, 20, 0.05),   Job("j01", 30, 1, 2, 0, 10, 0.1),
      Job("j02", 60, 2, 8, 0, 15, 0.02),  Job("j03", 90, 1, 1, 0, 5, 0),
      Job("j04", 120, 2, 6, 10, 8, 0.1),  Job("j05", 300, 1, 4, 0, 12, 0.3),
      Job("j06", 420, 4, 8, 5, 10, 0.01), Job("j07", 600, 1, 2, 0, 3, 0.05),
      Job("j08", 900, 1, 1, 10, 4, 0),    Job("j09", 1200, 2, 4, 0, 25, 0.15),
      Job("j10", 1500, 8, 8, 0, 6, 0.05), Job("j11", 1800, 1, 3, 5, 9, 0.2),
  };
  return trace;
}

struct Held {
  std::string worker;
  absl::Duration from;
  absl::Duration to;
  std::string job;
};

void ExpectPossible(const Trace& trace, const SimResult& result) {
  ASSERT_EQ(result.jobs.size(), trace.jobs.size());
  std::vector<Held> held;
  for (size_t j = 0; j < trace.jobs.size(); ++j) {
    const TraceJob& spec = trace.jobs[j];
    const JobOutcome& out = result.jobs[j];
    SCOPED_TRACE(spec.id);
    EXPECT_EQ(out.id, spec.id);
    ASSERT_FALSE(out.segments.empty());
    EXPECT_GE(out.first_start, spec.submit);
    EXPECT_EQ(out.segments.front().from, out.first_start);
    EXPECT_EQ(out.segments.back().to, out.end);
    EXPECT_GT(out.end, out.first_start);
    double work = 0;
    for (size_t k = 0; k < out.segments.size(); ++k) {
      const SimSegment& seg = out.segments[k];
      const auto n = static_cast<uint32_t>(seg.workers.size());
      EXPECT_LT(seg.from, seg.to);
      if (k > 0) {
        EXPECT_LE(out.segments[k - 1].to, seg.from);
      }
      EXPECT_GE(n, spec.min_workers);
      EXPECT_LE(n, spec.max_workers);
      if (seg.rate != 0) {
        EXPECT_DOUBLE_EQ(seg.rate, TrueThroughput(spec, n));
      }
      work += seg.rate * absl::ToDoubleSeconds(seg.to - seg.from);
      for (const std::string& w : seg.workers) held.push_back({w, seg.from, seg.to, spec.id});
    }
    EXPECT_NEAR(work, spec.work, spec.work * 1e-6);
    EXPECT_DOUBLE_EQ(out.work_done, spec.work);
  }
  std::sort(held.begin(), held.end(), [](const Held& a, const Held& b) {
    return std::tie(a.worker, a.from) < std::tie(b.worker, b.from);
  });
  for (size_t k = 1; k < held.size(); ++k) {
    if (held[k].worker != held[k - 1].worker) continue;
    EXPECT_LE(held[k - 1].to, held[k].from)
        << held[k].worker << " in " << held[k - 1].job << " and " << held[k].job;
  }
  EXPECT_GT(result.busy_worker_seconds, 0);
  EXPECT_LE(result.training_worker_seconds, result.busy_worker_seconds);
  EXPECT_LE(result.busy_worker_seconds,
            trace.workers * absl::ToDoubleSeconds(result.makespan) * (1 + 1e-9));
}

class ScheduleSimTest : public ::testing::TestWithParam<SchedulingPolicy> {};

TEST_P(ScheduleSimTest, SmallTrace_EndsAsASchedulePossibleOnThePool) {
  const Trace trace = SmallTrace();
  auto result = Simulate(trace, GetParam());
  ASSERT_THAT(result, IsOk());
  ExpectPossible(trace, *result);
  // The trace makes the policies use what they have, so the checks above
  // cover preemptions and shrinks too.
  uint32_t preemptions = 0, shrinks = 0;
  for (const JobOutcome& out : result->jobs) {
    preemptions += out.preemptions;
    shrinks += out.shrinks;
  }
  if (GetParam() != SchedulingPolicy::kFifoGang) {
    EXPECT_GT(preemptions, 0u);
  }
  if (GetParam() == SchedulingPolicy::kElastic) {
    EXPECT_GT(shrinks, 0u);
    return;
  }
  // The gang policies run every job on max_workers and never resize one.
  for (size_t j = 0; j < trace.jobs.size(); ++j) {
    EXPECT_EQ(result->jobs[j].grows + result->jobs[j].shrinks, 0u) << trace.jobs[j].id;
    for (const SimSegment& seg : result->jobs[j].segments) {
      EXPECT_EQ(seg.workers.size(), trace.jobs[j].max_workers) << trace.jobs[j].id;
    }
    if (GetParam() == SchedulingPolicy::kFifoGang) {
      EXPECT_EQ(result->jobs[j].preemptions, 0u) << trace.jobs[j].id;
    }
  }
}

TEST_P(ScheduleSimTest, SmallTrace_JsonOutputReadsBack) {
  const Trace trace = SmallTrace();
  auto result = Simulate(trace, GetParam());
  ASSERT_THAT(result, IsOk());
  google::protobuf::Struct out;
  ASSERT_TRUE(
      google::protobuf::util::JsonStringToMessage(ResultToJson(trace, *result, true), &out).ok());
  const auto& totals = out.fields().at("totals").struct_value().fields();
  EXPECT_EQ(totals.at("jobs").number_value(), 12);
  EXPECT_NEAR(totals.at("makespan_s").number_value(), absl::ToDoubleSeconds(result->makespan),
              1e-3);
  EXPECT_EQ(out.fields().at("jobs").list_value().values_size(), 12);
}

INSTANTIATE_TEST_SUITE_P(Policies, ScheduleSimTest,
                         ::testing::Values(SchedulingPolicy::kFifoGang,
                                           SchedulingPolicy::kPriorityPreempt,
                                           SchedulingPolicy::kElastic),
                         [](const auto& info) {
                           std::string name = PolicyName(info.param);
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

TEST(ScheduleSim, Simulate_JobLargerThanThePool_FailsNamingIt) {
  Trace trace = SmallTrace();
  trace.jobs[3].min_workers = trace.jobs[3].max_workers = 9;
  EXPECT_THAT(Simulate(trace, SchedulingPolicy::kElastic),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("j03")));
}

TEST(ScheduleSim, Simulate_TooManyEvents_FailsInsteadOfSpinning) {
  Trace trace = SmallTrace();
  trace.max_events = 5;
  EXPECT_THAT(Simulate(trace, SchedulingPolicy::kElastic),
              StatusIs(absl::StatusCode::kResourceExhausted));
}

TEST(ScheduleSim, ParseTrace_ReadsEveryField) {
  auto trace = ParseTrace(R"({"workers": 8, "reform_pause_s": 5, "checkpoint_pause_s": 20,
      "restart_pause_s": 25, "reform_min_interval_s": 30, "max_events": 100,
      "owner_quota": {"alice": 4}, "meta": {"seed": 1},
      "jobs": [{"id": "a", "owner": "alice", "priority": 3, "submit_s": 1.5, "work": 100,
                "t1": 2, "a": 0.25, "min_workers": 1, "max_workers": 4, "preemptible": false}]})");
  ASSERT_THAT(trace, IsOk());
  EXPECT_EQ(trace->workers, 8u);
  EXPECT_EQ(trace->costs.reform_pause, absl::Seconds(5));
  EXPECT_EQ(trace->costs.checkpoint_pause, absl::Seconds(20));
  EXPECT_EQ(trace->costs.restart_pause, absl::Seconds(25));
  EXPECT_EQ(trace->costs.reform_min_interval, absl::Seconds(30));
  EXPECT_EQ(trace->max_events, 100u);
  EXPECT_EQ(trace->owner_quota.at("alice"), 4u);
  ASSERT_EQ(trace->jobs.size(), 1u);
  const TraceJob& job = trace->jobs[0];
  EXPECT_EQ(job.owner, "alice");
  EXPECT_EQ(job.priority, 3);
  EXPECT_EQ(job.submit, absl::Seconds(1.5));
  EXPECT_EQ(job.work, 100);
  EXPECT_EQ(job.t1, 2);
  EXPECT_EQ(job.a, 0.25);
  EXPECT_EQ(job.max_workers, 4u);
  EXPECT_FALSE(job.preemptible);
}

TEST(ScheduleSim, ParseTrace_BadInput_SaysWhere) {
  EXPECT_THAT(ParseTrace(R"({"jobs": [{"id": "a", "work": 1, "wokr": 2}]})"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("jobs[0].wokr")));
  EXPECT_THAT(ParseTrace(R"({"jobs": [{"id": "a", "work": 1, "a": 2}]})"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("jobs[0].a")));
  EXPECT_THAT(ParseTrace(R"({"workers": 4, "workers": 8, "jobs": []})"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("workers")));
  EXPECT_THAT(ParseTrace(R"({"jobs": [{"id": "a", "work": 1, "min_workers": 1.5}]})"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("whole number")));
  EXPECT_THAT(ParseTrace(R"({"jobs": [{"id": "a", "work": 1, "preemptible": 1}]})"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("jobs[0].preemptible")));
}

}  // namespace
}  // namespace ddp
