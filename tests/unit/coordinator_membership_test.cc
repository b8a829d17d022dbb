// The coordinator changing a running generation's members: joiners are
// admitted at a step boundary, at most every reform_min_interval_seconds;
// members whose step stops advancing are evicted as hung.
#include "tests/unit/coordinator_fixture.h"

namespace ddp {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// ---- Joiners ---------------------------------------------------------------

TEST_F(CoordinatorTest, Joiner_RateLimited_AdmittedAtStepBoundaryAfterInterval) {
  v1::JobSpec spec = Job(2, 3);
  spec.set_reform_min_interval_seconds(10);
  auto w = Start(2, spec);
  ASSERT_EQ(w[0].assignment().world_size(), 2u);
  Pass(absl::Seconds(1), {{w[0], 1}, {w[1], 1}});
  auto joiner = *Attach("h", "cpu:2");
  Pass(absl::Seconds(8), {{w[0], 1}, {w[1], 1}, {joiner}});
  EXPECT_TRUE(w[0].aborts().empty());  // 9s after generation 1 formed
  EXPECT_EQ(joiner.assignments(), 0u);
  Pass(absl::Seconds(1), {{w[0], 1}, {w[1], 1}, {joiner}});
  for (const auto& m : w) {
    const auto aborts = m.aborts();
    ASSERT_EQ(aborts.size(), 1u);
    EXPECT_EQ(aborts[0].generation(), 1u);
    EXPECT_TRUE(aborts[0].at_step_boundary());
  }
  Pass(absl::Seconds(2), {{w[0], 1}, {w[1], 1}, {joiner}});
  EXPECT_EQ(w[0].aborts().size(), 1u);  // asked once
  EXPECT_EQ(Status().state(), v1::JOB_STATE_RUNNING);
  Leave(w[0], 1, 20);
  EXPECT_EQ(joiner.assignments(), 0u);  // w[1] is still finishing its step
  Leave(w[1], 1, 20);
  const v1::Assignment a = joiner.assignment();
  EXPECT_EQ(a.generation(), 2u);
  EXPECT_EQ(a.world_size(), 3u);
  EXPECT_EQ(a.state_source(), v1::STATE_SOURCE_MEMORY);
  EXPECT_EQ(a.start_step(), 20u);
  const v1::JobStatus status = Status();
  EXPECT_EQ(status.faults(), 0u);
  const v1::GenerationChange& change = status.generation_changes(1);
  EXPECT_EQ(change.cause(), v1::CHANGE_CAUSE_JOINED);
  EXPECT_THAT(Ids(change.joined()), ElementsAre(joiner.id()));
  EXPECT_THAT(change.left(), IsEmpty());
  EXPECT_EQ(change.steps_lost(), 0u);
}

TEST_F(CoordinatorTest, Joiner_MembersMissTheStepBoundary_AbortedAtOnceAfterThreshold) {
  v1::JobSpec spec = Job(2, 3);
  spec.set_hang_timeout_seconds(30);
  spec.set_reform_min_interval_seconds(0);
  auto w = Start(2, spec);
  auto joiner = *Attach("h", "cpu:2");
  ASSERT_EQ(w[0].aborts().size(), 1u);
  for (uint64_t step = 1; step <= 31; ++step) {  // training on, never leaving
    Pass(absl::Seconds(1), {{w[0], 1, step}, {w[1], 1, step}, {joiner}});
  }
  for (const auto& m : w) {
    ASSERT_EQ(m.aborts().size(), 2u);
    EXPECT_FALSE(m.aborts()[1].at_step_boundary());
    EXPECT_FALSE(m.channel->closed().has_value());
  }
  EXPECT_THAT(Status().generation_changes(1).reason(), HasSubstr("step boundary"));
  Leave(w[0], 1, 31);
  Leave(w[1], 1, 31);
  EXPECT_EQ(joiner.assignment().generation(), 2u);
  EXPECT_EQ(joiner.assignment().world_size(), 3u);
}

TEST_F(CoordinatorTest, Joiner_WorldAtMaxWorkers_WaitsIdle) {
  auto w = Start(2, Job(2));
  auto joiner = *Attach("h", "cpu:2");
  Pass(absl::Seconds(30), {{w[0], 1}, {w[1], 1}, {joiner}});
  EXPECT_TRUE(w[0].aborts().empty());
  EXPECT_EQ(joiner.assignments(), 0u);
  EXPECT_EQ(Find(Status(), joiner.id())->state(), v1::WORKER_STATE_IDLE);
}

TEST_F(CoordinatorTest, Joiner_MemberDoneBeforeOthers_NotTakenForAJoiner) {
  v1::JobSpec spec = Job(2, 3);
  spec.set_reform_min_interval_seconds(10);
  auto w = Start(2, spec);
  Pass(absl::Seconds(20), {{w[0], 1, 30}, {w[1], 1, 30}});
  SendState(w[0], 1, v1::WORKER_STATE_DONE, "finished at step 30");
  Pass(absl::Seconds(2), {{w[0], 1, 30}, {w[1], 1, 30}});
  EXPECT_TRUE(w[1].aborts().empty());
  SendState(w[1], 1, v1::WORKER_STATE_DONE, "finished at step 30");
  EXPECT_EQ(Status().state(), v1::JOB_STATE_SUCCEEDED);
}

// ---- Hung members ----------------------------------------------------------

TEST_F(CoordinatorTest, Hung_StepStopsAdvancing_EvictedAndNextGenerationWithoutIt) {
  v1::JobSpec spec = Job(2, 3);
  spec.set_hang_timeout_seconds(30);
  auto w = Start(3, spec);
  for (const auto& x : w) SendReport(x, 1, 5, 0.5);
  const std::vector<Beat> stuck = {{w[0], 1, 5, v1::STEP_PHASE_ALLREDUCE_WAIT},
                                   {w[1], 1, 5, v1::STEP_PHASE_FORWARD},
                                   {w[2], 1, 5, v1::STEP_PHASE_ALLREDUCE_WAIT}};
  Pass(absl::Seconds(30), stuck);
  EXPECT_FALSE(w[1].channel->closed().has_value());
  Pass(absl::Seconds(1), stuck);
  ASSERT_TRUE(w[1].channel->closed().has_value());
  EXPECT_THAT(*w[1].channel->closed(), StatusIs(absl::StatusCode::kAborted, HasSubstr("hung")));
  for (int i : {0, 2}) {
    ASSERT_EQ(w[i].aborts().size(), 1u);
    EXPECT_FALSE(w[i].aborts()[0].at_step_boundary());
    EXPECT_FALSE(w[i].channel->closed().has_value());
  }
  v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_RECOVERING);
  const v1::GenerationChange& change = status.generation_changes(1);
  EXPECT_EQ(change.cause(), v1::CHANGE_CAUSE_HUNG);
  EXPECT_THAT(Ids(change.left()), ElementsAre(w[1].id()));
  EXPECT_THAT(change.reason(), AllOf(HasSubstr("rank 1"), HasSubstr("forward")));
  Leave(w[0], 1, 5);
  Leave(w[2], 1, 5);
  status = Status();
  EXPECT_EQ(status.generation(), 2u);
  EXPECT_THAT(Ids(status.members()), ElementsAre(w[0].id(), w[2].id()));
  EXPECT_EQ(Find(status, w[1].id())->state(), v1::WORKER_STATE_LOST);
  // SIGCONT: the same process comes back, and is a new worker.
  auto back = AttachWith(w[1].request);
  ASSERT_THAT(back, IsOk());
  EXPECT_EQ(Find(Status(), w[1].id())->state(), v1::WORKER_STATE_IDLE);
  EXPECT_EQ(Status().faults(), 1u);
}

