// Many jobs on one pool: each runs on workers of its own, side by side; a
// queued job starts only when min_workers free workers fit it (gang), and
// waits for them ahead of the running jobs' growth; a job's end gives its
// workers to the next one; a fault in one job leaves the others alone; and
// a restart keeps every running job.
#include <set>
#include <string>
#include <vector>

#include "tests/unit/coordinator_fixture.h"

namespace ddp {
namespace {

using ::testing::AllOf;
using ::testing::DoubleNear;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

// The state of job `spec` a worker holds after leaving `generation` at
// `step`.
v1::HeldState HeldOf(const v1::JobSpec& spec, uint64_t generation, uint64_t step) {
  v1::HeldState held;
  held.set_job_id(spec.name());
  held.set_spec_digest(SpecDigest(WithDefaults(spec)));
  held.set_step(step);
  held.set_generation(generation);
  return held;
}

template <typename Base>
class PoolFixture : public Base {
 protected:
  static v1::JobSpec Named(const std::string& name, uint32_t min, uint32_t max,
                           int32_t priority = 0) {
    v1::JobSpec spec = Base::Job(min, max);
    spec.set_name(name);
    spec.set_priority(priority);
    spec.set_reform_min_interval_seconds(0);  // growth at once
    return spec;
  }

  // `n` workers h/cpu:FIRST.. attached.
  std::vector<TestWorker> AttachN(int n, int first = 0) {
    std::vector<TestWorker> workers;
    for (int i = first; i < first + n; ++i) {
      workers.push_back(*this->Attach("h", absl::StrCat("cpu:", i)));
    }
    return workers;
  }

  // The job each worker was last assigned to (empty: none).
  static std::vector<std::string> AssignedJobs(const std::vector<TestWorker>& workers) {
    std::vector<std::string> jobs;
    for (const TestWorker& w : workers) jobs.push_back(w.assignment().job_id());
    return jobs;
  }

  // `w` (rank 0 of `generation`) wrote job `spec`'s checkpoint of `step`.
  void SendCheckpoint(const TestWorker& w, const v1::JobSpec& spec, uint64_t generation,
                      uint64_t step) {
    v1::WorkerMessage m;
    v1::CheckpointResult* result = m.mutable_checkpoint();
    result->set_job_id(spec.name());
    result->set_generation(generation);
    result->set_step(step);
    result->set_path(absl::StrCat(spec.checkpoint().dir(), "/", step));
    this->Send(w, m);
  }

