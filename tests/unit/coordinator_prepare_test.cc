// A worker is admitted only once it holds the job's state: the coordinator
// asks free ddp-workers to build it (Prepare) ahead of any generation, and
// a joiner that never trained holds up no recovery.
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator_fixture.h"

namespace ddp {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

std::vector<v1::Prepare> Prepares(const TestWorker& w) {
  std::vector<v1::Prepare> out;
  for (const auto& m : w.channel->Of(v1::CoordinatorMessage::kPrepare)) out.push_back(m.prepare());
  return out;
}

class CoordinatorPrepareTest : public CoordinatorTest {
 protected:
  // A worker that builds its state only when the test says so.
  TestWorker Slow(const std::string& device) {
    return *AttachWith(Req("h", device), /*auto_prepare=*/false);
  }
  void Prepared(const TestWorker& w) {
    const std::vector<v1::Prepare> asked = Prepares(w);
    ASSERT_FALSE(asked.empty()) << w.id() << " was never asked to prepare";
    SendState(w, 0, v1::WORKER_STATE_IDLE, "prepared", absl::StatusCode::kOk,
              RecordingChannel::Fresh(asked.back()));
  }
};

TEST_F(CoordinatorPrepareTest, Submit_EveryFreeWorkerAskedOnceWithTheSpec) {
  auto a = Slow("cpu:0");
  auto b = Slow("cpu:1");
  EXPECT_THAT(Prepares(a), IsEmpty()) << "no job yet";
  ASSERT_THAT(Submit(*core_, Job(2, 3)), IsOk());
  ASSERT_EQ(Prepares(a).size(), 1u);
  EXPECT_EQ(Prepares(a)[0].job_id(), "test-job");
  EXPECT_EQ(Prepares(a)[0].spec().min_workers(), 2u);
  Pass(absl::Seconds(3), {{a}, {b}});
  EXPECT_EQ(Prepares(a).size(), 1u) << "asked once";
  // A worker attaching later is asked when it attaches, while the job can
  // take it (max_workers); beyond, the pool keeps it for other jobs.
  auto c = Slow("cpu:2");
  EXPECT_EQ(Prepares(c).size(), 1u);
  auto d = Slow("cpu:3");
  EXPECT_THAT(Prepares(d), IsEmpty());
}

TEST_F(CoordinatorPrepareTest, Unprepared_NoGenerationUntilTheyHoldTheState) {
  auto a = Slow("cpu:0");
  auto b = Slow("cpu:1");
  ASSERT_THAT(Submit(*core_, Job(2)), IsOk());
  Pass(absl::Seconds(5), {{a}, {b}});
  EXPECT_EQ(a.assignments(), 0u);
  EXPECT_THAT(Status().message(),
              HasSubstr("waiting for 2 workers (2 attached: 0 ready, 2 still preparing)"));
  Prepared(a);
  EXPECT_EQ(a.assignments(), 0u);
  EXPECT_THAT(Status().message(), HasSubstr("(2 attached: 1 ready, 1 still preparing)"));
  Prepared(b);
  ASSERT_EQ(a.assignments(), 1u);
  EXPECT_EQ(a.assignment().state_source(), v1::STATE_SOURCE_FRESH) << "a prepared state is fresh";
}

TEST_F(CoordinatorPrepareTest, FirstGeneration_WaitsForAWorkerStillPreparing) {
  v1::JobSpec spec = Job(2, 3);  // settle_seconds 0
  auto a = Slow("cpu:0");
  auto b = Slow("cpu:1");
  auto c = Slow("cpu:2");
  ASSERT_THAT(Submit(*core_, spec), IsOk());
  Prepared(a);
  Prepared(b);
  Pass(absl::Seconds(2), {{a}, {b}, {c}});
  EXPECT_EQ(a.assignments(), 0u) << "c is attached and still building its state";
  Prepared(c);
  ASSERT_EQ(a.assignments(), 1u);
  EXPECT_EQ(a.assignment().world_size(), 3u);
}

TEST_F(CoordinatorPrepareTest, FirstGeneration_APreparationPastTheTimeout_StartsWithout) {
  v1::JobSpec spec = Job(2, 3);
  spec.set_collective_timeout_seconds(10);
  auto a = Slow("cpu:0");
  auto b = Slow("cpu:1");
  auto c = Slow("cpu:2");
  ASSERT_THAT(Submit(*core_, spec), IsOk());
  Prepared(a);
  Prepared(b);
  Pass(absl::Seconds(11), {{a}, {b}, {c}});
  ASSERT_EQ(a.assignments(), 1u);
  EXPECT_EQ(a.assignment().world_size(), 2u);
  EXPECT_EQ(c.assignments(), 0u);
}

TEST_F(CoordinatorPrepareTest, Joiner_AdmittedOnlyOnceItHoldsTheState) {
  v1::JobSpec spec = Job(2, 3);
  spec.set_reform_min_interval_seconds(0);
  auto w = Start(2, spec);
  auto joiner = Slow("cpu:2");
  ASSERT_EQ(Prepares(joiner).size(), 1u);
  Pass(absl::Seconds(5), {{w[0], 1, 3}, {w[1], 1, 3}, {joiner}});
  EXPECT_TRUE(w[0].aborts().empty()) << "members keep training while the joiner builds its state";
  Prepared(joiner);
  ASSERT_EQ(w[0].aborts().size(), 1u);
  EXPECT_TRUE(w[0].aborts()[0].at_step_boundary());
}

TEST_F(CoordinatorPrepareTest, FaultDuringAJoin_ReformsWithoutWaitingForTheJoiner) {
  v1::JobSpec spec = Job(1, 3);
  spec.set_reform_min_interval_seconds(0);
  auto w = Start(2, spec);
  for (const TestWorker& t : w)
    SendState(t, 1, v1::WORKER_STATE_TRAINING, "", absl::StatusCode::kOk, Held(0, 0, 0, 1));
  auto joiner = *Attach("h", "cpu:2");  // prepared at once
  Leave(w[0], 1, 4);
  Leave(w[1], 1, 4);
  ASSERT_EQ(joiner.assignment().generation(), 2u);
  // Generation 2 meets at the rendezvous; the members start (they hold the
  // state), the joiner is still connecting when w[1] dies.
  SendState(w[0], 2, v1::WORKER_STATE_TRAINING, "", absl::StatusCode::kOk, Held(4, 0, 0, 2));
  core_->OnStreamClosed(w[1].session, "killed");
  Leave(w[0], 2, 4);
  // Re-formed from the survivor at once, without the joiner's leave.
  ASSERT_EQ(w[0].assignment().generation(), 3u);
  EXPECT_EQ(w[0].assignment().start_step(), 4u);
  EXPECT_EQ(w[0].assignment().world_size(), 1u);
  // Once the joiner has left, it is admitted again.
  SendState(joiner, 2, v1::WORKER_STATE_IDLE, "left", absl::StatusCode::kOk,
            RecordingChannel::Fresh(Prepares(joiner).back()));
  Pass(absl::Seconds(1), {{w[0], 3, 4}, {joiner}});
  ASSERT_EQ(w[0].aborts().size(), 3u);
  EXPECT_TRUE(w[0].aborts().back().at_step_boundary());
}

TEST_F(CoordinatorPrepareTest, PrepareFails_BadDataFile_JobFailsNamingTheWorker) {
  auto a = Slow("cpu:0");
  ASSERT_THAT(Submit(*core_, Job(1)), IsOk());
  SendState(a, 0, v1::WORKER_STATE_FAILED, "can't prepare job test-job: no file /data/x",
            absl::StatusCode::kInvalidArgument);
  const v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(status.message(), AllOf(HasSubstr(a.id()), HasSubstr("no file /data/x")));
}

TEST_F(CoordinatorPrepareTest, PrepareFails_Transiently_NotAskedAgainJobGoesOn) {
  auto a = Slow("cpu:0");
  auto b = Slow("cpu:1");
  ASSERT_THAT(Submit(*core_, Job(1, 2)), IsOk());
  SendState(a, 0, v1::WORKER_STATE_FAILED, "the data's file server did not answer",
            absl::StatusCode::kUnavailable);
  SendState(a, 0, v1::WORKER_STATE_IDLE, "after a failed preparation");
  Prepared(b);
  Pass(absl::Seconds(3), {{a}, {b}});
  EXPECT_EQ(Prepares(a).size(), 1u);
  EXPECT_EQ(b.assignments(), 1u);
  EXPECT_EQ(a.assignments(), 0u);
  EXPECT_EQ(Status().state(), v1::JOB_STATE_RUNNING);
}

TEST_F(CoordinatorPrepareTest, StateDropped_AskedToPrepareAgain) {
  auto w = Start(2, Job(2));
  ASSERT_EQ(Prepares(w[0]).size(), 1u);
  // The generation failed and the worker dropped a half-applied state: it
  // holds nothing now.
  SendState(w[0], 1, v1::WORKER_STATE_FAILED, "peer closed", absl::StatusCode::kUnavailable,
            v1::HeldState());
  SendState(w[0], 1, v1::WORKER_STATE_IDLE, "after a failure", absl::StatusCode::kOk,
            v1::HeldState());
  EXPECT_EQ(Prepares(w[0]).size(), 2u);
}

TEST_F(CoordinatorPrepareTest, ProgramJob_ProgramsAreNeverAskedToPrepare) {
  v1::RegisterRequest r = Req("h", "cpu:0");
  r.mutable_capabilities()->set_program(true);
  auto program = *AttachWith(r, /*auto_prepare=*/false);
  v1::JobSpec spec = Job(1);
  spec.mutable_model()->set_kind("program");
  spec.clear_dataset();
  ASSERT_THAT(Submit(*core_, spec), IsOk());
  EXPECT_THAT(Prepares(program), IsEmpty());
  EXPECT_EQ(program.assignments(), 1u);
}

}  // namespace
}  // namespace ddp
