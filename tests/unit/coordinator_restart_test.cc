// A coordinator that restarts: what it saves, what it restores, and how it
// adopts the generation that kept training without it.
#include <cstdlib>

#include "coordinator/state_store.h"
#include "tests/unit/coordinator_fixture.h"

namespace ddp {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

// ---- Restore ---------------------------------------------------------------

TEST_F(CoordinatorTest, Restore_ContinuesGenerationNumbersAndWaitsForWorkers) {
  v1::DurableState saved;
  *saved.mutable_job() = WithDefaults(Job(1));
  saved.set_job_state(v1::JOB_STATE_RUNNING);
  saved.set_latest_generation(41);
  core_->Restore(saved);
  EXPECT_EQ(Status().state(), v1::JOB_STATE_WAITING);
  auto w = Attach("h", "cpu:0");
  EXPECT_EQ(w->assignment().generation(), 42u);
}

TEST_F(CoordinatorTest, Restore_ActiveJobWithoutGeneration_NextFormsFromHeldState) {
  v1::DurableState saved;
  *saved.mutable_job() = WithDefaults(Job(1));
  saved.set_job_state(v1::JOB_STATE_RECOVERING);
  saved.set_latest_generation(3);
  saved.set_global_step(50);
  core_->Restore(saved);
  const v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_RECOVERING);
  EXPECT_THAT(status.message(), HasSubstr("step 50"));
  v1::RegisterRequest r = Req("h", "cpu:0");
  *r.mutable_held() = Held(50, 1, 128);
  auto w = *AttachWith(r);
  const v1::Assignment a = w.assignment();
  EXPECT_EQ(a.generation(), 4u);
  EXPECT_EQ(a.state_source(), v1::STATE_SOURCE_MEMORY);
  EXPECT_EQ(a.start_step(), 50u);
  EXPECT_EQ(a.start_epoch(), 1u);
}

TEST_F(CoordinatorTest, Restore_SpecSavedWithoutNewerFields_DefaultsFilledIn) {
  v1::JobSpec old = WithDefaults(Job(2, 3));  // as a build before these fields saved it
  old.clear_fault_budget();
  old.clear_hang_timeout_seconds();
  old.clear_rejoin_timeout_seconds();
  old.clear_reform_min_interval_seconds();
  old.clear_lr_scaling();
  v1::DurableState saved;
  *saved.mutable_job() = old;
  saved.set_job_state(v1::JOB_STATE_WAITING);
  core_->Restore(saved);
  const v1::JobSpec restored = Status().spec();
  EXPECT_EQ(restored.fault_budget(), 100u);
  EXPECT_DOUBLE_EQ(restored.hang_timeout_seconds(), 60);
  EXPECT_DOUBLE_EQ(restored.rejoin_timeout_seconds(), 300);
  EXPECT_EQ(restored.lr_scaling(), "keep");
  EXPECT_THAT(Submit(*core_, Job(2, 3)), IsOk());  // the unit's --job again: a no-op
}

