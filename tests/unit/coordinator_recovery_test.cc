// The coordinator keeping a job alive: lost, silent and failed members end
// their generation and the next one forms from the survivors (plus anyone
// new), from the most advanced state; too few workers fail the job after
// rejoin_timeout_seconds; the fault budget. Joiners and hung members are in
// coordinator_membership_test.cc.
#include "tests/unit/coordinator_fixture.h"

namespace ddp {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// ---- The first generation -------------------------------------------------

TEST_F(CoordinatorTest, Waiting_MinWorkersAttached_FormsOnceTheSettleWindowPasses) {
  v1::JobSpec spec = Job(2, 4);
  spec.set_settle_seconds(3);
  auto w = Start(2, spec);
  Pass(absl::Seconds(2), {{w[0]}, {w[1]}});
  EXPECT_EQ(w[0].assignments(), 0u);
  EXPECT_EQ(Status().state(), v1::JOB_STATE_WAITING);
  Pass(absl::Seconds(1), {{w[0]}, {w[1]}});
  EXPECT_EQ(w[0].assignment().world_size(), 2u);
}

TEST_F(CoordinatorTest, Waiting_QuorumLost_SettleWindowStartsOver) {
  v1::JobSpec spec = Job(2, 4);
  spec.set_settle_seconds(3);
  auto w = Start(2, spec);
  Pass(absl::Seconds(2), {{w[0]}, {w[1]}});
  core_->OnStreamClosed(w[1].session, "its stream closed");
  Pass(absl::Seconds(1), {{w[0]}});
  auto other = *Attach("h", "cpu:5");
  Pass(absl::Seconds(2), {{w[0]}, {other}});
  EXPECT_EQ(w[0].assignments(), 0u);
  Pass(absl::Seconds(1), {{w[0]}, {other}});
  EXPECT_EQ(other.assignment().world_size(), 2u);
  EXPECT_EQ(Status().faults(), 0u);
}

// ---- Lost members ----------------------------------------------------------

TEST_F(CoordinatorTest, WorkerLost_DuringGeneration_SurvivorsAbortedAndJobRecovers) {
  auto workers = StartThree();
  Heartbeat(workers[2], 1, 12, v1::STEP_PHASE_BACKWARD);
  core_->OnStreamClosed(workers[2].session, "its stream closed");
  for (int i : {0, 1}) {
    const auto aborts = workers[i].aborts();
    ASSERT_EQ(aborts.size(), 1u);
    EXPECT_EQ(aborts[0].generation(), 1u);
    EXPECT_FALSE(aborts[0].at_step_boundary());  // at once: the step in flight is lost
  }
  ASSERT_TRUE(workers[2].channel->closed().has_value());
  EXPECT_THAT(*workers[2].channel->closed(), StatusIs(absl::StatusCode::kAborted));
  const v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_RECOVERING);
  EXPECT_EQ(status.faults(), 1u);
  ASSERT_EQ(status.generation_changes_size(), 2);
  const v1::GenerationChange& change = status.generation_changes(1);
  EXPECT_EQ(change.cause(), v1::CHANGE_CAUSE_LOST);
  EXPECT_EQ(change.from_generation(), 1u);
  EXPECT_EQ(change.to_generation(), 0u);
  EXPECT_THAT(Ids(change.left()), ElementsAre(workers[2].id()));
  EXPECT_THAT(change.reason(), AllOf(HasSubstr("rank 1"), HasSubstr("lost"), HasSubstr("step 12"),
                                     HasSubstr("BACKWARD")));
}

