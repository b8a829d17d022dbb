// An evaluation is not a hang: every rank evaluates its share of the test
// set under a bound of its own (sent in its heartbeats), the coordinator
// waits that long for it, and a lost evaluation is asked for again.
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator_fixture.h"

namespace ddp {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr auto kEvaluate = v1::STEP_PHASE_EVALUATE;
constexpr auto kEvaluateWait = v1::STEP_PHASE_EVALUATE_WAIT;

// Three workers training generation 1 of a 3-epoch job with a 3s hang
// timeout.
class CoordinatorEvaluationTest : public CoordinatorTest {
 protected:
  std::vector<TestWorker> Training(uint32_t min_workers = 3) {
    v1::JobSpec spec = Job(min_workers, 3);
    spec.set_hang_timeout_seconds(3);
    spec.set_epochs(3);
    auto w = Start(3, spec);
    for (const TestWorker& t : w) SendState(t, 1, v1::WORKER_STATE_TRAINING);
    for (const TestWorker& t : w) SendReport(t, 1, 5, 0.5);
    return w;
  }
  void ExpectStillRunning(const std::vector<TestWorker>& w) {
    const v1::JobStatus status = Status();
    EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING) << status.message();
    EXPECT_EQ(status.generation(), 1u);
    for (const TestWorker& t : w) EXPECT_FALSE(t.channel->closed().has_value()) << t.id();
  }
};

TEST_F(CoordinatorEvaluationTest, Evaluating_PastTheHangThresholdWithinItsBound_NobodyEvicted) {
  auto w = Training();
  // Rank 1's share is the slowest; the others wait for it in the sums'
  // all-reduce. 30s: ten times the hang threshold.
  Pass(absl::Seconds(30), {{w[0], 1, 5, kEvaluateWait, 100},
                           {w[1], 1, 5, kEvaluate, 100},
                           {w[2], 1, 5, kEvaluateWait, 100}});
  ExpectStillRunning(w);
}

TEST_F(CoordinatorEvaluationTest, Evaluating_PastItsBound_TheRankStillEvaluatingIsEvicted) {
  auto w = Training();
  Pass(absl::Seconds(102), {{w[0], 1, 5, kEvaluateWait, 100},
                            {w[1], 1, 5, kEvaluate, 100},
                            {w[2], 1, 5, kEvaluateWait, 100}});
  ASSERT_TRUE(w[1].channel->closed().has_value());
  EXPECT_FALSE(w[0].channel->closed().has_value());
  const v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_RECOVERING);
  EXPECT_EQ(status.generation_changes(1).cause(), v1::CHANGE_CAUSE_HUNG);
  EXPECT_THAT(status.generation_changes(1).reason(),
              AllOf(HasSubstr("rank 1"), HasSubstr("phase evaluate"), HasSubstr("threshold 100")));
  EXPECT_THAT(Ids(status.generation_changes(1).left()), ElementsAre(w[1].id()));
}

TEST_F(CoordinatorEvaluationTest, AfterTheEvaluation_TheNextStepIsTimedFromItsEnd) {
  auto w = Training();
  Pass(absl::Seconds(30),
       {{w[0], 1, 5, kEvaluate, 100}, {w[1], 1, 5, kEvaluate, 100}, {w[2], 1, 5, kEvaluate, 100}});
  // The evaluation is over; the ranks are in step 6, whose clock starts
  // now, not at step 5 (30s ago).
  const std::vector<Beat> stepping = {{w[0], 1, 5, v1::STEP_PHASE_ALLREDUCE_WAIT},
                                      {w[1], 1, 5, v1::STEP_PHASE_FORWARD},
                                      {w[2], 1, 5, v1::STEP_PHASE_ALLREDUCE_WAIT}};
  Pass(absl::Seconds(2), stepping);
  ExpectStillRunning(w);
  // Stuck past the threshold after the evaluation: hung.
  Pass(absl::Seconds(3), stepping);
  ASSERT_TRUE(w[1].channel->closed().has_value());
  EXPECT_THAT(Status().generation_changes(1).reason(), HasSubstr("phase forward"));
}

