// What one worker or client can make the coordinator hold, and the
// refusals at each limit: reported text and names, step reports, the
// store through the coordinator, Attach streams that never register.
#include <cmath>
#include <limits>
#include <optional>

#include "coordinator/report_checks.h"
#include "tests/unit/coordinator_fixture.h"

namespace ddp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

class CoordinatorLimitsTest : public CoordinatorTest {
 protected:
  // The latest Rejected message `w` got.
  static v1::Rejected LastRejected(const TestWorker& w) {
    auto all = w.channel->Of(v1::CoordinatorMessage::kRejected);
    return all.empty() ? v1::Rejected() : all.back().rejected();
  }
};

TEST_F(CoordinatorLimitsTest, StateChange_HugeDetail_CutInStatus) {
  auto workers = Start(1, Job(1));
  SendState(workers[0], 1, v1::WORKER_STATE_TRAINING, std::string(5 << 20, 'd'));
  const v1::JobStatus status = Status();
  const v1::WorkerStatus* w = Find(status, workers[0].id());
  ASSERT_NE(w, nullptr);
  EXPECT_LE(w->detail().size(), kMaxReportedTextBytes);
  EXPECT_EQ(w->detail().substr(w->detail().size() - 3), "...");
}

TEST_F(CoordinatorLimitsTest, Report_StepFarBeyondTheStart_RejectedAndNotTaken) {
  auto workers = Start(1, Job(1));
  SendState(workers[0], 1, v1::WORKER_STATE_TRAINING);
  SendReport(workers[0], 1, 5, 0.5);
  SendReport(workers[0], 1, std::numeric_limits<uint64_t>::max(), 0.5);
  EXPECT_EQ(LastRejected(workers[0]).code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(LastRejected(workers[0]).message(), HasSubstr("2^40"));
  SendReport(workers[0], 1, kMaxStepAdvance + 1, 0.5);
  EXPECT_EQ(workers[0].rejected(), 2u);
  SendReport(workers[0], 1, kMaxStepAdvance, 0.5);  // the limit itself is fine
  EXPECT_EQ(workers[0].rejected(), 2u);
  const v1::JobStatus status = Status();
  EXPECT_EQ(Find(status, workers[0].id())->step(), kMaxStepAdvance);
  // A heartbeat can't carry one either.
  Heartbeat(workers[0], 1, std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(workers[0].rejected(), 3u);
  const v1::JobStatus after = Status();
  EXPECT_EQ(Find(after, workers[0].id())->step(), kMaxStepAdvance);
}

TEST_F(CoordinatorLimitsTest, Report_NanOrNegativeTiming_Refused) {
  auto workers = Start(1, Job(1));
  SendState(workers[0], 1, v1::WORKER_STATE_TRAINING);
  for (double bad : {std::nan(""), -1.0, std::numeric_limits<double>::infinity()}) {
    v1::WorkerMessage m;
    v1::StepReport* r = m.mutable_reports()->add_reports();
    r->set_generation(1);
    r->set_step(1);
    r->mutable_timings()->set_backward_ms(bad);
    Send(workers[0], m);
  }
  EXPECT_EQ(workers[0].rejected(), 3u);
  EXPECT_THAT(LastRejected(workers[0]).message(), HasSubstr("timings.backward_ms"));
  EXPECT_EQ(Find(Status(), workers[0].id())->step(), 0u);
}

TEST_F(CoordinatorLimitsTest, Report_NanLossAndSeconds_LossKeptAsNanSecondsRefused) {
  auto workers = Start(1, Job(1));
  SendState(workers[0], 1, v1::WORKER_STATE_TRAINING);
  SendReport(workers[0], 1, 1, std::nan(""));
  SendReport(workers[0], 1, 2, std::numeric_limits<double>::infinity());
  EXPECT_EQ(workers[0].rejected(), 0u);
  SendReport(workers[0], 1, 3, 0.5, "", std::nan(""));
  SendReport(workers[0], 1, 3, 0.5, "", -1);
  SendReport(workers[0], 1, 3, 0.5, "", std::numeric_limits<double>::infinity());
  EXPECT_EQ(workers[0].rejected(), 3u);
  EXPECT_THAT(LastRejected(workers[0]).message(), HasSubstr("step_seconds"));
  for (int i = 0; i < 3; ++i) {
    clock_.Advance(absl::Seconds(1));
    Heartbeat(workers[0], 1, 2);
    core_->Tick();
  }
  const v1::JobStatus status = Status();
  EXPECT_TRUE(std::isinf(Find(status, workers[0].id())->last_loss()));
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
}

TEST_F(CoordinatorLimitsTest, ReportBatch_OverLimit_ResourceExhaustedAndNothingTaken) {
  auto workers = Start(1, Job(1));
  SendState(workers[0], 1, v1::WORKER_STATE_TRAINING);
  v1::WorkerMessage m;
  for (size_t i = 0; i <= kMaxReportsPerBatch; ++i) {
    v1::StepReport* r = m.mutable_reports()->add_reports();
    r->set_generation(1);
    r->set_step(i + 1);
  }
  Send(workers[0], m);
  EXPECT_EQ(LastRejected(workers[0]).code(),
            static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(LastRejected(workers[0]).message(), HasSubstr("limit is 10000"));
  const v1::JobStatus status = Status();
  EXPECT_EQ(Find(status, workers[0].id())->step(), 0u);
}

TEST_F(CoordinatorLimitsTest, Report_ManyUnusedNames_StoredUpToTheLimitRestCounted) {
  auto workers = Start(1, Job(1));
  SendState(workers[0], 1, v1::WORKER_STATE_TRAINING);
  v1::WorkerMessage m;
  v1::StepReport* r = m.mutable_reports()->add_reports();
  r->set_generation(1);
  r->set_step(1);
  for (int i = 0; i < 3000; ++i) {
    r->mutable_reduction()->add_newly_unused_parameter_names(absl::StrCat("p", i));
  }
  r->mutable_reduction()->add_newly_unused_parameter_names(std::string(1 << 20, 'x'));
  Send(workers[0], m);
  const v1::JobStatus status = Status();
  const v1::WorkerStatus* w = Find(status, workers[0].id());
  EXPECT_EQ(static_cast<size_t>(w->unused_parameters_size()), kMaxNewUnusedNamesPerReport);
  EXPECT_EQ(w->unused_parameter_names_dropped(), 2001u);
  // The names are kept once, not again inside the last reduction status.
  EXPECT_EQ(w->reduction().newly_unused_parameter_names_size(), 0);
  EXPECT_LT(status.ByteSizeLong(), 64u << 10);
}

TEST_F(CoordinatorLimitsTest, EpochResult_BeyondTheJobsEpochs_Rejected) {
  auto workers = Start(1, Job(1));
  v1::WorkerMessage m;
  m.mutable_epoch_result()->set_generation(1);
  m.mutable_epoch_result()->set_epoch(1u << 30);
  Send(workers[0], m);
  EXPECT_THAT(LastRejected(workers[0]).message(), HasSubstr("the job has 1 epochs"));
  EXPECT_EQ(Status().epoch_results_size(), 0);
}

TEST_F(CoordinatorLimitsTest, CancelJob_HugeReasonAndId_CutAndQuoted) {
  Start(1, Job(1));
  EXPECT_THAT(Cancel(*core_, std::string(1 << 20, 'j'), "r"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("(1048576 bytes)")));
  EXPECT_THAT(Cancel(*core_, "test-job", std::string(1 << 20, 'r')), IsOk());
  EXPECT_LT(Status().message().size(), 2 * kMaxReportedTextBytes);
}

TEST_F(CoordinatorLimitsTest, StoreGet_CancelledByItsCaller_NothingHeld) {
  StartThree();
  v1::StoreGetRequest get;
  get.set_job_id("test-job");
  get.set_generation(1);
  get.set_key("never");
  get.set_timeout_seconds(3600);
  std::vector<KvStore::WaiterId> waiters;
  int cancelled = 0;
  for (int i = 0; i < 20000; ++i) {
    waiters.push_back(core_->StoreGet(get, [&](absl::StatusOr<std::string> v) {
      cancelled += v.status().code() == absl::StatusCode::kCancelled;
    }));
  }
  EXPECT_EQ(core_->store_waiters(), 20000u);
  for (KvStore::WaiterId w : waiters) core_->CancelStoreGet(w);
  EXPECT_EQ(cancelled, 20000);
  EXPECT_EQ(core_->store_waiters(), 0u);
}

TEST_F(CoordinatorLimitsTest, StoreGet_NanTimeout_InvalidArgument) {
  StartThree();
  v1::StoreGetRequest get;
  get.set_job_id("test-job");
  get.set_generation(1);
  get.set_key("k");
  get.set_timeout_seconds(std::nan(""));
  std::optional<absl::StatusOr<std::string>> got;
  EXPECT_EQ(core_->StoreGet(get, [&](absl::StatusOr<std::string> v) { got = v; }), 0u);
  EXPECT_THAT(*got, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("timeout_seconds")));
}

TEST_F(CoordinatorLimitsTest, StoreSet_KeyCheckedBeforeFencing) {
  v1::StoreSetRequest set;
  set.set_job_id("no-such-job");
  set.set_key(std::string(513, 'k'));
  EXPECT_THAT(core_->StoreSet(set),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("key limit is 512 bytes")));
}

TEST_F(CoordinatorLimitsTest, AttachStream_NoRegisterWithinDeadline_ClosedDeadlineExceeded) {
  auto silent = std::make_shared<RecordingChannel>();
  auto registers = std::make_shared<RecordingChannel>();
  ASSERT_THAT(core_->streams()->Open(silent), IsOk());
  auto id = core_->streams()->Open(registers);
  ASSERT_THAT(id, IsOk());
  clock_.Advance(absl::Seconds(5));
  core_->streams()->Registered(*id);
  core_->Tick();
  EXPECT_FALSE(silent->closed().has_value());
  clock_.Advance(absl::Seconds(5));
  core_->Tick();
  ASSERT_TRUE(silent->closed().has_value());
  EXPECT_THAT(*silent->closed(),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("RegisterRequest")));
  EXPECT_FALSE(registers->closed().has_value());
  EXPECT_EQ(core_->streams()->unregistered(), 0u);
  EXPECT_EQ(core_->streams()->open(), 2u);  // open until the gRPC layer says closed
}

TEST(StreamGate, Open_OverLimit_ResourceExhaustedUntilOneCloses) {
  FakeClock clock;
  StreamGate gate(&clock, StreamGate::Options{2, absl::Seconds(10)});
  auto channel = std::make_shared<RecordingChannel>();
  auto a = gate.Open(channel);
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(gate.Open(channel), IsOk());
  EXPECT_THAT(gate.Open(channel),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("--max_attach_streams 2"), HasSubstr("2 Attach streams"))));
  gate.Closed(*a);
  gate.Closed(*a);  // once is enough
  EXPECT_EQ(gate.open(), 1u);
  EXPECT_THAT(gate.Open(channel), IsOk());
}

TEST(StreamGate, CloseUnregistered_ChannelAlreadyGone_Forgotten) {
  FakeClock clock;
  StreamGate gate(&clock, StreamGate::Options{});
  {
    auto channel = std::make_shared<RecordingChannel>();
    ASSERT_THAT(gate.Open(channel), IsOk());
  }
  clock.Advance(absl::Seconds(11));
  gate.CloseUnregistered();
  EXPECT_EQ(gate.unregistered(), 0u);
}

}  // namespace
}  // namespace ddp