TEST_F(CoordinatorTest, WorkerLost_SurvivorsReportIdle_NextGenerationFromMostAdvancedState) {
  auto w = Start(3, Job(2, 3));
  for (const auto& x : w) SendReport(x, 1, 12, 0.5);
  core_->OnStreamClosed(w[0].session, "its stream closed");
  SendState(w[1], 1, v1::WORKER_STATE_IDLE, "left", absl::StatusCode::kOk, Held(12, 0, 2304));
  EXPECT_EQ(w[1].assignments(), 1u);  // w[2] is still leaving
  EXPECT_EQ(Status().state(), v1::JOB_STATE_RECOVERING);
  SendState(w[2], 1, v1::WORKER_STATE_IDLE, "left", absl::StatusCode::kOk, Held(13, 0, 2496));
  for (int i : {1, 2}) {
    const v1::Assignment a = w[i].assignment();
    EXPECT_EQ(a.generation(), 2u);
    EXPECT_EQ(a.rank(), static_cast<uint32_t>(i - 1));
    EXPECT_EQ(a.world_size(), 2u);
    EXPECT_EQ(a.state_source(), v1::STATE_SOURCE_MEMORY);
    EXPECT_EQ(a.source_rank(), 1u);  // w[2], now rank 1, holds step 13
    EXPECT_EQ(a.start_step(), 13u);
    EXPECT_EQ(a.start_cursor(), 2496u);
  }
  EXPECT_EQ(w[0].assignments(), 1u);
  const v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(status.generation(), 2u);
  EXPECT_THAT(Ids(status.members()), ElementsAre(w[1].id(), w[2].id()));
  const v1::GenerationChange& change = status.generation_changes(1);
  EXPECT_EQ(change.cause(), v1::CHANGE_CAUSE_LOST);
  EXPECT_EQ(change.to_generation(), 2u);
  EXPECT_THAT(Ids(change.left()), ElementsAre(w[0].id()));
  EXPECT_THAT(change.joined(), IsEmpty());
  EXPECT_EQ(change.resume_step(), 13u);
  EXPECT_EQ(change.state_source(), v1::STATE_SOURCE_MEMORY);
  EXPECT_EQ(change.steps_lost(), 0u);
  EXPECT_EQ(change.world_size(), 2u);
}

TEST_F(CoordinatorTest, Heartbeats_Stop_WorkerLostAfterTimeoutWithoutSleeping) {
  auto workers = StartThree();
  Pass(absl::Seconds(6), {{workers[0], 1}, {workers[1], 1}});  // workers[2] stays silent
  ASSERT_TRUE(workers[2].channel->closed().has_value());
  EXPECT_THAT(*workers[2].channel->closed(), StatusIs(absl::StatusCode::kAborted));
  const v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_RECOVERING);
  EXPECT_THAT(status.generation_changes(1).reason(), HasSubstr("no heartbeat"));
  EXPECT_FALSE(workers[0].channel->closed().has_value());
  EXPECT_EQ(workers[0].aborts().size(), 1u);
}

TEST_F(CoordinatorTest, Heartbeats_StopOnOneMember_NextGenerationFromSurvivors) {
  auto w = Start(3, Job(2, 3));
  Pass(absl::Seconds(6), {{w[0], 1, 8}, {w[2], 1, 8}});
  EXPECT_EQ(Status().state(), v1::JOB_STATE_RECOVERING);
  Leave(w[0], 1, 8);
  Leave(w[2], 1, 8);
  EXPECT_EQ(w[0].assignment().generation(), 2u);
  EXPECT_EQ(w[0].assignment().start_step(), 8u);
  EXPECT_EQ(w[2].assignment().rank(), 1u);
  const v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_THAT(Ids(status.members()), ElementsAre(w[0].id(), w[2].id()));
  ASSERT_NE(Find(status, w[1].id()), nullptr);
  EXPECT_EQ(Find(status, w[1].id())->state(), v1::WORKER_STATE_LOST);
}

