// Acknowledged means durable: SubmitJob and CancelJob answer only once the
// state holding their effect is saved, and a save that fails answers
// UNAVAILABLE and changes nothing.
#include <atomic>
#include <memory>

#include "absl/synchronization/notification.h"
#include "tests/unit/coordinator_fixture.h"
#include "tests/unit/gated_store.h"

namespace ddp {
namespace {

using ::testing::HasSubstr;

class DurabilityTest : public CoordinatorTest {
 protected:
  DurabilityTest() { Reopen(); }
  ~DurabilityTest() override { core_.reset(); }  // its writer saves to store_

  void Reopen() {
    core_.reset();
    Coordinator::Options options = TestOptions();
    options.state_store = &store_;
    core_ = std::make_unique<Coordinator>(&clock_, options);
  }

  // What a coordinator killed now would find when it starts again.
  v1::DurableState OnDisk() {
    auto loaded = store_.Load();
    EXPECT_THAT(loaded, IsOk());
    return loaded->value_or(v1::DurableState());
  }

  // A second coordinator, started on what is on disk now (the first
  // killed without flushing anything).
  std::unique_ptr<Coordinator> Successor() {
    auto next = std::make_unique<Coordinator>(&clock_, TestOptions());
    next->Restore(OnDisk());
    return next;
  }

