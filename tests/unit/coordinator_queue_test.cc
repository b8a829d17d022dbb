// The coordinator's job queue: jobs submitted while another holds the pool
// wait (QUEUED, saying behind whom), in priority then submission order, are
// listed and cancelled by operators, survive a restart, and take the pool's
// workers when the job ahead ends.
#include <string>
#include <vector>

#include "tests/unit/coordinator_fixture.h"

namespace ddp {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<std::string> JobIds(const v1::ListJobsResponse& page) {
  std::vector<std::string> ids;
  for (const v1::JobSummary& job : page.jobs()) ids.push_back(job.job_id());
  return ids;
}

// `Base`'s fixture, with jobs of a name and a priority.
template <typename Base>
class QueueFixture : public Base {
 protected:
  static v1::JobSpec Named(const std::string& name, int32_t priority = 0, uint32_t workers = 3) {
    v1::JobSpec spec = Base::Job(workers);
    spec.set_name(name);
    spec.set_priority(priority);
    return spec;
  }
};

class CoordinatorQueueTest : public QueueFixture<CoordinatorTest> {
 protected:
  std::vector<std::string> Listed(v1::ListJobsRequest request = {}) {
    absl::StatusOr<v1::ListJobsResponse> page = core_->ListJobs(request);
    EXPECT_THAT(page, IsOk());
    return page.ok() ? JobIds(*page) : std::vector<std::string>();
  }
};

TEST_F(CoordinatorQueueTest, SubmitJob_WhileAJobRuns_QueuedSayingBehindWhomAndRunningJobUntouched) {
  auto workers = StartThree();
  ASSERT_EQ(Status().state(), v1::JOB_STATE_RUNNING);
  EXPECT_THAT(Submit(*core_, Named("second")), IsOk());
  absl::StatusOr<v1::JobSummary> second = core_->GetJob("second");
  ASSERT_THAT(second, IsOk());
  EXPECT_EQ(second->state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(second->queue_position(), 1u);
  EXPECT_THAT(second->message(),
              AllOf(HasSubstr("the pool is full: it needs 3 workers (min_workers) and 0 are free"),
                    HasSubstr("(running: \"test-job\")")));
  EXPECT_EQ(second->spec().name(), "second");  // GetJob gives the spec
  const v1::JobStatus status = Status();
  EXPECT_EQ(status.job_id(), "test-job");
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(status.generation(), 1u);
  ASSERT_EQ(status.queued_jobs(), 1u);
  EXPECT_EQ(status.queue(0).job_id(), "second");
  EXPECT_FALSE(status.queue(0).has_spec());                      // the status stays small
  for (const auto& w : workers) EXPECT_EQ(w.assignments(), 1u);  // nothing re-formed
}

TEST_F(CoordinatorQueueTest, Queue_HigherPriorityFirstThenInSubmissionOrder) {
  StartThree();
  for (const auto& [name, priority] :
       std::vector<std::pair<std::string, int32_t>>{{"a", 0}, {"b", 5}, {"c", 0}, {"d", -1}}) {
    ASSERT_THAT(Submit(*core_, Named(name, priority)), IsOk());
  }
  EXPECT_THAT(Listed(), ElementsAre("test-job", "b", "a", "c", "d"));
  EXPECT_EQ(core_->GetJob("c")->queue_position(), 3u);
  EXPECT_THAT(core_->GetJob("c")->message(), HasSubstr("the pool is full"));
}

TEST_F(CoordinatorQueueTest, CurrentJobEnds_NextQueuedStartsOnTheSameWorkersAtTheNextTick) {
  auto workers = StartThree();
  ASSERT_THAT(Submit(*core_, Named("low", 0)), IsOk());
  ASSERT_THAT(Submit(*core_, Named("high", 9)), IsOk());
  for (const auto& w : workers) SendState(w, 1, v1::WORKER_STATE_DONE);
  core_->Tick();  // the queue's head takes the pool; its workers prepare (at once here)
  const v1::JobStatus next = Status();
  EXPECT_EQ(next.job_id(), "high");
  EXPECT_EQ(next.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(next.generation(), 2u);  // numbers go on across jobs: fencing holds
  EXPECT_EQ(next.world_size(), 3u);
  for (const auto& w : workers) {
    EXPECT_EQ(w.assignment().job_id(), "high");
    EXPECT_EQ(w.assignment().generation(), 2u);
  }
  // The job that ended stays listed, before those that started after it.
  EXPECT_THAT(Listed(), ElementsAre("test-job", "high", "low"));
  EXPECT_THAT(core_->GetJob("low")->message(), HasSubstr("running: \"high\""));
}

TEST_F(CoordinatorQueueTest, CancelJob_Queued_TakenOffAndRunningJobUntouched) {
  StartThree();
  ASSERT_THAT(Submit(*core_, Named("second")), IsOk());
  EXPECT_THAT(Cancel(*core_, "second", "not needed"), IsOk());
  // Ended before it started: listed as cancelled, and cancelled once.
  EXPECT_EQ(core_->GetJob("second")->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_THAT(core_->GetJob("second")->message(), HasSubstr("not needed"));
  EXPECT_THAT(Cancel(*core_, "second", ""), StatusIs(absl::StatusCode::kFailedPrecondition));
  const v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(status.queued_jobs(), 0u);
}

TEST_F(CoordinatorQueueTest, SubmitJob_QueuedAgain_SameSpecIsANoOpAnotherNamesTheField) {
  StartThree();
  ASSERT_THAT(Submit(*core_, Named("second")), IsOk());
  EXPECT_THAT(Submit(*core_, Named("second")), IsOk());
  v1::JobSpec other = Named("second");
  other.set_batch_size(16);
  EXPECT_THAT(Submit(*core_, other),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("batch_size")));
  EXPECT_EQ(Status().queued_jobs(), 1u);
}

TEST_F(CoordinatorQueueTest, SubmitJob_QueueFull_ResourceExhaustedAndNothingElseChanges) {
  StartThree();
  for (size_t i = 0; i < kMaxQueuedJobs; ++i) {
    ASSERT_THAT(Submit(*core_, Named(absl::StrCat("q", i))), IsOk());
  }
  EXPECT_THAT(Submit(*core_, Named("one-too-many")),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("queue is full")));
  const v1::JobStatus status = Status();
  EXPECT_EQ(status.queued_jobs(), kMaxQueuedJobs);
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
}

TEST_F(CoordinatorQueueTest, Owner_FromTheSubmitter_InStatusAndListsAndFilters) {
  std::vector<TestWorker> workers;
  for (const char* d : {"cpu:0", "cpu:1", "cpu:2"}) workers.push_back(*Attach("h", d));
  ASSERT_THAT(Submit(*core_, Named("mine"), "alice"), IsOk());
  ASSERT_THAT(Submit(*core_, Named("theirs"), "bob"), IsOk());
  ASSERT_THAT(Submit(*core_, Named("mine-too"), "alice"), IsOk());
  EXPECT_EQ(Status().owner(), "alice");
  v1::ListJobsRequest request;
  request.set_owner("alice");
  EXPECT_THAT(Listed(request), ElementsAre("mine", "mine-too"));
  request.set_owner("");
  request.set_state(v1::JOB_STATE_QUEUED);
  EXPECT_THAT(Listed(request), ElementsAre("theirs", "mine-too"));
  EXPECT_EQ(core_->GetJob("theirs")->owner(), "bob");
}

TEST_F(CoordinatorQueueTest, ListJobs_Pages_EachJobOnceEvenWhenTheQueueChangesBetweenPages) {
  StartThree();
  for (int i = 0; i < 5; ++i) ASSERT_THAT(Submit(*core_, Named(absl::StrCat("j", i))), IsOk());
  v1::ListJobsRequest request;
  request.set_page_size(2);
  absl::StatusOr<v1::ListJobsResponse> page = core_->ListJobs(request);
  ASSERT_THAT(page, IsOk());
  EXPECT_THAT(JobIds(*page), ElementsAre("test-job", "j0"));
  EXPECT_EQ(page->total_size(), 6u);
  // Between pages: a job ahead of everything queued, and one already
  // listed leaves; the rest neither repeat nor shift.
  ASSERT_THAT(Submit(*core_, Named("urgent", 10)), IsOk());
  ASSERT_THAT(Cancel(*core_, "j0", ""), IsOk());
  std::vector<std::string> rest;
  for (int pages = 0; !page->next_page_token().empty() && pages < 10; ++pages) {
    request.set_page_token(page->next_page_token());
    page = core_->ListJobs(request);
    ASSERT_THAT(page, IsOk());
    for (const std::string& id : JobIds(*page)) rest.push_back(id);
  }
  EXPECT_THAT(rest, ElementsAre("j1", "j2", "j3", "j4"));
  request.set_page_token("q/not-a-number/1");
  EXPECT_THAT(core_->ListJobs(request),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("page_token")));
}

TEST_F(CoordinatorQueueTest, GetJob_Unknown_NotFoundSayingWhatIsHeld) {
  StartThree();
  EXPECT_THAT(core_->GetJob("nope"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("running: \"test-job\"; 0 queued")));
  EXPECT_EQ(core_->GetJob("test-job")->state(), v1::JOB_STATE_RUNNING);
}

class QueuePersistTest : public QueueFixture<PersistTest> {};

TEST_F(QueuePersistTest, Restart_QueueKeptInOrderWithOwnersAndNewJobsQueueAfterIt) {
  auto workers = StartThree();
  ASSERT_THAT(Submit(*core_, Named("a"), "alice"), IsOk());
  ASSERT_THAT(Submit(*core_, Named("b", 3), "bob"), IsOk());
  Restart();
  ASSERT_THAT(Submit(*core_, Named("c")), IsOk());
  v1::ListJobsRequest queued;
  queued.set_state(v1::JOB_STATE_QUEUED);
  absl::StatusOr<v1::ListJobsResponse> page = core_->ListJobs(queued);
  ASSERT_THAT(page, IsOk());
  EXPECT_THAT(JobIds(*page), ElementsAre("b", "a", "c"));
  EXPECT_EQ(page->jobs(0).owner(), "bob");
  EXPECT_EQ(page->jobs(1).owner(), "alice");
  // The job ahead is cancelled: the queue's head takes the pool.
  ASSERT_THAT(Cancel(*core_, "test-job", "make room"), IsOk());
  EXPECT_EQ(Status().job_id(), "b");
  EXPECT_EQ(Saved().queue_size(), 2);
}

// Owners apart (the tokens file's limits): a priority above the owner's
// class and a queue share used up are refused; one owner can't cancel
// another's job, scope=all can, and the job's message says who did.
TEST_F(CoordinatorTest, Owners_PriorityClassQueueShareAndCancelScope) {
  Coordinator::Options options = TestOptions();
  options.owner_limits["alice"].max_queued = 1;
  options.owner_limits["bob"].max_priority = 5;
  core_ = std::make_unique<Coordinator>(&clock_, options);
  EXPECT_THAT(Submit(*core_, Job(1), "bob"), IsOk());  // waits for a worker
  v1::JobSpec a1 = Job(1);
  a1.set_name("a1");
  EXPECT_THAT(Submit(*core_, a1, "alice"), IsOk());  // queued
  v1::JobSpec a2 = Job(1);
  a2.set_name("a2");
  EXPECT_THAT(Submit(*core_, a2, "alice"),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("1 job(s) queued")));
  v1::JobSpec urgent = Job(1);
  urgent.set_name("urgent");
  urgent.set_priority(6);
  EXPECT_THAT(Submit(*core_, urgent, "bob"),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("above the 5")));
  urgent.set_priority(1);
  EXPECT_THAT(Submit(*core_, urgent, "alice"),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("above the 0")));
  EXPECT_THAT(Cancel(*core_, "a1", "mine now", {"bob", false}),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("belongs to \"alice\"")));
  EXPECT_THAT(Cancel(*core_, "a1", "done with it", {"alice", false}), IsOk());
  absl::StatusOr<v1::JobSummary> a1_now = core_->GetJob("a1");
  ASSERT_THAT(a1_now, IsOk());
  EXPECT_THAT(a1_now->message(), HasSubstr("by alice: done with it"));
  EXPECT_THAT(Cancel(*core_, Job(1).name(), "maintenance", {"ops", true}), IsOk());
}

}  // namespace
}  // namespace ddp