TEST_F(CoordinatorTest, Leaving_SurvivorNeverLeaves_EvictedAfterHangThreshold) {
  v1::JobSpec spec = Job(1, 3);
  spec.set_hang_timeout_seconds(30);
  auto w = Start(3, spec);
  core_->OnStreamClosed(w[0].session, "its stream closed");
  Leave(w[1], 1, 4);
  Pass(absl::Seconds(30), {{w[1]}, {w[2], 1, 4, v1::STEP_PHASE_ALLREDUCE_WAIT}});
  EXPECT_EQ(w[1].assignments(), 1u);  // still waiting for w[2] to leave
  Pass(absl::Seconds(1), {{w[1]}, {w[2], 1, 4, v1::STEP_PHASE_ALLREDUCE_WAIT}});
  ASSERT_TRUE(w[2].channel->closed().has_value());
  EXPECT_THAT(*w[2].channel->closed(),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("told to leave generation 1")));
  EXPECT_EQ(w[1].assignment().generation(), 2u);
  EXPECT_EQ(w[1].assignment().world_size(), 1u);
}

TEST_F(CoordinatorTest, Idle_MemberLeavesUnasked_OthersAbortedAndGenerationReformed) {
  auto w = Start(3, Job(2, 3));
  Leave(w[1], 1, 5);
  EXPECT_TRUE(w[1].aborts().empty());
  EXPECT_EQ(w[0].aborts().size(), 1u);
  v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_RECOVERING);
  EXPECT_EQ(status.generation_changes(1).cause(), v1::CHANGE_CAUSE_FAILED);
  EXPECT_THAT(status.generation_changes(1).reason(), HasSubstr("left generation 1"));
  Leave(w[0], 1, 5);
  Leave(w[2], 1, 5);
  status = Status();
  EXPECT_EQ(status.generation(), 2u);
  EXPECT_EQ(status.members_size(), 3);
}

TEST_F(CoordinatorTest, Store_GenerationEnds_PendingGetAbortedAndKeysGone) {
  auto w = Start(3, Job(2, 3));
  v1::StoreSetRequest set;
  set.set_job_id("test-job");
  set.set_generation(1);
  set.set_key("k");
  ASSERT_THAT(core_->StoreSet(set), IsOk());
  v1::StoreGetRequest get;
  get.set_job_id("test-job");
  get.set_generation(1);
  get.set_key("never");
  std::optional<absl::StatusOr<std::string>> got;
  core_->StoreGet(get, [&](absl::StatusOr<std::string> v) { got = v; });
  core_->OnStreamClosed(w[0].session, "its stream closed");
  ASSERT_TRUE(got.has_value());
  EXPECT_THAT(*got, StatusIs(absl::StatusCode::kAborted, HasSubstr("test-job/1/")));
  EXPECT_THAT(core_->StoreSet(set),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("stale generation 1")));
}

TEST_F(CoordinatorTest, FailedAfterLostPeer_SameFault_CountedOnce) {
  auto w = Start(3, Job(2, 3));
  core_->OnStreamClosed(w[0].session, "its stream closed");
  SendState(w[1], 1, v1::WORKER_STATE_FAILED, "peer gone", absl::StatusCode::kUnavailable, Held(4));
  EXPECT_EQ(w[1].rejected(), 0u);
  SendState(w[1], 1, v1::WORKER_STATE_IDLE, "after a failure", absl::StatusCode::kOk, Held(4));
  Leave(w[2], 1, 4);
  const v1::JobStatus status = Status();
  EXPECT_EQ(status.generation(), 2u);
  EXPECT_EQ(status.faults(), 1u);
  EXPECT_EQ(status.generation_changes_size(), 2);
}

TEST_F(CoordinatorTest, StaleIdle_ForEndedGenerationFromCurrentMember_Ignored) {
  auto w = Start(3, Job(2, 3));
  core_->OnStreamClosed(w[0].session, "its stream closed");
  Leave(w[1], 1, 4);
  Leave(w[2], 1, 4);
  ASSERT_EQ(w[1].assignment().generation(), 2u);
  Leave(w[1], 1, 4);  // a duplicate, late
  const v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(status.generation(), 2u);
  EXPECT_EQ(Find(status, w[1].id())->state(), v1::WORKER_STATE_RENDEZVOUS);
  EXPECT_EQ(w[1].rejected(), 0u);
}