  const v1::JobSummary* Job(const v1::JobStatus& status, const std::string& id) {
    for (const v1::JobSummary& j : status.jobs()) {
      if (j.job_id() == id) return &j;
    }
    ADD_FAILURE() << "no job " << id << " in the status";
    return nullptr;
  }
};

class CoordinatorPoolTest : public PoolFixture<CoordinatorTest> {};

TEST_F(CoordinatorPoolTest, TwoJobs_RunSideBySideOnDisjointWorkers) {
  auto w = AttachN(4);
  ASSERT_THAT(Submit(*core_, Named("a", 2, 2)), IsOk());
  ASSERT_THAT(Submit(*core_, Named("b", 2, 2)), IsOk());  // fits the two free: starts at once
  EXPECT_THAT(AssignedJobs(w), ElementsAre("a", "a", "b", "b"));
  // Generation numbers are the pool's: one number names one job.
  EXPECT_EQ(w[0].assignment().generation(), 1u);
  EXPECT_EQ(w[2].assignment().generation(), 2u);
  EXPECT_EQ(w[2].assignment().world_size(), 2u);
  const v1::JobStatus status = Status();
  EXPECT_EQ(status.job_id(), "a");                          // the first to start, by default
  EXPECT_EQ(core_->StatusView()->summary().members(), 2u);  // a's only
  ASSERT_EQ(status.jobs_size(), 2);
  for (const char* id : {"a", "b"}) {
    const v1::JobSummary* job = Job(status, id);
    ASSERT_NE(job, nullptr);
    EXPECT_EQ(job->state(), v1::JOB_STATE_RUNNING);
    EXPECT_EQ(job->workers(), 2u);
    EXPECT_EQ(job->world_size(), 2u);
  }
  EXPECT_THAT(Ids(Job(status, "b")->members()), ElementsAre(w[2].id(), w[3].id()));
  for (const TestWorker& each : w) {
    const v1::WorkerStatus* ws = Find(status, each.id());
    EXPECT_EQ(ws->job_id(), each.assignment().job_id());
    EXPECT_GE(ws->rank(), 0);  // its rank in its own job
  }
  EXPECT_EQ(status.queued_jobs(), 0u);
  // b's own status lists b's workers, and the pool's jobs as the default does.
  absl::StatusOr<std::shared_ptr<const v1::JobStatus>> b = core_->JobStatusView("b");
  ASSERT_THAT(b, IsOk());
  EXPECT_EQ((*b)->job_id(), "b");
  EXPECT_EQ((*b)->workers_size(), 2);
  EXPECT_EQ((*b)->jobs_size(), 2);
}

TEST_F(CoordinatorPoolTest, QueuedJob_StartsOnlyWhenMinWorkersAreFree_AllAtOnce) {
  auto w = AttachN(3);
  ASSERT_THAT(Submit(*core_, Named("a", 2, 2)), IsOk());
  ASSERT_THAT(Submit(*core_, Named("b", 2, 2)), IsOk());
  // One free worker is not enough for b: it waits, holding none.
  absl::StatusOr<v1::JobSummary> b = core_->GetJob("b");
  ASSERT_THAT(b, IsOk());
  EXPECT_EQ(b->state(), v1::JOB_STATE_QUEUED);
  EXPECT_THAT(b->message(),
              AllOf(HasSubstr("the pool is full: it needs 2 workers (min_workers) and 1 is free"),
                    HasSubstr("(running: \"a\")")));
  EXPECT_EQ(w[2].channel->Of(v1::CoordinatorMessage::kPrepare).size(), 0u);
  auto more = AttachN(1, 3);
  EXPECT_EQ(core_->GetJob("b")->state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(w[2].assignment().job_id(), "b");
  EXPECT_EQ(more[0].assignment().job_id(), "b");
  EXPECT_EQ(w[0].assignments(), 1u);  // a never re-formed
}

TEST_F(CoordinatorPoolTest, QueuedJob_WaitsAheadOfRunningJobsGrowth_ThenTheirWorkersReturn) {
  auto w = AttachN(2);
  ASSERT_THAT(Submit(*core_, Named("a", 2, 4)), IsOk());
  ASSERT_THAT(Submit(*core_, Named("b", 2, 2)), IsOk());
  // A worker frees up: a could grow, but b waits for it.
  auto third = AttachN(1, 2);
  core_->Tick();
  EXPECT_THAT(w[0].aborts(), IsEmpty());  // a was not asked to admit anyone
  EXPECT_EQ(third[0].assignments(), 0u);
  auto fourth = AttachN(1, 3);
  EXPECT_EQ(third[0].assignment().job_id(), "b");
  EXPECT_EQ(fourth[0].assignment().job_id(), "b");
  const uint64_t b_generation = third[0].assignment().generation();
  // b ends: its workers go back to the pool, and a (max 4) takes them at a
  // step boundary, as joiners.
  SendState(third[0], b_generation, v1::WORKER_STATE_DONE);
  SendState(fourth[0], b_generation, v1::WORKER_STATE_DONE);
  EXPECT_EQ(core_->GetJob("b")->state(), v1::JOB_STATE_SUCCEEDED);
  core_->Tick();
  ASSERT_FALSE(w[0].aborts().empty());
  EXPECT_TRUE(w[0].aborts().back().at_step_boundary());
  for (const TestWorker& m : {w[0], w[1]}) {
    SendState(m, 1, v1::WORKER_STATE_IDLE, "left", absl::StatusCode::kOk,
              HeldOf(Named("a", 2, 4), 1, 7));
  }
  core_->Tick();
  EXPECT_EQ(w[0].assignment().world_size(), 4u);
  EXPECT_EQ(third[0].assignment().job_id(), "a");
  EXPECT_EQ(third[0].assignment().start_step(), 7u);
}

TEST_F(CoordinatorPoolTest, QueuedJobThatCanNeverFit_SaysSoAndHoldsUpNobody) {
  auto w = AttachN(2);
  ASSERT_THAT(Submit(*core_, Named("a", 1, 3)), IsOk());
  v1::JobSpec picky = Named("picky", 2, 2);
  (*picky.mutable_worker_selector())["gpu"] = "h200";
  ASSERT_THAT(Submit(*core_, picky), IsOk());
  EXPECT_THAT(
      core_->GetJob("picky")->message(),
      HasSubstr("it needs 2 workers with labels gpu=h200 (min_workers) and the pool has 0 such "
                "of 2 workers; attach workers that match or lower min_workers"));
  // a may grow with the free worker meanwhile: nothing queued can use it.
  auto third = AttachN(1, 2);
  core_->Tick();
  EXPECT_EQ(w[0].assignment().world_size(), 2u);  // a formed with both at first
  EXPECT_FALSE(w[0].aborts().empty());            // and is asked to admit the third
}

TEST_F(CoordinatorPoolTest, WorkerLost_OnlyItsJobReforms) {
  auto w = AttachN(4);
  ASSERT_THAT(Submit(*core_, Named("a", 1, 2)), IsOk());
  ASSERT_THAT(Submit(*core_, Named("b", 2, 2)), IsOk());
  ASSERT_EQ(w[2].assignment().job_id(), "b");
  core_->OnStreamClosed(w[0].session, "killed");
  EXPECT_EQ(core_->GetJob("a")->state(), v1::JOB_STATE_RECOVERING);
  EXPECT_EQ(core_->GetJob("b")->state(), v1::JOB_STATE_RUNNING);
  EXPECT_THAT(w[2].aborts(), IsEmpty());
  EXPECT_THAT(w[3].aborts(), IsEmpty());
  // a's survivor leaves and a re-forms with it alone (min 1); b's workers
  // are not a's to take.
  ASSERT_FALSE(w[1].aborts().empty());
  SendState(w[1], 1, v1::WORKER_STATE_IDLE, "left", absl::StatusCode::kOk,
            HeldOf(Named("a", 1, 2), 1, 3));
  core_->Tick();
  EXPECT_EQ(w[1].assignment().job_id(), "a");
  EXPECT_EQ(w[1].assignment().world_size(), 1u);
  EXPECT_EQ(w[1].assignment().generation(), 3u);  // after b's 2
  EXPECT_EQ(w[2].assignments(), 1u);
  EXPECT_EQ(core_->GetJob("b")->state(), v1::JOB_STATE_RUNNING);
}

TEST_F(CoordinatorPoolTest, Store_FencedByEachJobsOwnGeneration) {
  auto w = AttachN(4);
  ASSERT_THAT(Submit(*core_, Named("a", 2, 2)), IsOk());
  ASSERT_THAT(Submit(*core_, Named("b", 2, 2)), IsOk());
  v1::StoreSetRequest set;
  set.set_key("k");
  set.set_value("v");
  set.set_job_id("b");
  set.set_generation(2);
  EXPECT_THAT(core_->StoreSet(set), IsOk());
  set.set_job_id("a");  // a's name with b's generation
  EXPECT_THAT(core_->StoreSet(set),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("stale generation 2")));
  set.set_generation(1);
  EXPECT_THAT(core_->StoreSet(set), IsOk());
}

TEST_F(CoordinatorPoolTest, CancelRunningJob_ItsWorkersGoToTheQueuedOne) {
  auto w = AttachN(2);
  ASSERT_THAT(Submit(*core_, Named("a", 2, 2)), IsOk());
  ASSERT_THAT(Submit(*core_, Named("b", 2, 2)), IsOk());
  ASSERT_THAT(Cancel(*core_, "a", "make room"), IsOk());
  for (const TestWorker& m : w) SendState(m, 1, v1::WORKER_STATE_IDLE, "left");
  core_->Tick();
  EXPECT_THAT(AssignedJobs(w), ElementsAre("b", "b"));
  EXPECT_EQ(w[0].assignment().generation(), 2u);
  v1::ListJobsRequest all;
  absl::StatusOr<v1::ListJobsResponse> listed = core_->ListJobs(all);
  ASSERT_THAT(listed, IsOk());
  ASSERT_EQ(listed->jobs_size(), 2);
  EXPECT_EQ(listed->jobs(0).job_id(), "a");
  EXPECT_EQ(listed->jobs(0).state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(listed->jobs(1).job_id(), "b");
  EXPECT_EQ(listed->jobs(1).state(), v1::JOB_STATE_RUNNING);
}

TEST_F(CoordinatorPoolTest, HigherPriorityJob_LowerOneShrinksAtAStepBoundaryThenGrowsBack) {
  auto w = AttachN(4);
  const v1::JobSpec a = Named("a", 2, 4), b = Named("b", 2, 2, /*priority=*/10);
  ASSERT_THAT(Submit(*core_, a), IsOk());
  ASSERT_EQ(w[3].assignment().world_size(), 4u);
  ASSERT_THAT(Submit(*core_, b), IsOk());
  // a is asked to leave at its next step boundary, giving its two highest
  // ranks to b; nothing else happens until the members are out.
  for (const TestWorker& m : w) {
    ASSERT_EQ(m.aborts().size(), 1u);
    EXPECT_TRUE(m.aborts()[0].at_step_boundary());
    EXPECT_THAT(m.aborts()[0].reason(), HasSubstr("giving 2 worker(s) to job \"b\""));
  }
  EXPECT_THAT(core_->GetJob("b")->message(), HasSubstr("waiting for 2 workers released by job a"));
  // The two given away are out first: b starts on them at once, and a
  // re-forms when its own two are out too, though those two are already
  // in b's generation.
  for (int i : {2, 3}) {
    SendState(w[i], 1, v1::WORKER_STATE_IDLE, "left", absl::StatusCode::kOk, HeldOf(a, 1, 5));
  }
  core_->Tick();
  EXPECT_EQ(core_->GetJob("b")->state(), v1::JOB_STATE_RUNNING);
  EXPECT_THAT(AssignedJobs(w), ElementsAre("a", "a", "b", "b"));
  EXPECT_EQ(w[0].assignment().world_size(), 4u);  // a still finishes its step
  for (int i : {0, 1}) {
    SendState(w[i], 1, v1::WORKER_STATE_IDLE, "left", absl::StatusCode::kOk, HeldOf(a, 1, 5));
  }
  core_->Tick();
  EXPECT_EQ(w[0].assignment().world_size(), 2u);
  EXPECT_EQ(w[0].assignment().start_step(), 5u);  // from the step boundary: nothing lost
  const v1::JobStatus status = Status();
  ASSERT_GE(status.generation_changes_size(), 2);
  const v1::GenerationChange& shrunk =
      status.generation_changes(status.generation_changes_size() - 1);
  EXPECT_EQ(shrunk.cause(), v1::CHANGE_CAUSE_SHRUNK);
  EXPECT_THAT(Ids(shrunk.left()), UnorderedElementsAre(w[2].id(), w[3].id()));
  EXPECT_EQ(shrunk.steps_lost(), 0u);
  // b finishes: a takes its workers back, at a step boundary again.
  const uint64_t b_generation = w[2].assignment().generation();
  for (int i : {2, 3}) SendState(w[i], b_generation, v1::WORKER_STATE_DONE);
  EXPECT_EQ(core_->GetJob("b")->state(), v1::JOB_STATE_SUCCEEDED);
  core_->Tick();
  ASSERT_EQ(w[0].aborts().size(), 2u);
  const uint64_t a_generation = w[0].assignment().generation();
  for (int i : {0, 1}) {
    SendState(w[i], a_generation, v1::WORKER_STATE_IDLE, "left", absl::StatusCode::kOk,
              HeldOf(a, a_generation, 9));
  }
  core_->Tick();
  EXPECT_THAT(AssignedJobs(w), ElementsAre("a", "a", "a", "a"));
  EXPECT_EQ(w[3].assignment().world_size(), 4u);
  EXPECT_EQ(w[3].assignment().start_step(), 9u);
}

TEST_F(CoordinatorPoolTest, FaultDuringAShrink_TheJobReformsAtOnceWithoutWaitingForTheGivenAway) {
  auto w = AttachN(4);
  const v1::JobSpec a = Named("a", 1, 4), b = Named("b", 2, 2, /*priority=*/10);
  ASSERT_THAT(Submit(*core_, a), IsOk());
  ASSERT_THAT(Submit(*core_, b), IsOk());
  ASSERT_EQ(w[0].aborts().size(), 1u);  // a gives w2 and w3 to b at its next step boundary
  // Before it gets there, w0 dies: the generation is lost, and every member
  // leaves it at once, the two given away too.
  core_->OnStreamClosed(w[0].session, "killed");
  // w1 leaves first and a re-forms on it alone, then the two given away
  // leave (nothing of a waits for them, and b gets them).
  SendState(w[1], 1, v1::WORKER_STATE_IDLE, "left", absl::StatusCode::kOk, HeldOf(a, 1, 5));
  core_->Tick();
  for (int i : {2, 3}) {
    SendState(w[i], 1, v1::WORKER_STATE_IDLE, "left", absl::StatusCode::kOk, HeldOf(a, 1, 5));
    core_->Tick();  // no time passes: nothing waits out an eviction
  }
  EXPECT_EQ(w[1].assignment().job_id(), "a");
  EXPECT_GT(w[1].assignment().generation(), 1u);
  EXPECT_EQ(w[1].assignment().world_size(), 1u);
  EXPECT_EQ(w[1].assignment().start_step(), 5u);
  EXPECT_THAT(AssignedJobs({w[2], w[3]}), ElementsAre("b", "b"));
}

// GetStatus of a job that ended is that job's, even while the published
// snapshot still describes the job that was the default one a tick ago.
TEST_F(CoordinatorPoolTest, JobStatusView_OfTheLastJob_ItsOwnThoughTheSnapshotIsAnothers) {
  auto w = AttachN(4);
  ASSERT_THAT(Submit(*core_, Named("a", 2, 2)), IsOk());
  ASSERT_THAT(Submit(*core_, Named("b", 2, 2)), IsOk());
  ASSERT_EQ(Status().job_id(), "a");  // published: a's
  for (int i : {2, 3}) SendState(w[i], w[i].assignment().generation(), v1::WORKER_STATE_DONE);
  for (int i : {0, 1}) SendState(w[i], w[i].assignment().generation(), v1::WORKER_STATE_DONE);
  absl::StatusOr<std::shared_ptr<const v1::JobStatus>> b = core_->JobStatusView("b");
  ASSERT_THAT(b, IsOk());
  EXPECT_EQ((*b)->job_id(), "b");
  EXPECT_EQ((*b)->state(), v1::JOB_STATE_SUCCEEDED);
}

// The job of worker `w` in the status (who the pool gave it to).
std::string JobOf(const v1::JobStatus& status, const TestWorker& w) {
  for (const v1::WorkerStatus& ws : status.workers()) {
    if (ws.worker_id() == w.id()) return ws.job_id();
  }
  return "(not listed)";
}

TEST_F(CoordinatorPoolTest, Growth_AFreeWorkerGoesToTheEqualPriorityJobThatGainsMost) {
  auto w = AttachN(2);
  const v1::JobSpec x = Named("x", 1, 2), y = Named("y", 1, 2);
  ASSERT_THAT(Submit(*core_, x), IsOk());
  // x measures 6400 samples/s on two workers (64 samples in 20 ms each)...
  for (const TestWorker& m : w) {
    SendState(m, 1, v1::WORKER_STATE_TRAINING);
    SendReport(m, 1, 1, 0.5, "", 0.02);
  }
  Status();
  // ...and, once one is lost, 6095 on one: a second worker gains it 5%.
  core_->OnStreamClosed(w[1].session, "killed");
  SendState(w[0], 1, v1::WORKER_STATE_IDLE, "left", absl::StatusCode::kOk, HeldOf(x, 1, 1));
  core_->Tick();
  ASSERT_EQ(w[0].assignment().world_size(), 1u);
  const uint64_t g = w[0].assignment().generation();
  SendState(w[0], g, v1::WORKER_STATE_TRAINING);
  SendReport(w[0], g, 2, 0.5, "", 64.0 / 6095);
  const v1::JobStatus measured = Status();
  const v1::JobSummary* x_summary = Job(measured, "x");
  ASSERT_NE(x_summary, nullptr);
  EXPECT_THAT(x_summary->samples_per_sec_by_world_size(),
              UnorderedElementsAre(Pair(1u, DoubleNear(6095, 1e-6)), Pair(2u, 6400)));
  // y, of the same priority, starts on the next worker to come.
  ASSERT_THAT(Submit(*core_, y), IsOk());
  auto more = AttachN(1, 2);
  EXPECT_EQ(more[0].assignment().job_id(), "y");
  // Both could grow by one: the next worker goes to y (unmeasured: a
  // second worker may double it), not to x, which started first.
  more.push_back(AttachN(1, 3)[0]);
  EXPECT_EQ(JobOf(Status(), more[1]), "y");
  // y is full; x's second worker would gain it 5%, under the 10% a
  // re-formation must be worth: the one after stays free.
  more.push_back(AttachN(1, 4)[0]);
  EXPECT_EQ(JobOf(Status(), more[2]), "");
  EXPECT_EQ(core_->GetJob("y")->workers(), 2u);  // GetJob counts them too
}

TEST_F(CoordinatorPoolTest, HigherPriorityJob_NotEnoughAboveMinWorkers_NobodyShrinks) {
  auto w = AttachN(3);
  ASSERT_THAT(Submit(*core_, Named("a", 2, 3)), IsOk());
  ASSERT_THAT(Submit(*core_, Named("b", 2, 2, /*priority=*/10)), IsOk());
  // a can give one worker (down to its min 2); b needs two: a is left alone.
  for (const TestWorker& m : w) EXPECT_THAT(m.aborts(), IsEmpty());
  EXPECT_EQ(core_->GetJob("b")->state(), v1::JOB_STATE_QUEUED);
}

// What a job grew into above its min_workers goes to a queued job of its own
// priority, which at no workers gains more from it; never below min_workers.
TEST_F(CoordinatorPoolTest, EqualPriority_GivesOnlyWhatItHoldsAboveMin) {
  auto w = AttachN(4);
  ASSERT_THAT(Submit(*core_, Named("a", 2, 4)), IsOk());
  ASSERT_THAT(Submit(*core_, Named("b", 2, 2)), IsOk());
  for (const TestWorker& m : w) {
    ASSERT_EQ(m.aborts().size(), 1u);
    EXPECT_THAT(m.aborts()[0].reason(), HasSubstr("giving 2 worker(s) to job \"b\" (priority 0)"));
  }
  ASSERT_THAT(Submit(*core_, Named("c", 2, 2)), IsOk());
  EXPECT_THAT(core_->GetJob("c")->message(), HasSubstr("the pool is full"));
  for (const TestWorker& m : w) EXPECT_EQ(m.aborts().size(), 1u);  // nothing more for c
}

TEST_F(CoordinatorPoolTest, Shrink_WaitsOutReformMinInterval) {
  auto w = AttachN(4);
  v1::JobSpec a = Named("a", 2, 4);
  a.set_reform_min_interval_seconds(30);
  a.set_hang_timeout_seconds(600);  // the heartbeats below name no new step
  ASSERT_THAT(Submit(*core_, a), IsOk());
  ASSERT_THAT(Submit(*core_, Named("b", 2, 2, /*priority=*/10)), IsOk());
  EXPECT_THAT(w[0].aborts(), IsEmpty());  // a formed just now
  EXPECT_THAT(core_->GetJob("b")->message(),
              HasSubstr("job a (priority 0) may give workers in 30.0s (reform_min_interval)"));
  Pass(absl::Seconds(31), {{w[0], 1}, {w[1], 1}, {w[2], 1}, {w[3], 1}});
  ASSERT_EQ(w[0].aborts().size(), 1u);
  EXPECT_TRUE(w[0].aborts()[0].at_step_boundary());
}

TEST_F(CoordinatorPoolTest, ShrinkingNotEnough_PreemptsACheckpointingJob_WhichResumesFromIt) {
  auto w = AttachN(4);
  v1::JobSpec a = Named("a", 2, 4);
  a.mutable_checkpoint()->set_dir("/tmp/ddp-preempt-a");
  const v1::JobSpec c = Named("c", 4, 4, /*priority=*/10);
  ASSERT_THAT(Submit(*core_, a), IsOk());
  ASSERT_EQ(w[0].assignment().world_size(), 4u);
  // a could give two workers by shrinking; c needs four: a is preempted
  // whole, every member leaving at the step boundary, rank 0 checkpointing.
  ASSERT_THAT(Submit(*core_, c), IsOk());
  for (const TestWorker& m : w) {
    ASSERT_EQ(m.aborts().size(), 1u);
    EXPECT_TRUE(m.aborts()[0].at_step_boundary());
    EXPECT_TRUE(m.aborts()[0].checkpoint());
    EXPECT_THAT(m.aborts()[0].reason(), HasSubstr("preempted for job \"c\" (priority 10)"));
  }
  EXPECT_THAT(core_->GetJob("c")->message(), HasSubstr("waiting for 4 workers released by job a"));
  EXPECT_THAT(core_->GetJob("a")->message(), HasSubstr("preempted for job \"c\""));
  // Three are out; rank 0's checkpoint comes before the last one is.
  for (int i : {0, 1, 2}) {
    SendState(w[i], 1, v1::WORKER_STATE_IDLE, "left", absl::StatusCode::kOk, HeldOf(a, 1, 7));
  }
  SendCheckpoint(w[0], a, 1, 7);
  core_->Tick();
  EXPECT_EQ(core_->GetJob("c")->state(), v1::JOB_STATE_QUEUED);  // three free: not yet
  SendState(w[3], 1, v1::WORKER_STATE_IDLE, "left", absl::StatusCode::kOk, HeldOf(a, 1, 7));
  core_->Tick();
  // c runs on all four; a waits in the queue, saying where it stopped.
  EXPECT_THAT(AssignedJobs(w), ElementsAre("c", "c", "c", "c"));
  absl::StatusOr<v1::JobSummary> queued = core_->GetJob("a");
  ASSERT_THAT(queued, IsOk());
  EXPECT_EQ(queued->state(), v1::JOB_STATE_QUEUED);
  EXPECT_THAT(queued->message(),
              HasSubstr("preempted at step 7; resumes from its checkpoint of step 7"));
  // c ends: a resumes from its checkpoint (the workers hold c's state now).
  const uint64_t c_generation = w[0].assignment().generation();
  for (const TestWorker& m : w) {
    SendState(m, c_generation, v1::WORKER_STATE_DONE, "done", absl::StatusCode::kOk,
              HeldOf(c, c_generation, 3));
  }
  core_->Tick();
  EXPECT_EQ(w[0].assignment().job_id(), "a");
  EXPECT_EQ(w[0].assignment().state_source(), v1::STATE_SOURCE_CHECKPOINT);
  EXPECT_EQ(w[0].assignment().start_step(), 7u);
  Status();
  absl::StatusOr<std::shared_ptr<const v1::JobStatus>> status = core_->JobStatusView("a");
  ASSERT_THAT(status, IsOk());
  EXPECT_EQ((*status)->state(), v1::JOB_STATE_RUNNING);
  const auto& changes = (*status)->generation_changes();
  ASSERT_GE(changes.size(), 2);
  EXPECT_EQ(changes[0].cause(), v1::CHANGE_CAUSE_START);
  EXPECT_EQ(changes[1].cause(), v1::CHANGE_CAUSE_PREEMPTED);
  EXPECT_EQ(changes[1].steps_lost(), 0u);
  EXPECT_EQ(changes[1].state_source(), v1::STATE_SOURCE_CHECKPOINT);
}

// Rank 0 never checkpoints (it died, its disk failed): the preempted job is
// queued anyway once kPreemptCheckpointWait has passed, saying what it will
// resume from.
TEST_F(CoordinatorPoolTest, Preemption_NoCheckpointComes_QueuedAfterTheWaitSayingSo) {
  auto w = AttachN(2);
  v1::JobSpec a = Named("a", 2, 2);
  a.mutable_checkpoint()->set_dir("/tmp/ddp-preempt-a");
  ASSERT_THAT(Submit(*core_, a), IsOk());
  v1::JobSpec c = Named("c", 2, 2, /*priority=*/10);
  c.set_hang_timeout_seconds(600);  // the heartbeats below name no new step
  ASSERT_THAT(Submit(*core_, c), IsOk());
  for (const TestWorker& m : w) {
    SendState(m, 1, v1::WORKER_STATE_IDLE, "left", absl::StatusCode::kOk, HeldOf(a, 1, 7));
  }
  core_->Tick();
  EXPECT_THAT(AssignedJobs(w), ElementsAre("c", "c"));            // c need not wait for it
  EXPECT_EQ(core_->GetJob("a")->state(), v1::JOB_STATE_RUNNING);  // waits for rank 0
  const uint64_t g = w[0].assignment().generation();
  Pass(absl::Seconds(61), {{w[0], g}, {w[1], g}});
  absl::StatusOr<v1::JobSummary> queued = core_->GetJob("a");
  ASSERT_THAT(queued, IsOk());
  EXPECT_EQ(queued->state(), v1::JOB_STATE_QUEUED);
  EXPECT_THAT(queued->message(),
              HasSubstr("preempted at step 7; no checkpoint of that step came: it resumes from a "
                        "worker still holding it, else from the start"));
}

TEST_F(CoordinatorPoolTest, Preemption_OnlyOfJobsThatCheckpoint_AndOnlyWhenItLetsTheHeadStart) {
  auto w = AttachN(4);
  v1::JobSpec a = Named("a", 2, 2);
  a.mutable_checkpoint()->set_dir("/tmp/ddp-preempt-a");
  ASSERT_THAT(Submit(*core_, a), IsOk());
  ASSERT_THAT(Submit(*core_, Named("b", 2, 2, /*priority=*/5)), IsOk());  // no checkpoints
  ASSERT_THAT(AssignedJobs(w), ElementsAre("a", "a", "b", "b"));
  // Preempting a frees two; c needs four and b can't be preempted: nobody
  // is disturbed.
  ASSERT_THAT(Submit(*core_, Named("c", 4, 4, /*priority=*/10)), IsOk());
  core_->Tick();
  for (const TestWorker& m : w) EXPECT_THAT(m.aborts(), IsEmpty());
  EXPECT_EQ(core_->GetJob("c")->state(), v1::JOB_STATE_QUEUED);
  // b ends: its two workers and a's make four, and a is preempted.
  const uint64_t b_generation = w[2].assignment().generation();
  for (int i : {2, 3}) SendState(w[i], b_generation, v1::WORKER_STATE_DONE);
  for (int i : {0, 1}) {
    ASSERT_EQ(w[i].aborts().size(), 1u);
    EXPECT_TRUE(w[i].aborts()[0].checkpoint());
  }
  EXPECT_THAT(w[2].aborts(), IsEmpty());
}

// alice's jobs may hold two workers together; bob's any number.
class CoordinatorQuotaTest : public PoolFixture<CoordinatorTest> {
 protected:
  CoordinatorQuotaTest() {
    Coordinator::Options options = TestOptions();
    options.owner_quotas = {{"alice", 2}};
    core_ = std::make_unique<Coordinator>(&clock_, options);
  }
};

TEST_F(CoordinatorQuotaTest, JobOverItsOwnersQuota_WaitsSayingWhy_TheJobBehindStartsFirst) {
  auto w = AttachN(4);
  ASSERT_THAT(Submit(*core_, Named("a", 1, 4), "alice"), IsOk());
  // a could take all four: its owner's quota gives it two.
  EXPECT_THAT(AssignedJobs(w), ElementsAre("a", "a", "", ""));
  EXPECT_EQ(w[0].assignment().world_size(), 2u);
  ASSERT_THAT(Submit(*core_, Named("a2", 1, 1), "alice"), IsOk());
  ASSERT_THAT(Submit(*core_, Named("b", 2, 2), "bob"), IsOk());
  // a2 is first in the queue, but over alice's quota: b, behind it, starts.
  EXPECT_THAT(AssignedJobs(w), ElementsAre("a", "a", "b", "b"));
  absl::StatusOr<v1::JobSummary> a2 = core_->GetJob("a2");
  ASSERT_THAT(a2, IsOk());
  EXPECT_EQ(a2->state(), v1::JOB_STATE_QUEUED);
  EXPECT_THAT(a2->message(),
              HasSubstr("waits for owner alice's quota: its jobs may hold 2 workers, "
                        "they hold 2 and this one needs 1"));
  // b ends: its workers are free, but a2 still waits for alice's quota.
  const uint64_t b_generation = w[2].assignment().generation();
  for (int i : {2, 3}) SendState(w[i], b_generation, v1::WORKER_STATE_DONE);
  core_->Tick();
  EXPECT_EQ(core_->GetJob("a2")->state(), v1::JOB_STATE_QUEUED);
  EXPECT_THAT(w[0].aborts(), IsEmpty());  // nor does a grow past it
  // a ends: a2 starts, on one worker.
  for (int i : {0, 1}) SendState(w[i], 1, v1::WORKER_STATE_DONE);
  core_->Tick();
  EXPECT_EQ(core_->GetJob("a2")->state(), v1::JOB_STATE_RUNNING);
  const v1::JobStatus status = Status();
  const v1::JobSummary* running = Job(status, "a2");
  ASSERT_NE(running, nullptr);
  EXPECT_EQ(running->workers(), 1u);
}

TEST_F(CoordinatorQuotaTest, MinWorkersAboveTheQuota_RefusedSayingWhatToDo) {
  AttachN(4);
  absl::StatusOr<v1::JobSpec> answer = Submit(*core_, Named("big", 3, 4), "alice");
  EXPECT_EQ(answer.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(answer.status().message(),
              HasSubstr("minWorkers 3 is more than the 2 worker(s) the jobs of \"alice\" may "
                        "hold (max_workers in the coordinator's tokens file): lower minWorkers, "
                        "or ask an admin for a larger quota"));
  // Anyone else's may.
  EXPECT_THAT(Submit(*core_, Named("big", 3, 4), "bob"), IsOk());
}

class PoolPersistTest : public PoolFixture<PersistTest> {};

TEST_F(PoolPersistTest, Restart_EveryRunningJobKeptAndAdoptedWhenItsMembersComeBack) {
  auto w = AttachN(4);
  ASSERT_THAT(Submit(*core_, Named("a", 2, 2)), IsOk());
  ASSERT_THAT(Submit(*core_, Named("b", 2, 2)), IsOk());
  const v1::DurableState saved = Saved();
  EXPECT_EQ(saved.job().name(), "a");
  ASSERT_EQ(saved.jobs_beside_size(), 1);
  EXPECT_EQ(saved.jobs_beside(0).job().name(), "b");
  EXPECT_EQ(saved.latest_generation(), 2u);
  Restart();
  // Every member comes back claiming its rank: both generations go on.
  for (int i = 0; i < 4; ++i) {
    v1::RegisterRequest r = w[i].request;
    r.set_generation(w[i].assignment().generation());
    r.set_rank(w[i].assignment().rank());
    ASSERT_THAT(AttachWith(r), IsOk());
  }
  core_->Tick();
  const v1::JobStatus status = Status();
  ASSERT_EQ(status.jobs_size(), 2);
  EXPECT_EQ(Job(status, "a")->state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Job(status, "b")->state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Job(status, "b")->generation(), 2u);
  EXPECT_EQ(Job(status, "a")->workers(), 2u);
  EXPECT_EQ(Job(status, "b")->workers(), 2u);
}

TEST_F(PoolPersistTest, PreemptedJob_KeptInTheQueueAcrossARestart) {
  auto w = AttachN(2);
  v1::JobSpec a = Named("a", 2, 2);
  a.mutable_checkpoint()->set_dir("/tmp/ddp-preempt-a");
  ASSERT_THAT(Submit(*core_, a), IsOk());
  for (const TestWorker& m : w) {
    SendState(m, 1, v1::WORKER_STATE_TRAINING);
    SendReport(m, 1, 7, 0.5, "", 0.02);
  }
  Status();  // samples the rate
  ASSERT_THAT(Submit(*core_, Named("c", 2, 2, /*priority=*/10)), IsOk());
  for (const TestWorker& m : w) {
    SendState(m, 1, v1::WORKER_STATE_IDLE, "left", absl::StatusCode::kOk, HeldOf(a, 1, 7));
  }
  SendCheckpoint(w[0], a, 1, 7);
  core_->Tick();
  ASSERT_EQ(core_->GetJob("a")->state(), v1::JOB_STATE_QUEUED);
  const v1::DurableState saved = Saved();
  ASSERT_EQ(saved.queue_size(), 1);
  EXPECT_EQ(saved.queue(0).preempted().last_checkpoint_step(), 7u);
  // What it measured goes with it: 64 samples in 20 ms on each of two.
  EXPECT_THAT(saved.queue(0).preempted().samples_per_sec_by_world_size(),
              UnorderedElementsAre(Pair(2u, 6400)));
  Restart();
  absl::StatusOr<v1::JobSummary> queued = core_->GetJob("a");
  ASSERT_THAT(queued, IsOk());
  EXPECT_EQ(queued->state(), v1::JOB_STATE_QUEUED);
  EXPECT_THAT(queued->message(), HasSubstr("resumes from its checkpoint of step 7"));
}

}  // namespace
}  // namespace ddp