// The state is input: a restored job whose paths or pins no longer pass the
// submission's checks is failed with the reason, and a queued one leaves
// the queue as failed; neither reaches a worker.
TEST_F(CoordinatorTest, Restore_JobsFailingTheRecheck_FailedWithTheReasonNeverAssigned) {
  Coordinator::Options options = TestOptions();
  options.recheck_restored = [](const v1::JobSpec& spec) {
    return spec.name() == "fine" ? absl::OkStatus()
                                 : absl::InvalidArgumentError("data.path: not under a data root");
  };
  core_ = std::make_unique<Coordinator>(&clock_, options);
  v1::DurableState saved;
  v1::JobSpec running = WithDefaults(Job(1));
  running.set_name("moved");
  *saved.mutable_job() = running;
  saved.set_job_state(v1::JOB_STATE_RUNNING);
  saved.set_latest_generation(3);
  v1::JobSpec fine = WithDefaults(Job(1));
  fine.set_name("fine");
  v1::JobSpec refused = WithDefaults(Job(1));
  refused.set_name("refused");
  for (const v1::JobSpec& spec : {fine, refused}) {
    v1::DurableQueuedJob* q = saved.add_queue();
    *q->mutable_spec() = spec;
    q->set_owner("admin");
    q->set_sequence(saved.queue_size());
  }
  core_->Restore(saved);
  absl::StatusOr<v1::JobSummary> moved = core_->GetJob("moved");
  ASSERT_THAT(moved, IsOk());
  EXPECT_EQ(moved->state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(moved->message(), AllOf(HasSubstr("failed the submission's checks"),
                                      HasSubstr("data.path: not under a data root")));
  absl::StatusOr<v1::JobSummary> gone = core_->GetJob("refused");
  ASSERT_THAT(gone, IsOk());
  EXPECT_EQ(gone->state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(gone->message(), HasSubstr("data.path: not under a data root"));
  // The job that passed is the one a worker gets.
  auto w = Attach("h", "cpu:0");
  EXPECT_EQ(w->assignment().job_id(), "fine");
}

// ---- Adoption --------------------------------------------------------------

class AdoptionTest : public CoordinatorTest {
 protected:
  // Generation 5 of a 1-2 worker job was training on h/cpu:0 and h/cpu:1
  // from step 90 when the coordinator stopped.
  void SetUp() override {
    v1::DurableState saved;
    *saved.mutable_job() = WithDefaults(Job(1, 2));
    saved.set_job_state(v1::JOB_STATE_RUNNING);
    saved.set_latest_generation(5);
    saved.set_global_step(100);
    v1::DurableGeneration* g = saved.mutable_generation();
    g->set_number(5);
    for (const char* device : {"cpu:0", "cpu:1"}) {
      v1::DurableMember* m = g->add_members();
      m->set_worker_id(absl::StrCat("h/", device));
      m->set_host("h");
      m->set_device(device);
    }
    g->set_start_step(90);
    g->set_state_source(v1::STATE_SOURCE_MEMORY);
    g->set_lr(0.01);
    core_->Restore(saved);
  }

  // A worker re-attaching, saying it trains in `generation` as `rank`.
  TestWorker Return(const std::string& device, uint64_t generation, uint32_t rank,
                    uint64_t step = 104) {
    v1::RegisterRequest r = Req("h", device);
    r.set_generation(generation);
    r.set_rank(rank);
    *r.mutable_held() = Held(step);
    return *AttachWith(r);
  }
};

TEST_F(AdoptionTest, Adoption_EveryMemberReturns_AdoptedWithoutNewGeneration) {
  EXPECT_EQ(Status().state(), v1::JOB_STATE_RECOVERING);
  auto a = Return("cpu:0", 5, 0);
  EXPECT_THAT(Status().message(), HasSubstr("1 of generation 5's 2 members are back"));
  auto b = Return("cpu:1", 5, 1);
  for (const auto& w : {a, b}) {
    EXPECT_EQ(w.assignments(), 0u);
    EXPECT_TRUE(w.aborts().empty());
  }
  SendReport(a, 5, 105, 0.5);
  SendReport(b, 5, 105, 0.5);
  EXPECT_EQ(a.rejected(), 0u);
  const v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(status.generation(), 5u);
  EXPECT_EQ(status.global_step(), 105u);
  EXPECT_EQ(status.faults(), 0u);
  EXPECT_THAT(Ids(status.members()), ElementsAre("h/cpu:0", "h/cpu:1"));
  const v1::GenerationChange& change =
      status.generation_changes(status.generation_changes_size() - 1);
  EXPECT_EQ(change.cause(), v1::CHANGE_CAUSE_ADOPTED);
  EXPECT_EQ(change.from_generation(), 5u);
  EXPECT_EQ(change.to_generation(), 5u);
  EXPECT_EQ(change.resume_step(), 104u);
  EXPECT_EQ(change.pause_seconds(), 0);
  v1::StoreSetRequest set;
  set.set_job_id("test-job");
  set.set_generation(5);
  set.set_key("k");
  EXPECT_THAT(core_->StoreSet(set), IsOk());
}

TEST_F(AdoptionTest, Adoption_MemberFinishesBeforeOthersReturn_JobStillSucceeds) {
  auto a = Return("cpu:0", 5, 0);
  SendState(a, 5, v1::WORKER_STATE_DONE, "finished at step 120");
  auto b = Return("cpu:1", 5, 1);
  ASSERT_EQ(Status().state(), v1::JOB_STATE_RUNNING);
  SendState(b, 5, v1::WORKER_STATE_DONE, "finished at step 120");
  EXPECT_EQ(Status().state(), v1::JOB_STATE_SUCCEEDED);
}

TEST_F(AdoptionTest, Adoption_MemberClaimsWrongRank_GetsAbort) {
  auto a = Return("cpu:0", 5, 1);
  const auto aborts = a.aborts();
  ASSERT_EQ(aborts.size(), 1u);
  EXPECT_EQ(aborts[0].generation(), 5u);
  EXPECT_THAT(aborts[0].reason(), HasSubstr("claims rank 1 but holds rank 0"));
  auto stranger = Return("cpu:7", 5, 0);
  ASSERT_EQ(stranger.aborts().size(), 1u);
  EXPECT_THAT(stranger.aborts()[0].reason(), HasSubstr("not a member of generation 5"));
  EXPECT_EQ(Status().state(), v1::JOB_STATE_RECOVERING);
}

TEST_F(AdoptionTest, Adoption_GraceExpires_ReformsWithoutMissingMember) {
  auto a = Return("cpu:0", 5, 0);
  Pass(absl::Seconds(9), {{a, 5, 104, v1::STEP_PHASE_FORWARD}});
  EXPECT_TRUE(a.aborts().empty());
  EXPECT_EQ(Status().state(), v1::JOB_STATE_RECOVERING);
  Pass(absl::Seconds(1), {{a, 5, 104, v1::STEP_PHASE_FORWARD}});
  ASSERT_EQ(a.aborts().size(), 1u);
  EXPECT_FALSE(a.aborts()[0].at_step_boundary());
  Leave(a, 5, 106);
  const v1::Assignment assignment = a.assignment();
  EXPECT_EQ(assignment.generation(), 6u);
  EXPECT_EQ(assignment.world_size(), 1u);
  EXPECT_EQ(assignment.state_source(), v1::STATE_SOURCE_MEMORY);
  EXPECT_EQ(assignment.start_step(), 106u);
  const v1::JobStatus status = Status();
  const v1::GenerationChange& change =
      status.generation_changes(status.generation_changes_size() - 1);
  EXPECT_EQ(change.cause(), v1::CHANGE_CAUSE_COORDINATOR_RESTART);
  EXPECT_EQ(change.from_generation(), 5u);
  EXPECT_EQ(change.to_generation(), 6u);
  EXPECT_THAT(Ids(change.left()), ElementsAre("h/cpu:1"));
  EXPECT_THAT(change.reason(), AllOf(HasSubstr("h/cpu:1"), HasSubstr("did not come back")));
}

TEST_F(AdoptionTest, Adoption_MemberBackWithGenerationZero_EndsAdoptionAtOnce) {
  auto a = Return("cpu:0", 5, 0);
  auto b = Return("cpu:1", 0, 0);  // it left generation 5 while we were away
  ASSERT_EQ(a.aborts().size(), 1u);
  EXPECT_TRUE(b.aborts().empty());
  EXPECT_EQ(Status().state(), v1::JOB_STATE_RECOVERING);
  Leave(a, 5, 104);
  EXPECT_EQ(a.assignment().generation(), 6u);
  EXPECT_EQ(b.assignment().generation(), 6u);
  EXPECT_EQ(b.assignment().start_step(), 104u);
}

TEST_F(AdoptionTest, Adoption_MemberBackAsANewProcessHoldingNothing_EndsAdoptionAtOnce) {
  auto a = Return("cpu:0", 5, 0);
  // cpu:1 was killed and restarted: a new process, with no generation and
  // no state. Generation 5 can't go on; nothing waits out the grace.
  auto b = *Attach("h", "cpu:1");
  ASSERT_EQ(a.aborts().size(), 1u);
  EXPECT_THAT(a.aborts()[0].reason(), HasSubstr("came back without it"));
  Leave(a, 5, 104);
  EXPECT_EQ(a.assignment().generation(), 6u);
  EXPECT_EQ(a.assignment().start_step(), 104u);
  EXPECT_EQ(b.assignment().generation(), 6u);
  EXPECT_EQ(Status().state(), v1::JOB_STATE_RUNNING);
}

TEST_F(AdoptionTest, Adoption_ReturnedMembersStreamCloses_EndsAdoptionAtOnce) {
  auto a = Return("cpu:0", 5, 0);
  core_->OnStreamClosed(a.session, "connection reset");
  const v1::JobStatus status = Status();
  EXPECT_THAT(status.message(), Not(HasSubstr("members are back")));
  EXPECT_EQ(status.faults(), 1u);
  // The one that comes back now is not kept waiting either.
  auto b = Return("cpu:1", 5, 1);
  ASSERT_EQ(b.aborts().size(), 1u);
  Leave(b, 5, 104);
  EXPECT_EQ(b.assignment().generation(), 6u);
}

TEST_F(CoordinatorTest, Attach_ClaimingAnEndedGeneration_ToldToLeaveAndNumbersJump) {
  ASSERT_THAT(Submit(*core_, Job(2)), IsOk());
  v1::RegisterRequest r = Req("h", "cpu:0");
  r.set_generation(9);
  auto w = *AttachWith(r);
  ASSERT_EQ(w.aborts().size(), 1u);
  EXPECT_EQ(w.aborts()[0].generation(), 9u);
  auto other = *Attach("h", "cpu:1");
  EXPECT_EQ(other.assignment().generation(), 10u);  // fencing holds past what we remember
}

// ---- The durable state -------------------------------------------------------

TEST_F(PersistTest, BeginShutdown_StreamsCloseAfterwards_GenerationStillSavedForAdoption) {
  auto w = Start(2, Job(2));
  core_->BeginShutdown();
  // The server stopping closes every stream: no worker is lost for that.
  for (const auto& x : w) core_->OnStreamClosed(x.session, "the server is shutting down");
  clock_.Advance(absl::Seconds(60));
  core_->Tick();
  for (const auto& x : w) EXPECT_TRUE(x.aborts().empty());
  const v1::DurableState saved = Saved();
  EXPECT_EQ(saved.job_state(), v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(saved.has_generation());
  EXPECT_EQ(saved.generation().number(), 1u);
}

TEST_F(PersistTest, FlushState_Running_HoldsCurrentGenerationAndIsRestorable) {
  Start(2, Job(2));
  const v1::DurableState saved = Saved();
  EXPECT_EQ(saved.job().name(), "test-job");
  EXPECT_EQ(saved.job_state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(saved.latest_generation(), 1u);
  ASSERT_TRUE(saved.has_generation());
  EXPECT_EQ(saved.generation().number(), 1u);
  ASSERT_EQ(saved.generation().members_size(), 2);
  EXPECT_EQ(saved.generation().members(1).worker_id(), "h/cpu:1");
  EXPECT_EQ(saved.generation().members(1).device(), "cpu:1");
  EXPECT_EQ(saved.generation_changes_size(), 1);

  Reopen();
  core_->Restore(saved);
  EXPECT_EQ(Status().state(), v1::JOB_STATE_RECOVERING);
  for (uint32_t rank : {0u, 1u}) {
    v1::RegisterRequest r = Req("h", absl::StrCat("cpu:", rank));
    r.set_generation(1);
    r.set_rank(rank);
    EXPECT_EQ(AttachWith(r)->assignments(), 0u);
  }
  const v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(status.generation(), 1u);
  const v1::DurableState again = Saved();
  EXPECT_EQ(again.generation().number(), 1u);
  EXPECT_EQ(again.generation_changes(again.generation_changes_size() - 1).cause(),
            v1::CHANGE_CAUSE_ADOPTED);
}

TEST_F(PersistTest, FlushState_AfterFaultAndCheckpoint_ProgressAndChangesSaved) {
  v1::JobSpec spec = Job(1, 2);
  spec.mutable_checkpoint()->set_dir("/tmp/ckpt");
  auto w = Start(2, spec);
  SendReport(w[0], 1, 12, 0.5);
  v1::WorkerMessage m;
  m.mutable_checkpoint()->set_job_id(spec.name());
  m.mutable_checkpoint()->set_generation(1);
  m.mutable_checkpoint()->set_step(10);
  m.mutable_checkpoint()->set_path("/tmp/ckpt/step-10");
  Send(w[0], m);
  core_->OnStreamClosed(w[1].session, "its stream closed");
  v1::DurableState saved = Saved();
  EXPECT_EQ(saved.job_state(), v1::JOB_STATE_RECOVERING);
  EXPECT_FALSE(saved.has_generation());
  EXPECT_EQ(saved.global_step(), 12u);
  EXPECT_EQ(saved.last_checkpoint_step(), 10u);
  EXPECT_EQ(saved.faults(), 1u);
  ASSERT_EQ(saved.generation_changes_size(), 2);
  EXPECT_EQ(saved.generation_changes(1).cause(), v1::CHANGE_CAUSE_LOST);
  Leave(w[0], 1, 12);
  saved = Saved();
  EXPECT_EQ(saved.generation().number(), 2u);
  EXPECT_EQ(saved.generation().start_step(), 12u);
  EXPECT_EQ(saved.generation().state_source(), v1::STATE_SOURCE_MEMORY);
}

TEST_F(PersistTest, FlushState_JobEnded_NoGenerationAndSameSpecIsANoOpAfterRestart) {
  auto w = Start(2, Job(2));
  for (const auto& x : w) SendState(x, 1, v1::WORKER_STATE_DONE);
  const v1::DurableState saved = Saved();
  EXPECT_EQ(saved.job_state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_FALSE(saved.has_generation());
  Reopen();
  core_->Restore(saved);
  EXPECT_THAT(Submit(*core_, Job(2)), IsOk());
  auto again = *Attach("h", "cpu:5");
  EXPECT_EQ(again.assignments(), 0u);
  EXPECT_EQ(Status().state(), v1::JOB_STATE_SUCCEEDED);
}

}  // namespace
}  // namespace ddp