// ---- Fewer than min_workers ------------------------------------------------

class BelowMinTest : public CoordinatorTest {
 protected:
  // Three workers, min_workers 3, one lost, the two survivors idle at step 8.
  void SetUp() override {
    v1::JobSpec spec = Job(3);
    spec.set_rejoin_timeout_seconds(30);
    w_ = Start(3, spec);
    core_->OnStreamClosed(w_[0].session, "its stream closed");
    Leave(w_[1], 1, 8);
    Leave(w_[2], 1, 8);
  }
  std::vector<Beat> Survivors() const { return {{w_[1]}, {w_[2]}}; }
  std::vector<TestWorker> w_;
};

TEST_F(BelowMinTest, RecoveringBelowMin_NobodyComes_FailsAtRejoinTimeoutNamingCounts) {
  v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_RECOVERING);
  EXPECT_THAT(status.message(), HasSubstr("1 more worker"));
  Pass(absl::Seconds(29), Survivors());
  EXPECT_EQ(Status().state(), v1::JOB_STATE_RECOVERING);
  Pass(absl::Seconds(1), Survivors());
  status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("only 2 of the 3 workers"), HasSubstr("rejoin_timeout_seconds 30")));
  EXPECT_EQ(w_[1].assignments(), 1u);
}

TEST_F(BelowMinTest, RecoveringBelowMin_WorkerAttachesInTime_NextGenerationWithIt) {
  Pass(absl::Seconds(20), Survivors());
  auto fresh = *Attach("h", "cpu:3");
  const v1::Assignment a = fresh.assignment();
  EXPECT_EQ(a.generation(), 2u);
  EXPECT_EQ(a.world_size(), 3u);
  EXPECT_EQ(a.rank(), 2u);
  EXPECT_EQ(a.state_source(), v1::STATE_SOURCE_MEMORY);
  EXPECT_EQ(a.start_step(), 8u);
  Pass(absl::Seconds(20), {{w_[1], 2}, {w_[2], 2}, {fresh, 2}});
  const v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  const v1::GenerationChange& change = status.generation_changes(1);
  EXPECT_THAT(Ids(change.left()), ElementsAre(w_[0].id()));
  EXPECT_THAT(Ids(change.joined()), ElementsAre(fresh.id()));
}

TEST_F(BelowMinTest, RecoveringBelowMin_LostWorkerComesBackAsNew_Rejoins) {
  auto back = *Attach("h", "cpu:0");  // the same slot, a new process
  EXPECT_EQ(back.assignment().generation(), 2u);
  EXPECT_EQ(back.assignment().rank(), 0u);
  EXPECT_EQ(back.assignment().source_rank(), 1u);  // it holds nothing; rank 1 does
}

// ---- Failed members ----------------------------------------------------------

class RetryableFailureTest : public CoordinatorTest,
                             public testing::WithParamInterface<absl::StatusCode> {};

TEST_P(RetryableFailureTest, FailedStateChange_RetryableCode_ReformsWithEveryWorker) {
  auto w = Start(3, Job(2, 3));
  SendState(w[1], 1, v1::WORKER_STATE_FAILED, "peer closed the connection", GetParam(), Held(7));
  EXPECT_TRUE(w[1].aborts().empty());
  EXPECT_EQ(w[0].aborts().size(), 1u);
  EXPECT_EQ(w[2].aborts().size(), 1u);
  v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_RECOVERING);
  EXPECT_EQ(status.generation_changes(1).cause(), v1::CHANGE_CAUSE_FAILED);
  EXPECT_THAT(status.generation_changes(1).reason(), HasSubstr("peer closed the connection"));
  SendState(w[1], 1, v1::WORKER_STATE_IDLE, "after a failure", absl::StatusCode::kOk, Held(7));
  Leave(w[0], 1, 7);
  Leave(w[2], 1, 7);
  status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(status.generation(), 2u);
  EXPECT_EQ(status.members_size(), 3);
  EXPECT_EQ(w[1].assignment().start_step(), 7u);
}