TEST_F(CoordinatorTest, Hung_SlowSteps_ThresholdIsTenMedianStepTimes) {
  v1::JobSpec spec = Job(1, 2);
  spec.set_hang_timeout_seconds(30);
  auto w = Start(2, spec);
  for (const auto& x : w) SendReport(x, 1, 5, 0.5, "", /*step_seconds=*/5);
  const std::vector<Beat> stuck = {{w[0], 1, 5, v1::STEP_PHASE_FORWARD},
                                   {w[1], 1, 5, v1::STEP_PHASE_ALLREDUCE_WAIT}};
  Pass(absl::Seconds(50), stuck);
  EXPECT_FALSE(w[0].channel->closed().has_value());
  EXPECT_EQ(Status().state(), v1::JOB_STATE_RUNNING);
  Pass(absl::Seconds(1), stuck);
  EXPECT_TRUE(w[0].channel->closed().has_value());
  EXPECT_EQ(Status().generation_changes(1).cause(), v1::CHANGE_CAUSE_HUNG);
}

TEST_F(CoordinatorTest, Hung_AllStuckInCollectivesAtOneStep_ReformsWithSameWorkers) {
  v1::JobSpec spec = Job(2);
  spec.set_hang_timeout_seconds(30);
  auto w = Start(2, spec);
  // Training (stuck in the first step): members still meeting their peers
  // are bounded by the collective timeout, not the hang threshold.
  for (const auto& x : w) SendState(x, 1, v1::WORKER_STATE_TRAINING);
  Pass(absl::Seconds(31),
       {{w[0], 1, 0, v1::STEP_PHASE_ALLREDUCE_WAIT}, {w[1], 1, 0, v1::STEP_PHASE_BACKWARD}});
  for (const auto& x : w) {
    EXPECT_FALSE(x.channel->closed().has_value());
    ASSERT_EQ(x.aborts().size(), 1u);
  }
  EXPECT_THAT(Status().generation_changes(1).reason(), HasSubstr("every rank is stuck"));
  Leave(w[0], 1, 0);
  Leave(w[1], 1, 0);
  EXPECT_EQ(w[0].assignment().generation(), 2u);
  EXPECT_EQ(w[1].assignment().world_size(), 2u);
}

TEST_F(CoordinatorTest, Hung_MemberLeftForJoinersWhileAnotherIsStuck_OnlyTheStuckOneEvicted) {
  v1::JobSpec spec = Job(2, 3);
  spec.set_hang_timeout_seconds(30);
  spec.set_reform_min_interval_seconds(0);
  auto w = Start(2, spec);
  for (const auto& x : w) SendReport(x, 1, 5, 0.5);
  Pass(absl::Seconds(10),
       {{w[0], 1, 5, v1::STEP_PHASE_OPTIMIZER}, {w[1], 1, 5, v1::STEP_PHASE_FORWARD}});
  auto joiner = *Attach("h", "cpu:2");  // admitted at once: both are asked to leave
  ASSERT_EQ(w[0].aborts().size(), 1u);
  Leave(w[0], 1, 5);  // left at the boundary; w[1] never does
  Pass(absl::Seconds(21), {{w[0]}, {w[1], 1, 5, v1::STEP_PHASE_FORWARD}, {joiner}});
  EXPECT_FALSE(w[0].channel->closed().has_value());
  ASSERT_TRUE(w[1].channel->closed().has_value());
  const v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_THAT(Ids(status.members()), ElementsAre(w[0].id(), joiner.id()));
}

}  // namespace
}  // namespace ddp
