// A coordinator that was not running (stopped, frozen, a clock jump) or not
// hearing (its threads starved) counts no worker lost or hung for it.
#include "coordinator/stall_watch.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator_fixture.h"

namespace ddp {
namespace {

using ::testing::ElementsAre;

struct TickCase {
  const char* name;
  absl::Duration gap;
  absl::Duration stalled;
};

TEST(StallWatch, OnTick_GapBeyondAQuarterOfTheTimeout_IsAStall) {
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  for (const TickCase& c : {TickCase{"a tick's period", absl::Milliseconds(50), {}},
                            TickCase{"a busy machine's delay", absl::Seconds(1), {}},
                            TickCase{"SIGSTOP for 4s", absl::Seconds(4), absl::Seconds(4)},
                            TickCase{"a clock jump", absl::Hours(1), absl::Hours(1)}}) {
    StallWatch watch(StallWatch::ForHeartbeats(absl::Seconds(5), absl::Seconds(1)), t0);
    EXPECT_EQ(watch.OnTick(t0 + c.gap, 3), c.stalled) << c.name;
  }
}

TEST(StallWatch, Deaf_NobodyHeardForHalfTheTimeout_OnlyWithWorkersAttached) {
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  StallWatch watch(StallWatch::ForHeartbeats(absl::Seconds(5), absl::Seconds(1)), t0);
  EXPECT_FALSE(watch.Deaf(t0 + absl::Seconds(2), 3));
  EXPECT_TRUE(watch.Deaf(t0 + absl::Seconds(3), 3));
  EXPECT_FALSE(watch.Deaf(t0 + absl::Seconds(3), 0)) << "nobody to hear";
  // The first word heard ends the deafness and says how long it lasted.
  EXPECT_EQ(watch.OnHeard(t0 + absl::Seconds(4), 3), absl::Seconds(4));
  EXPECT_FALSE(watch.Deaf(t0 + absl::Seconds(4), 3));
  EXPECT_EQ(watch.OnHeard(t0 + absl::Seconds(5), 3), absl::ZeroDuration());
}

TEST(StallWatch, ForHeartbeats_DeafNeverBeforeTwoHeartbeatsNorAfterTheTimeout) {
  EXPECT_EQ(StallWatch::ForHeartbeats(absl::Seconds(5), absl::Seconds(1)).deaf_after,
            absl::Milliseconds(2500));
  EXPECT_EQ(StallWatch::ForHeartbeats(absl::Seconds(2), absl::Seconds(1)).deaf_after,
            absl::Seconds(2));
  EXPECT_EQ(StallWatch::ForHeartbeats(absl::Seconds(2), absl::Milliseconds(500)).deaf_after,
            absl::Seconds(1));
}

TEST(StallWatch, StallThenQueuedHeartbeats_GraceCountedOnce) {
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  StallWatch watch(StallWatch::ForHeartbeats(absl::Seconds(5), absl::Seconds(1)), t0);
  EXPECT_EQ(watch.OnTick(t0 + absl::Seconds(10), 3), absl::Seconds(10));
  EXPECT_EQ(watch.OnHeard(t0 + absl::Seconds(10), 3), absl::ZeroDuration());
  // And the other way round: heard first, then the late tick.
  StallWatch other(StallWatch::ForHeartbeats(absl::Seconds(5), absl::Seconds(1)), t0);
  EXPECT_EQ(other.OnHeard(t0 + absl::Seconds(10), 3), absl::Seconds(10));
  EXPECT_EQ(other.OnTick(t0 + absl::Seconds(10), 3), absl::ZeroDuration());
}

// Three workers training generation 1 at step 5, in the middle of a step.
class CoordinatorStallTest : public CoordinatorTest {
 protected:
  std::vector<Beat> Training(const std::vector<TestWorker>& w) {
    for (const TestWorker& t : w) SendState(t, 1, v1::WORKER_STATE_TRAINING);
    return {{w[0], 1, 5, v1::STEP_PHASE_FORWARD},
            {w[1], 1, 5, v1::STEP_PHASE_ALLREDUCE_WAIT},
            {w[2], 1, 5, v1::STEP_PHASE_BACKWARD}};
  }
  void ExpectUntouched(const std::vector<TestWorker>& w) {
    const v1::JobStatus status = Status();
    EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING) << status.message();
    EXPECT_EQ(status.generation(), 1u);
    EXPECT_EQ(status.generation_changes_size(), 1) << "only the start";
    for (const TestWorker& t : w) {
      EXPECT_FALSE(t.channel->closed().has_value()) << t.id();
      EXPECT_TRUE(t.aborts().empty()) << t.id();
    }
  }
};

TEST_F(CoordinatorStallTest, Stopped_TwiceTheHeartbeatTimeout_NothingReforms) {
  auto w = StartThree();
  const std::vector<Beat> beats = Training(w);
  Pass(absl::Seconds(2), beats);
  // SIGSTOP for 10s: no tick, nothing read. Then the ticker runs before the
  // heartbeats queued on the streams are read.
  clock_.Advance(absl::Seconds(10));
  core_->Tick();
  Pass(absl::Seconds(3), beats);
  ExpectUntouched(w);
}

TEST_F(CoordinatorStallTest, Stopped_HeartbeatsReadBeforeTheFirstTick_NothingReforms) {
  auto w = StartThree();
  const std::vector<Beat> beats = Training(w);
  Pass(absl::Seconds(2), beats);
  clock_.Advance(absl::Seconds(10));
  // One worker's heartbeat comes first; the others' only after the tick.
  Heartbeat(w[1], 1, 5, v1::STEP_PHASE_ALLREDUCE_WAIT);
  core_->Tick();
  Pass(absl::Seconds(3), beats);
  ExpectUntouched(w);
}

TEST_F(CoordinatorStallTest, StarvedThreads_TickerRunsButHearsNobody_NothingReforms) {
  auto w = StartThree();
  const std::vector<Beat> beats = Training(w);
  Pass(absl::Seconds(2), beats);
  // The ticker goes on, but no stream handler runs for 10s: twice the
  // heartbeat timeout.
  Pass(absl::Seconds(10), {});
  Pass(absl::Seconds(3), beats);
  ExpectUntouched(w);
}

TEST_F(CoordinatorStallTest, AfterAStall_ASilentWorkerIsStillLost) {
  auto w = StartThree();
  const std::vector<Beat> beats = Training(w);
  Pass(absl::Seconds(2), beats);
  clock_.Advance(absl::Seconds(10));
  core_->Tick();
  // w[2] is really gone: the others are heard, and it is lost a heartbeat
  // timeout after the grace began.
  Pass(absl::Seconds(4), {beats[0], beats[1]});
  EXPECT_FALSE(w[2].channel->closed().has_value()) << "still within its grace";
  Pass(absl::Seconds(2), {beats[0], beats[1]});
  ASSERT_TRUE(w[2].channel->closed().has_value());
  const v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_RECOVERING);
  EXPECT_THAT(Ids(status.generation_changes(1).left()), ElementsAre(w[2].id()));
}

TEST_F(CoordinatorStallTest, Stopped_LongerThanTheHangThreshold_NobodyEvictedAsHung) {
  v1::JobSpec spec = Job(3);
  spec.set_hang_timeout_seconds(3);
  auto w = Start(3, spec);
  const std::vector<Beat> beats = Training(w);
  Pass(absl::Seconds(2), beats);
  clock_.Advance(absl::Seconds(20));
  core_->Tick();
  Pass(absl::Seconds(2), beats);
  ExpectUntouched(w);
}

}  // namespace
}  // namespace ddp