INSTANTIATE_TEST_SUITE_P(Codes, RetryableFailureTest,
                         testing::Values(absl::StatusCode::kUnavailable, absl::StatusCode::kAborted,
                                         absl::StatusCode::kDeadlineExceeded,
                                         absl::StatusCode::kCancelled));

class FatalFailureTest : public CoordinatorTest,
                         public testing::WithParamInterface<absl::StatusCode> {};

TEST_P(FatalFailureTest, FailedStateChange_OtherCode_JobFailsWithItsReason) {
  auto workers = StartThree();
  SendState(workers[1], 1, v1::WORKER_STATE_FAILED, "model.path: not a TorchScript file",
            GetParam());
  EXPECT_EQ(workers[0].aborts().size(), 1u);
  const v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(status.message(), AllOf(HasSubstr("rank 0"), HasSubstr("not a TorchScript file")));
}

INSTANTIATE_TEST_SUITE_P(Codes, FatalFailureTest,
                         testing::Values(absl::StatusCode::kOk, absl::StatusCode::kInvalidArgument,
                                         absl::StatusCode::kDataLoss, absl::StatusCode::kInternal));

// ---- Fault budget, DONE crossing an abort ------------------------------------

TEST_F(CoordinatorTest, FaultBudget_Zero_FirstFaultFailsTheJob) {
  v1::JobSpec spec = Job(2, 3);
  spec.set_fault_budget(0);
  auto w = Start(3, spec);
  core_->OnStreamClosed(w[0].session, "its stream closed");
  EXPECT_EQ(w[1].aborts().size(), 1u);
  const v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(status.message(), AllOf(HasSubstr("lost"), HasSubstr("fault budget (0)")));
}

TEST_F(CoordinatorTest, FaultBudget_One_SecondFaultFailsTheJob) {
  v1::JobSpec spec = Job(1, 3);
  spec.set_fault_budget(1);
  auto w = Start(3, spec);
  core_->OnStreamClosed(w[0].session, "its stream closed");
  Leave(w[1], 1, 4);
  Leave(w[2], 1, 4);
  ASSERT_EQ(Status().generation(), 2u);
  core_->OnStreamClosed(w[1].session, "its stream closed");
  const v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(status.message(), HasSubstr("fault budget (1)"));
}

TEST_F(CoordinatorTest, DoneCrossingAbort_Accepted_WorkerNotLeftTraining) {
  auto w = Start(3, Job(2, 3));
  for (const auto& x : w) SendState(x, 1, v1::WORKER_STATE_TRAINING);
  core_->OnStreamClosed(w[0].session, "its stream closed");
  SendState(w[1], 1, v1::WORKER_STATE_DONE, "finished at step 30");  // sent before the abort
  EXPECT_EQ(w[1].rejected(), 0u);
  EXPECT_EQ(Find(Status(), w[1].id())->state(), v1::WORKER_STATE_DONE);
  Leave(w[2], 1, 30);
  EXPECT_EQ(w[1].assignment().generation(), 2u);  // free again, so a member
  EXPECT_EQ(Find(Status(), w[1].id())->state(), v1::WORKER_STATE_RENDEZVOUS);
}

// ---- Checkpoints as a source, the change log ---------------------------------

