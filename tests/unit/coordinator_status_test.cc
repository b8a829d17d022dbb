// The status counts what happened: each change's pause from the last step
// before it to the first step after it, every worker that left, the world
// size that is training, and the start change's story across a restart.
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator_fixture.h"

namespace ddp {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

TEST_F(CoordinatorTest, Pause_FromTheLastStepBeforeTheFault_NotFromItsDetection) {
  auto w = Start(3, Job(2, 3));
  for (const auto& x : w) SendReport(x, 1, 7, 0.5);
  // w[2] goes silent after step 7: the others wait in a collective, and the
  // coordinator notices only after the heartbeat timeout.
  Pass(absl::Seconds(6), {{w[0], 1, 7}, {w[1], 1, 7}});
  ASSERT_EQ(Status().state(), v1::JOB_STATE_RECOVERING);
  Leave(w[0], 1, 7);
  Leave(w[1], 1, 7);
  clock_.Advance(absl::Seconds(1));
  SendReport(w[0], 2, 8, 0.5);
  const v1::GenerationChange change = Status().generation_changes(1);
  EXPECT_DOUBLE_EQ(change.pause_seconds(), 7.0);  // 6s unnoticed + 1s to re-form and step
  EXPECT_DOUBLE_EQ(change.at_unix_seconds() - change.last_step_unix_seconds(), 6.0);
}

TEST_F(CoordinatorTest, Pause_AJoinAtAStepBoundary_FromTheStepTheMembersLeftAt) {
  v1::JobSpec spec = Job(2, 3);
  spec.set_reform_min_interval_seconds(0);
  auto w = Start(2, spec);
  auto joiner = *Attach("h", "cpu:9");  // the change opens now...
  clock_.Advance(absl::Seconds(3));
  for (const auto& x : w) SendReport(x, 1, 4, 0.5);  // ...the members train on to step 4
  Leave(w[0], 1, 4);
  Leave(w[1], 1, 4);
  clock_.Advance(absl::Milliseconds(500));
  SendReport(joiner, 2, 5, 0.5);
  const v1::GenerationChange change = Status().generation_changes(1);
  EXPECT_EQ(change.cause(), v1::CHANGE_CAUSE_JOINED);
  EXPECT_DOUBLE_EQ(change.pause_seconds(), 0.5);
}

TEST_F(CoordinatorTest, Pause_AGenerationThatNeverTrained_BothChangesEndWithTheNextStep) {
  auto w = Start(3, Job(1, 3));
  for (const auto& x : w) SendReport(x, 1, 3, 0.5);
  core_->OnStreamClosed(w[2].session, "killed");
  Leave(w[0], 1, 3);
  Leave(w[1], 1, 3);
  ASSERT_EQ(w[0].assignment().generation(), 2u);
  clock_.Advance(absl::Seconds(1));
  core_->OnStreamClosed(w[1].session, "killed too, before generation 2 trained");
  Leave(w[0], 2, 3);
  ASSERT_EQ(w[0].assignment().generation(), 3u);
  clock_.Advance(absl::Seconds(1));
  SendReport(w[0], 3, 4, 0.5);
  const v1::JobStatus status = Status();
  ASSERT_EQ(status.generation_changes_size(), 3);
  EXPECT_DOUBLE_EQ(status.generation_changes(1).pause_seconds(), 2.0);
  EXPECT_DOUBLE_EQ(status.generation_changes(2).pause_seconds(), 2.0);
}

TEST_F(CoordinatorTest, Left_TwoLostTogether_BothNamedAndOneThatCameBackJoinedToo) {
  auto w = Start(3, Job(1, 3));
  core_->OnStreamClosed(w[1].session, "killed");
  core_->OnStreamClosed(w[2].session, "killed");
  auto back = *AttachWith(Req("h", "cpu:2"));  // w[2] restarted: a new process, same id
  Leave(w[0], 1, 0);
  const v1::JobStatus status = Status();
  const v1::GenerationChange& change = status.generation_changes(1);
  ASSERT_EQ(change.to_generation(), 2u);
  EXPECT_THAT(Ids(change.left()), UnorderedElementsAre(w[1].id(), w[2].id()));
  EXPECT_THAT(Ids(change.members()), ElementsAre(w[0].id(), back.id()));
  EXPECT_THAT(Ids(change.joined()), ElementsAre(back.id()));
}

TEST_F(CoordinatorTest, Left_SurvivorsThatFollowedTheAbort_NotNamed) {
  auto w = Start(3, Job(2, 3));
  core_->OnStreamClosed(w[2].session, "killed");
  Leave(w[0], 1, 0);
  Leave(w[1], 1, 0);
  const v1::GenerationChange change = Status().generation_changes(1);
  EXPECT_THAT(Ids(change.left()), ElementsAre(w[2].id()));
  EXPECT_THAT(change.joined(), testing::IsEmpty());
}

TEST_F(CoordinatorTest, WorldSize_TheGenerationTraining_ZeroWhileRecovering) {
  auto w = Start(3, Job(1, 3));
  EXPECT_EQ(Status().world_size(), 3u);
  core_->OnStreamClosed(w[2].session, "killed");
  Leave(w[0], 1, 0);
  v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_RECOVERING);
  EXPECT_EQ(status.world_size(), 0u) << "nothing trains while w[1] has not left";
  Leave(w[1], 1, 0);
  EXPECT_EQ(Status().world_size(), 2u);
}

TEST_F(PersistTest, StartChange_ReasonAndPauseKeptAcrossARestart) {
  auto w = Start(2, Job(2));
  SendState(w[0], 1, v1::WORKER_STATE_TRAINING, "fresh weights", absl::StatusCode::kOk,
            Held(0, 0, 0, 1));
  clock_.Advance(absl::Seconds(2));
  for (const auto& x : w) SendReport(x, 1, 1, 0.5);
  Restart();
  v1::JobStatus status = Status();
  ASSERT_GE(status.generation_changes_size(), 1);
  EXPECT_EQ(status.generation_changes(0).cause(), v1::CHANGE_CAUSE_START);
  EXPECT_THAT(status.generation_changes(0).reason(), HasSubstr("fresh weights"));
  EXPECT_DOUBLE_EQ(status.generation_changes(0).pause_seconds(), 2.0);
}

TEST_F(PersistTest, PauseStillOpenAtARestart_MeasuredByTheNextCoordinator) {
  auto w = Start(2, Job(1, 2));
  for (const auto& x : w) SendReport(x, 1, 5, 0.5);
  core_->OnStreamClosed(w[1].session, "killed");
  Leave(w[0], 1, 5);
  ASSERT_EQ(w[0].assignment().generation(), 2u);
  Restart();  // before generation 2's first step
  v1::RegisterRequest r = w[0].request;
  r.set_generation(2);
  r.set_rank(0);
  *r.mutable_held() = Held(5, 0, 0, 2);
  auto back = *AttachWith(r);
  clock_.Advance(absl::Seconds(3));
  SendReport(back, 2, 6, 0.5);
  const v1::JobStatus status = Status();
  const v1::GenerationChange& lost = status.generation_changes(1);
  EXPECT_EQ(lost.cause(), v1::CHANGE_CAUSE_LOST);
  EXPECT_DOUBLE_EQ(lost.pause_seconds(), 3.0);
}

}  // namespace
}  // namespace ddp