  GatedStore store_;
};

TEST_F(DurabilityTest, SubmitJob_AnswersOnlyOnceSaved_AndTheJobSurvivesAKillRightAfter) {
  store_.Close();
  absl::Notification answered;
  absl::StatusOr<v1::JobSpec> answer;
  core_->SubmitJob(Job(1), [&](absl::StatusOr<v1::JobSpec> s) {
    answer = std::move(s);
    answered.Notify();
  });
  store_.AwaitSaves(1);
  EXPECT_FALSE(answered.HasBeenNotified()) << "answered before the job was saved";
  // Not yet in effect: no worker is given to it.
  auto w = *Attach("h", "cpu:0");
  EXPECT_EQ(w.assignments(), 0u);
  store_.Open();
  ASSERT_TRUE(answered.WaitForNotificationWithTimeout(absl::Seconds(30)));
  ASSERT_THAT(answer, IsOk());
  // Killed right after the OK: the next coordinator has the job.
  std::unique_ptr<Coordinator> next = Successor();
  EXPECT_THAT(next->GetJob("test-job"), IsOk());
}

TEST_F(DurabilityTest, SubmitJob_SaveFails_UnavailableAndNothingChanged) {
  store_.Fail();
  auto w = *Attach("h", "cpu:0");
  EXPECT_THAT(Submit(*core_, Job(1)),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("could not save its state")));
  EXPECT_THAT(core_->GetJob("test-job"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(w.assignments(), 0u);
  v1::ListJobsRequest all;
  EXPECT_EQ(core_->ListJobs(all)->jobs_size(), 0);
  // Once the store takes writes again, the same submission goes through.
  store_.Fail(false);
  EXPECT_THAT(Submit(*core_, Job(1)), IsOk());
  EXPECT_EQ(w.assignments(), 1u);
}

TEST_F(DurabilityTest, SubmitJob_ManyQueuedAtOnce_EveryAcknowledgedJobSurvives) {
  auto w = *Attach("h", "cpu:0");
  ASSERT_THAT(Submit(*core_, Job(1)), IsOk());  // holds the pool: the rest queue
  store_.Close();
  constexpr int kJobs = 5;
  std::vector<std::unique_ptr<absl::Notification>> answered;
  std::vector<absl::Status> answers(kJobs);
  for (int i = 0; i < kJobs; ++i) {
    answered.push_back(std::make_unique<absl::Notification>());
    v1::JobSpec spec = Job(1);
    spec.set_name(absl::StrCat("queued-", i));
    core_->SubmitJob(spec, [&, i](absl::StatusOr<v1::JobSpec> s) {
      answers[i] = s.status();
      answered[i]->Notify();
    });
  }
  store_.Open();
  for (int i = 0; i < kJobs; ++i) {
    ASSERT_TRUE(answered[i]->WaitForNotificationWithTimeout(absl::Seconds(30)));
    EXPECT_THAT(answers[i], IsOk());
  }
  std::unique_ptr<Coordinator> next = Successor();
  for (int i = 0; i < kJobs; ++i) {
    EXPECT_THAT(next->GetJob(absl::StrCat("queued-", i)), IsOk()) << i;
  }
  // Batched: far fewer writes than changes (the first job's, then at most
  // the one in progress and one more for the five).
  EXPECT_LE(store_.saved().size(), 8u);
}

TEST_F(DurabilityTest, CancelJob_AnswersOnlyOnceSaved_AndStaysCancelledAfterAKill) {
  auto w = Start(1, Job(1));
  ASSERT_EQ(w[0].assignments(), 1u);
  store_.Close();
  absl::Notification answered;
  absl::Status answer;
  core_->CancelJob("test-job", "enough", [&](absl::Status s) {
    answer = std::move(s);
    answered.Notify();
  });
  store_.AwaitSaves(static_cast<int>(store_.saved().size()) + 1);
  EXPECT_FALSE(answered.HasBeenNotified());
  EXPECT_TRUE(w[0].aborts().empty()) << "carried out before it was saved";
  store_.Open();
  ASSERT_TRUE(answered.WaitForNotificationWithTimeout(absl::Seconds(30)));
  ASSERT_THAT(answer, IsOk());
  EXPECT_FALSE(w[0].aborts().empty());
  std::unique_ptr<Coordinator> next = Successor();
  EXPECT_EQ(next->GetJob("test-job")->state(), v1::JOB_STATE_CANCELLED);
}

TEST_F(DurabilityTest, CancelJob_SaveFails_UnavailableAndTheJobTrainsOn) {
  auto w = Start(1, Job(1));
  store_.Fail();
  EXPECT_THAT(Cancel(*core_, "test-job", "enough"), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_TRUE(w[0].aborts().empty());
  EXPECT_EQ(Status().state(), v1::JOB_STATE_RUNNING);
}

TEST_F(DurabilityTest, CancelJob_QueuedJob_GoneFromTheQueueOnDiskBeforeTheAnswer) {
  auto w = Start(1, Job(1));
  v1::JobSpec queued = Job(1);
  queued.set_name("queued");
  ASSERT_THAT(Submit(*core_, queued), IsOk());
  ASSERT_EQ(OnDisk().queue_size(), 1);
  ASSERT_THAT(Cancel(*core_, "queued", "not needed"), IsOk());
  EXPECT_EQ(OnDisk().queue_size(), 0);
  EXPECT_EQ(Successor()->GetJob("queued")->state(), v1::JOB_STATE_CANCELLED);
}

// A leader whose lease is unconfirmed for a moment pauses: what workers say
// of themselves meanwhile is held (not acted on), registrations are refused,
// and everything held is taken up in order once it may act again.
TEST_F(CoordinatorTest, MayNotAct_WorkerEventsHeldThenTakenUpInOrder) {
  std::atomic<bool> may_act{true};
  Coordinator::Options options = TestOptions();
  options.may_act = [&may_act] { return may_act.load(); };
  core_ = std::make_unique<Coordinator>(&clock_, options);
  auto w = Start(2, Job(2));
  ASSERT_EQ(w[0].assignment().generation(), 1u);
  may_act = false;
  // w1's stream closes: held, so nothing re-forms while paused.
  core_->OnStreamClosed(w[1].session, "connection reset");
  EXPECT_TRUE(w[0].aborts().empty());
  EXPECT_THAT(Attach("h", "cpu:7"), StatusIs(absl::StatusCode::kUnavailable));
  may_act = true;
  core_->Tick();
  ASSERT_EQ(w[0].aborts().size(), 1u);  // the loss, taken up
  EXPECT_EQ(Status().state(), v1::JOB_STATE_RECOVERING);
}

// A job that ended holds no workers, and a worker that leaves once its job
// ended (or once told to stop) is done, not lost.
TEST_F(CoordinatorTest, JobEnded_HoldsNoWorkers_AndThoseLeavingAfterwardAreNotLost) {
  auto w = Start(2, Job(2));
  for (const auto& x : w) SendState(x, 1, v1::WORKER_STATE_DONE);
  ASSERT_EQ(Status().state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(core_->GetJob("test-job")->workers(), 0u);
  core_->OnStreamClosed(w[0].session, "exited");
  core_->StopAllWorkers("the coordinator exits");
  core_->OnStreamClosed(w[1].session, "exited");
  const v1::JobStatus status = Status();
  for (const auto& x : w) {
    const v1::WorkerStatus* ws = Find(status, x.id());
    ASSERT_NE(ws, nullptr);
    EXPECT_EQ(ws->state(), v1::WORKER_STATE_DONE) << ws->detail();
  }
  EXPECT_EQ(status.jobs(0).workers(), 0u);
}

}  // namespace
}  // namespace ddp