TEST_F(CoordinatorEvaluationTest, StepReportAfterTheEvaluatingHeartbeat_DoesNotHideTheBound) {
  auto w = Training();
  for (const TestWorker& t : w) Heartbeat(t, 1, 6, kEvaluate, 100);
  // The reports of step 6 arrive after the heartbeats that already counted
  // it (reports are batched): they must not turn "evaluating" back into
  // "optimizer".
  for (const TestWorker& t : w) SendReport(t, 1, 6, 0.4);
  Pass(absl::Seconds(20), {});
  ExpectStillRunning(w);
}

TEST_F(CoordinatorEvaluationTest, JoinerWaitingWhileTheMembersEvaluate_NoTimeoutFault) {
  v1::JobSpec spec = Job(2, 3);
  spec.set_hang_timeout_seconds(3);
  spec.set_reform_min_interval_seconds(0);
  auto w = Start(2, spec);
  for (const TestWorker& t : w) SendState(t, 1, v1::WORKER_STATE_TRAINING);
  for (const TestWorker& t : w) Heartbeat(t, 1, 5, kEvaluate, 100);
  auto joiner = *Attach("h", "cpu:9");
  // The members were asked to leave at the next step boundary; it comes
  // only once the evaluation is over.
  ASSERT_EQ(w[0].aborts().size(), 1u);
  EXPECT_TRUE(w[0].aborts()[0].at_step_boundary());
  Pass(absl::Seconds(20), {{w[0], 1, 5, kEvaluate, 100}, {w[1], 1, 5, kEvaluate, 100}, {joiner}});
  const v1::JobStatus status = Status();
  ASSERT_EQ(status.generation_changes_size(), 2);
  EXPECT_EQ(status.generation_changes(1).cause(), v1::CHANGE_CAUSE_JOINED)
      << status.generation_changes(1).reason();
  EXPECT_EQ(w[0].aborts().size(), 1u) << "no abort at once for a timeout";
  // The evaluation ends; the members reach the boundary a step later.
  Pass(absl::Seconds(2),
       {{w[0], 1, 5, v1::STEP_PHASE_FORWARD}, {w[1], 1, 5, v1::STEP_PHASE_FORWARD}, {joiner}});
  EXPECT_EQ(w[0].aborts().size(), 1u) << "the members get a step after the evaluation";
  Leave(w[0], 1, 6);
  Leave(w[1], 1, 6);
  EXPECT_EQ(joiner.assignment().generation(), 2u);
}

TEST_F(CoordinatorEvaluationTest, HeartbeatBound_NotFiniteOrOverADay_Rejected) {
  auto w = Training();
  for (double bound : {-1.0, 86401.0, std::nan("")}) {
    const size_t before = w[0].rejected();
    Heartbeat(w[0], 1, 5, kEvaluate, bound);
    EXPECT_EQ(w[0].rejected(), before + 1) << bound;
  }
  ExpectStillRunning(w);
}

TEST_F(CoordinatorEvaluationTest, NextGeneration_ToldWhichEpochsHaveTheirResult) {
  auto w = Training(/*min_workers=*/2);
  for (uint64_t epoch : {1, 0}) {  // in any order
    v1::WorkerMessage m;
    m.mutable_epoch_result()->set_generation(1);
    m.mutable_epoch_result()->set_epoch(epoch);
    m.mutable_epoch_result()->set_test_accuracy(0.5 + epoch / 10.0);
    Send(w[0], m);
  }
  EXPECT_DOUBLE_EQ(Status().test_accuracy(), 0.6) << "the newest epoch's";
  core_->OnStreamClosed(w[2].session, "killed");
  Leave(w[0], 1, 5);
  Leave(w[1], 1, 5);
  Pass(absl::Seconds(1), {{w[0]}, {w[1]}});
  ASSERT_EQ(w[0].assignment().generation(), 2u);
  EXPECT_EQ(w[0].assignment().evaluated_epochs(), 2u);
}

}  // namespace
}  // namespace ddp
