#include "coordinator/status_history.h"

#include <cmath>
#include <limits>

#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"

namespace ddp {
namespace {

using ::testing::ElementsAre;
using ::testing::Field;
using ::testing::IsEmpty;
using ::testing::SizeIs;

v1::WorkerStatus* AddWorker(v1::JobStatus* s, const std::string& id, int rank, uint64_t step,
                            double loss, double rate,
                            v1::WorkerState state = v1::WORKER_STATE_TRAINING) {
  v1::WorkerStatus* w = s->add_workers();
  w->set_worker_id(id);
  w->set_rank(rank);
  w->set_step(step);
  w->set_last_loss(loss);
  w->set_samples_per_sec(rate);
  w->set_state(state);
  return w;
}

v1::JobStatus Job(const std::string& id = "job-1") {
  v1::JobStatus s;
  s.set_job_id(id);
  return s;
}

std::vector<uint64_t> Steps(const StatusHistory::RankCurve& c) {
  std::vector<uint64_t> steps;
  for (const auto& p : c.points) steps.push_back(p.step);
  return steps;
}

class StatusHistoryTest : public testing::Test {
 protected:
  FakeClock clock_;
};

TEST_F(StatusHistoryTest, Record_StepsAdvance_OnePointPerNewStepWithClockTime) {
  StatusHistory history(&clock_, {});
  for (uint64_t step : {1, 1, 2, 2, 3}) {
    v1::JobStatus s = Job();
    AddWorker(&s, "w0", 0, step, 2.0 / step, 100 * step);
    history.Record(s);
    clock_.Advance(absl::Seconds(1));
  }
  const auto curves = history.Curves();
  ASSERT_THAT(curves, SizeIs(1));
  EXPECT_EQ(curves[0].worker_id, "w0");
  EXPECT_THAT(Steps(curves[0]), ElementsAre(1, 2, 3));
  const double start = absl::ToDoubleSeconds(FakeClock().Now() - absl::UnixEpoch());
  // Each point is stamped when its step was first seen: ticks 0, 2 and 4.
  EXPECT_DOUBLE_EQ(curves[0].points[0].unix_seconds, start);
  EXPECT_DOUBLE_EQ(curves[0].points[1].unix_seconds, start + 2);
  EXPECT_DOUBLE_EQ(curves[0].points[2].loss, 2.0 / 3);
  EXPECT_DOUBLE_EQ(curves[0].points[2].samples_per_sec, 300);
}

TEST_F(StatusHistoryTest, Record_NonMembersAndIdleWorkers_NotPlotted) {
  StatusHistory history(&clock_, {});
  v1::JobStatus s = Job();
  AddWorker(&s, "spare", -1, 5, 1, 1);
  AddWorker(&s, "new", 0, 0, 0, 0, v1::WORKER_STATE_RENDEZVOUS);
  AddWorker(&s, "gone", 1, 7, 1, 1, v1::WORKER_STATE_LOST);
  AddWorker(&s, "ok", 2, 7, 1, 1, v1::WORKER_STATE_DONE);
  history.Record(s);
  const auto curves = history.Curves();
  ASSERT_THAT(curves, SizeIs(1));
  EXPECT_EQ(curves[0].rank, 2u);
}

TEST_F(StatusHistoryTest, Record_ManySteps_KeepsNewestPointsOnly) {
  StatusHistory history(&clock_, {/*max_points_per_rank=*/3, /*max_ranks=*/8});
  for (uint64_t step = 1; step <= 10; ++step) {
    v1::JobStatus s = Job();
    AddWorker(&s, "w0", 0, step, 1, 1);
    history.Record(s);
  }
  EXPECT_THAT(Steps(history.Curves()[0]), ElementsAre(8, 9, 10));
}

TEST_F(StatusHistoryTest, Record_RankBeyondLimit_NotKept) {
  StatusHistory history(&clock_, {/*max_points_per_rank=*/10, /*max_ranks=*/2});
  v1::JobStatus s = Job();
  for (int rank = 0; rank < 5; ++rank) AddWorker(&s, "w" + std::to_string(rank), rank, 1, 1, 1);
  history.Record(s);
  const auto curves = history.Curves();
  ASSERT_THAT(curves, SizeIs(2));
  EXPECT_EQ(curves[1].rank, 1u);
}

TEST_F(StatusHistoryTest, Record_StepGoesBack_DropsStepsToBeTrainedAgain) {
  StatusHistory history(&clock_, {});
  for (uint64_t step : {1, 2, 3, 4, 2, 3}) {
    v1::JobStatus s = Job();
    AddWorker(&s, "w0", 0, step, 1, 1);
    history.Record(s);
  }
  EXPECT_THAT(Steps(history.Curves()[0]), ElementsAre(1, 2, 3));
}

TEST_F(StatusHistoryTest, Record_NewJob_StartsOver) {
  StatusHistory history(&clock_, {});
  v1::JobStatus first = Job("a");
  AddWorker(&first, "w0", 0, 9, 1, 1);
  history.Record(first);
  v1::JobStatus second = Job("b");
  history.Record(second);
  EXPECT_THAT(history.Curves(), IsEmpty());
  AddWorker(&second, "w1", 0, 1, 1, 1);
  history.Record(second);
  EXPECT_THAT(history.Curves(), ElementsAre(Field(&StatusHistory::RankCurve::worker_id, "w1")));
}

TEST_F(StatusHistoryTest, ToJson_NaNLossAndQuotedIds_IsValidJson) {
  StatusHistory history(&clock_, {});
  v1::JobStatus s = Job("job \"quoted\"\n");
  AddWorker(&s, "w\\0", 0, 1, std::numeric_limits<double>::quiet_NaN(), 12.5);
  history.Record(s);
  google::protobuf::Struct parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(history.ToJson(), &parsed).ok())
      << history.ToJson();
  EXPECT_EQ(parsed.fields().at("job_id").string_value(), "job \"quoted\"\n");
  const auto& rank0 = parsed.fields().at("ranks").list_value().values(0).struct_value();
  EXPECT_EQ(rank0.fields().at("worker_id").string_value(), "w\\0");
  const auto& point = rank0.fields().at("points").list_value().values(0).list_value();
  ASSERT_EQ(point.values_size(), 4);
  EXPECT_EQ(point.values(1).number_value(), 1);
  EXPECT_TRUE(point.values(2).has_null_value());
  EXPECT_EQ(point.values(3).number_value(), 12.5);
}

// A job of the pool as the status lists it.
void AddJob(v1::JobStatus* s, const std::string& id, uint32_t workers, uint32_t world_size) {
  v1::JobSummary* j = s->add_jobs();
  j->set_job_id(id);
  j->set_workers(workers);
  j->set_world_size(world_size);
}

std::vector<uint32_t> Workers(const StatusHistory::JobAllocations& job) {
  std::vector<uint32_t> workers;
  for (const auto& p : job.points) workers.push_back(p.workers);
  return workers;
}

TEST_F(StatusHistoryTest, Allocations_OnePointPerChangeOfEachJob) {
  StatusHistory history(&clock_, {});
  const double t0 = absl::ToDoubleSeconds(clock_.Now() - absl::UnixEpoch());
  v1::JobStatus s = Job("a");
  AddJob(&s, "a", 4, 4);
  history.Record(s);
  clock_.Advance(absl::Seconds(1));
  history.Record(s);  // nothing changed: no point
  v1::JobStatus shrunk = Job("a");
  AddJob(&shrunk, "a", 2, 2);
  AddJob(&shrunk, "b", 2, 0);  // b holds two, still forming
  history.Record(shrunk);
  v1::JobStatus formed = Job("a");
  AddJob(&formed, "a", 2, 2);
  AddJob(&formed, "b", 2, 2);
  history.Record(formed);
  const std::vector<StatusHistory::JobAllocations> jobs = history.Allocations();
  ASSERT_THAT(jobs, SizeIs(2));
  EXPECT_EQ(jobs[0].job_id, "a");
  EXPECT_THAT(Workers(jobs[0]), ElementsAre(4, 2));
  EXPECT_EQ(jobs[0].points[0].unix_seconds, t0);
  EXPECT_EQ(jobs[0].points[1].unix_seconds, t0 + 1);
  EXPECT_EQ(jobs[1].job_id, "b");
  ASSERT_THAT(jobs[1].points, SizeIs(2));
  EXPECT_EQ(jobs[1].points[0].world_size, 0u);
  EXPECT_EQ(jobs[1].points[1].world_size, 2u);
}

TEST_F(StatusHistoryTest, Allocations_BoundedInJobsAndPoints_JobsNoLongerListedForgotten) {
  StatusHistory::Options options;
  options.max_jobs = 2;
  options.max_points_per_job = 3;
  StatusHistory history(&clock_, options);
  for (uint32_t n = 1; n <= 5; ++n) {
    v1::JobStatus s = Job("a");
    AddJob(&s, "a", n, n);
    history.Record(s);
  }
  EXPECT_THAT(Workers(history.Allocations()[0]), ElementsAre(3, 4, 5));  // the newest
  v1::JobStatus three = Job("a");
  for (const char* id : {"a", "b", "c"}) AddJob(&three, id, 1, 1);
  history.Record(three);
  std::vector<std::string> ids;
  for (const auto& job : history.Allocations()) ids.push_back(job.job_id);
  EXPECT_THAT(ids, ElementsAre("b", "c"));  // the first seen went first
  v1::JobStatus only_c = Job("c");
  AddJob(&only_c, "c", 1, 1);
  history.Record(only_c);
  ASSERT_THAT(history.Allocations(), SizeIs(1));
  EXPECT_EQ(history.Allocations()[0].job_id, "c");
  // In the JSON too, quoted.
  google::protobuf::Struct parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(history.ToJson(), &parsed).ok());
  const auto& job = parsed.fields().at("jobs").list_value().values(0).struct_value();
  EXPECT_EQ(job.fields().at("job_id").string_value(), "c");
  const auto& point = job.fields().at("points").list_value().values(0).list_value();
  ASSERT_EQ(point.values_size(), 3);
  EXPECT_EQ(point.values(1).number_value(), 1);
}

}  // namespace
}  // namespace ddp