TEST_F(CoordinatorTest, Checkpoint_EveryWorkerLost_NextGenerationFromCheckpoint) {
  v1::JobSpec spec = Job(1);
  spec.mutable_checkpoint()->set_dir("/tmp/ckpt");
  auto w = Start(1, spec);
  SendReport(w[0], 1, 45, 0.5);
  v1::WorkerMessage m;
  m.mutable_checkpoint()->set_job_id(spec.name());
  m.mutable_checkpoint()->set_generation(1);
  m.mutable_checkpoint()->set_step(40);
  m.mutable_checkpoint()->set_path("/tmp/ckpt/step-40");
  Send(w[0], m);
  core_->OnStreamClosed(w[0].session, "its stream closed");
  auto fresh = *Attach("h", "cpu:1");
  const v1::Assignment a = fresh.assignment();
  EXPECT_EQ(a.generation(), 2u);
  EXPECT_EQ(a.state_source(), v1::STATE_SOURCE_CHECKPOINT);
  EXPECT_EQ(a.source_rank(), 0u);
  EXPECT_EQ(a.start_step(), 40u);
  const v1::GenerationChange change = Status().generation_changes(1);
  EXPECT_EQ(change.state_source(), v1::STATE_SOURCE_CHECKPOINT);
  EXPECT_EQ(change.resume_step(), 40u);
  EXPECT_EQ(change.steps_lost(), 5u);
}

TEST_F(CoordinatorTest, Checkpoint_SourceFallsBackToOlderOne_ChangeShowsRealResumeStep) {
  v1::JobSpec spec = Job(1);
  spec.mutable_checkpoint()->set_dir("/tmp/ckpt");
  auto w = Start(1, spec);
  SendReport(w[0], 1, 45, 0.5);
  v1::WorkerMessage m;
  m.mutable_checkpoint()->set_job_id(spec.name());
  m.mutable_checkpoint()->set_generation(1);
  m.mutable_checkpoint()->set_step(40);
  m.mutable_checkpoint()->set_path("/tmp/ckpt/step-40");
  Send(w[0], m);
  core_->OnStreamClosed(w[0].session, "its stream closed");
  auto fresh = *Attach("h", "cpu:1");
  SendState(fresh, 2, v1::WORKER_STATE_TRAINING, "step-40 is corrupt; loaded step-30",
            absl::StatusCode::kOk, Held(30));
  const v1::GenerationChange change = Status().generation_changes(1);
  EXPECT_EQ(change.resume_step(), 30u);
  EXPECT_EQ(change.steps_lost(), 15u);
  EXPECT_THAT(change.reason(), HasSubstr("step-40 is corrupt"));
}

TEST_F(CoordinatorTest, GenerationChanges_PauseMeasuredToFirstStepOfNewGeneration) {
  auto w = Start(3, Job(2, 3));
  clock_.Advance(absl::Seconds(2));
  for (const auto& x : w) SendReport(x, 1, 1, 0.5);
  EXPECT_DOUBLE_EQ(Status().generation_changes(0).pause_seconds(), 2.0);
  core_->OnStreamClosed(w[2].session, "its stream closed");
  clock_.Advance(absl::Seconds(1));
  Leave(w[0], 1, 1);
  Leave(w[1], 1, 1);
  EXPECT_DOUBLE_EQ(Status().generation_changes(1).pause_seconds(), 0.0);
  clock_.Advance(absl::Milliseconds(1500));
  SendReport(w[0], 2, 2, 0.5);
  clock_.Advance(absl::Seconds(1));
  SendReport(w[1], 2, 2, 0.5);
  const v1::JobStatus status = Status();
  const v1::GenerationChange& change = status.generation_changes(1);
  EXPECT_DOUBLE_EQ(change.pause_seconds(), 2.5);
  EXPECT_EQ(change.from_generation(), 1u);
  EXPECT_EQ(change.to_generation(), 2u);
  EXPECT_THAT(Ids(change.members()), ElementsAre(w[0].id(), w[1].id()));
  EXPECT_THAT(Ids(change.left()), ElementsAre(w[2].id()));
  EXPECT_EQ(change.resume_step(), 1u);
  EXPECT_GT(change.at_unix_seconds(), 0);
  EXPECT_THAT(Ids(status.members()), ElementsAre(w[0].id(), w[1].id()));
  EXPECT_EQ(Find(status, w[1].id())->rank(), 1);
  EXPECT_EQ(Find(status, w[2].id())->rank(), -1);
}

}  // namespace
}  // namespace ddp
