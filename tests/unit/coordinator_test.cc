// The coordinator core without a network: fake clock, recording channels.
#include "coordinator/coordinator.h"

#include <optional>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ddp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

class RecordingChannel final : public WorkerChannel {
 public:
  void Send(const v1::CoordinatorMessage& message) override {
    absl::MutexLock lock(&mu_);
    messages_.push_back(message);
  }
  void Close(const absl::Status& status) override {
    absl::MutexLock lock(&mu_);
    closed_ = status;
  }
  // Messages of one kind received so far.
  std::vector<v1::CoordinatorMessage> Of(v1::CoordinatorMessage::KindCase kind) {
    absl::MutexLock lock(&mu_);
    std::vector<v1::CoordinatorMessage> out;
    for (const auto& m : messages_) {
      if (m.kind_case() == kind) out.push_back(m);
    }
    return out;
  }
  std::optional<absl::Status> closed() {
    absl::MutexLock lock(&mu_);
    return closed_;
  }

 private:
  absl::Mutex mu_;
  std::vector<v1::CoordinatorMessage> messages_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Status> closed_ ABSL_GUARDED_BY(mu_);
};

struct TestWorker {
  Coordinator::Session session;
  std::shared_ptr<RecordingChannel> channel;

  v1::Assignment assignment() const {
    auto all = channel->Of(v1::CoordinatorMessage::kAssignment);
    return all.empty() ? v1::Assignment() : all.back().assignment();
  }
};

class CoordinatorTest : public testing::Test {
 protected:
  CoordinatorTest() : core_(&clock_, TestOptions()) {}

  static Coordinator::Options TestOptions() {
    Coordinator::Options options;
    options.snapshot_min_interval = absl::ZeroDuration();  // every Tick publishes
    return options;
  }

  absl::StatusOr<TestWorker> Attach(const std::string& host, const std::string& device,
                                    const std::string& machine_id = "") {
    v1::RegisterRequest r;
    r.set_host(host);
    r.set_device(device);
    r.set_machine_id(machine_id);
    r.set_version(kVersion);
    auto channel = std::make_shared<RecordingChannel>();
    auto session = core_.Attach(r, channel);
    if (!session.ok()) return session.status();
    return TestWorker{*session, channel};
  }

  v1::JobSpec Job(uint32_t workers) {
    v1::JobSpec spec;
    spec.set_name("test-job");
    spec.mutable_dataset()->set_kind("synthetic");
    spec.set_backend("gloo");
    spec.set_min_workers(workers);
    spec.set_max_workers(workers);
    return spec;
  }

  // Three workers attached and a three-worker job running generation 1.
  std::vector<TestWorker> StartThree() {
    std::vector<TestWorker> workers;
    for (const char* d : {"cpu:2", "cpu:0", "cpu:1"}) workers.push_back(*Attach("h", d));
    EXPECT_THAT(core_.SubmitJob(Job(3)), IsOk());
    return workers;
  }

  void Send(const TestWorker& w, const v1::WorkerMessage& m) { core_.OnMessage(w.session, m); }

  void SendState(const TestWorker& w, uint64_t generation, v1::WorkerState state,
                 const std::string& detail = "") {
    v1::WorkerMessage m;
    m.mutable_state()->set_generation(generation);
    m.mutable_state()->set_state(state);
    m.mutable_state()->set_detail(detail);
    Send(w, m);
  }

  void SendReport(const TestWorker& w, uint64_t generation, uint64_t step, double loss,
                  const std::string& digest = "") {
    v1::WorkerMessage m;
    v1::StepReport* r = m.mutable_reports()->add_reports();
    r->set_generation(generation);
    r->set_step(step);
    r->set_loss(loss);
    r->set_steps_per_epoch(10);
    r->set_samples(64);
    r->set_step_seconds(0.01);
    r->set_parameter_digest(digest);
    Send(w, m);
  }

  v1::JobStatus Status() {
    core_.Tick();
    return *core_.Snapshot();
  }

  FakeClock clock_;
  Coordinator core_;
};

TEST_F(CoordinatorTest, Attach_SendsRegisteredWithHeartbeatInterval) {
  auto w = Attach("h", "cpu");
  ASSERT_THAT(w, IsOk());
  auto registered = w->channel->Of(v1::CoordinatorMessage::kRegistered);
  ASSERT_EQ(registered.size(), 1u);
  EXPECT_EQ(registered[0].registered().worker_id(), "h/cpu:0");
  EXPECT_EQ(registered[0].registered().heartbeat_interval_ms(), 1000u);
}

TEST_F(CoordinatorTest, SubmitJob_ThreeWorkers_EachRankAssignedExactlyOnceInSlotOrder) {
  auto workers = StartThree();
  std::set<uint32_t> ranks;
  for (const TestWorker& w : workers) {
    const v1::Assignment a = w.assignment();
    EXPECT_EQ(a.generation(), 1u);
    EXPECT_EQ(a.world_size(), 3u);
    EXPECT_EQ(a.job_id(), "test-job");
    EXPECT_EQ(a.spec().name(), "test-job");
    EXPECT_EQ(a.worker_id(), w.session.worker_id);
    EXPECT_FALSE(a.single_machine());  // these test workers name no machine
    ranks.insert(a.rank());
  }
  EXPECT_EQ(ranks, (std::set<uint32_t>{0, 1, 2}));
  EXPECT_EQ(workers[1].assignment().rank(), 0u);  // cpu:0
  EXPECT_EQ(workers[0].assignment().rank(), 2u);  // cpu:2
  const v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(status.world_size(), 3u);
}

TEST_F(CoordinatorTest, Assignment_SingleMachineOnlyWhenEveryMachineIdMatches) {
  auto a = *Attach("h", "cpu:0", "m1");
  auto b = *Attach("h", "cpu:1", "m1");
  ASSERT_THAT(core_.SubmitJob(Job(2)), IsOk());
  EXPECT_TRUE(a.assignment().single_machine());
  EXPECT_TRUE(b.assignment().single_machine());
  for (const auto& w : {a, b}) SendState(w, 1, v1::WORKER_STATE_DONE);
  auto c = *Attach("h2", "cpu:0", "m2");
  v1::JobSpec three = Job(3);
  three.set_name("three");
  ASSERT_THAT(core_.SubmitJob(three), IsOk());
  EXPECT_FALSE(c.assignment().single_machine());
  EXPECT_FALSE(a.assignment().single_machine());
}

TEST_F(CoordinatorTest, SubmitJob_InvalidSpec_NamesFieldAndLeavesRunningJobAlone) {
  StartThree();
  v1::JobSpec bad = Job(3);
  bad.set_batch_size(100000);
  EXPECT_THAT(core_.SubmitJob(bad),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("job.batch_size")));
  EXPECT_THAT(core_.SubmitJob(Job(3)),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("test-job")));
  EXPECT_EQ(Status().state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Status().generation(), 1u);
}

TEST_F(CoordinatorTest, SubmitJob_PreflightFails_RefusedWithItsMessage) {
  Coordinator::Options options;
  options.preflight = [](const v1::JobSpec&) {
    return absl::InvalidArgumentError("model.path: corrupt");
  };
  Coordinator core(&clock_, options);
  EXPECT_THAT(core.SubmitJob(Job(1)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("model.path")));
  EXPECT_EQ(core.job_state(), v1::JOB_STATE_UNSPECIFIED);
}

TEST_F(CoordinatorTest, Report_StaleGeneration_RejectedAndJobUntouched) {
  auto workers = StartThree();
  SendReport(workers[0], 1, 5, 0.5);
  SendReport(workers[0], 7, 9, 99.0);  // a generation that is not current
  auto rejected = workers[0].channel->Of(v1::CoordinatorMessage::kRejected);
  ASSERT_EQ(rejected.size(), 1u);
  EXPECT_EQ(rejected[0].rejected().code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(rejected[0].rejected().message(), HasSubstr("stale generation 7"));
  const v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  for (const auto& w : status.workers()) {
    if (w.worker_id() != workers[0].session.worker_id) continue;
    EXPECT_EQ(w.step(), 5u);
    EXPECT_DOUBLE_EQ(w.last_loss(), 0.5);
    EXPECT_EQ(w.stale_messages(), 1u);
  }
}

TEST_F(CoordinatorTest, Store_StaleOrUnknownGeneration_FailedPrecondition) {
  StartThree();
  v1::StoreSetRequest set;
  set.set_job_id("test-job");
  set.set_generation(1);
  set.set_key("k");
  set.set_value("v");
  EXPECT_THAT(core_.StoreSet(set), IsOk());
  set.set_generation(0);
  EXPECT_THAT(core_.StoreSet(set),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("stale generation 0")));
  set.set_job_id("other");
  set.set_generation(1);
  EXPECT_THAT(core_.StoreSet(set), StatusIs(absl::StatusCode::kFailedPrecondition));
  v1::StoreGetRequest get;
  get.set_job_id("test-job");
  get.set_generation(1);
  get.set_key("k");
  std::optional<absl::StatusOr<std::string>> got;
  core_.StoreGet(get, [&](absl::StatusOr<std::string> v) { got = v; });
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(**got, "v");
}

TEST_F(CoordinatorTest, StoreGet_PastItsTimeout_DeadlineExceeded) {
  StartThree();
  v1::StoreGetRequest get;
  get.set_job_id("test-job");
  get.set_generation(1);
  get.set_key("never");
  get.set_timeout_seconds(2);
  std::optional<absl::StatusOr<std::string>> got;
  core_.StoreGet(get, [&](absl::StatusOr<std::string> v) { got = v; });
  clock_.Advance(absl::Seconds(1));
  core_.Tick();
  EXPECT_FALSE(got.has_value());
  clock_.Advance(absl::Seconds(1.5));
  core_.Tick();
  ASSERT_TRUE(got.has_value());
  EXPECT_THAT(*got, StatusIs(absl::StatusCode::kDeadlineExceeded));
}

TEST_F(CoordinatorTest, WorkerLost_DuringGeneration_AbortsSurvivorsAndNamesIt) {
  auto workers = StartThree();
  v1::WorkerMessage hb;
  hb.mutable_heartbeat()->set_generation(1);
  hb.mutable_heartbeat()->set_step(12);
  hb.mutable_heartbeat()->set_phase(v1::STEP_PHASE_BACKWARD);
  Send(workers[2], hb);
  core_.OnStreamClosed(workers[2].session, "its stream closed");
  for (int i : {0, 1}) {
    auto aborts = workers[i].channel->Of(v1::CoordinatorMessage::kAbort);
    ASSERT_EQ(aborts.size(), 1u);
    EXPECT_EQ(aborts[0].abort().generation(), 1u);
  }
  const v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(status.message(), AllOf(HasSubstr("rank 1"), HasSubstr("lost"), HasSubstr("step 12"),
                                      HasSubstr("BACKWARD")));
}

TEST_F(CoordinatorTest, Heartbeats_Stop_WorkerLostAfterTimeoutWithoutSleeping) {
  auto workers = StartThree();
  for (int s = 0; s < 6; ++s) {
    clock_.Advance(absl::Seconds(1));
    v1::WorkerMessage hb;
    hb.mutable_heartbeat()->set_generation(1);
    Send(workers[0], hb);
    Send(workers[1], hb);  // workers[2] stays silent
    core_.Tick();
  }
  EXPECT_TRUE(workers[2].channel->closed().has_value());
  EXPECT_THAT(*workers[2].channel->closed(), StatusIs(absl::StatusCode::kUnavailable));
  const v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(status.message(), HasSubstr("no heartbeat"));
  EXPECT_FALSE(workers[0].channel->closed().has_value());
}

TEST_F(CoordinatorTest, AllRanksDone_JobSucceeds_ProgressFromReports) {
  auto workers = StartThree();
  for (const auto& w : workers) SendState(w, 1, v1::WORKER_STATE_TRAINING);
  SendReport(workers[0], 1, 10, 0.25, "abc");
  SendReport(workers[1], 1, 10, 0.5, "abc");
  SendReport(workers[2], 1, 9, 0.75);
  v1::JobStatus status = Status();
  EXPECT_EQ(status.global_step(), 9u);  // the slowest rank
  EXPECT_DOUBLE_EQ(status.loss(), 0.5);
  SendReport(workers[2], 1, 10, 0.75, "abc");
  for (const auto& w : workers) SendState(w, 1, v1::WORKER_STATE_DONE);
  status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(status.global_step(), 10u);
  for (const auto& w : status.workers()) EXPECT_EQ(w.parameter_digest(), "abc");
}

TEST_F(CoordinatorTest, ParameterDigests_Differ_JobFailsNamingBothRanks) {
  auto workers = StartThree();
  SendReport(workers[1], 1, 10, 0.5, "aaaa");
  SendReport(workers[0], 1, 10, 0.5, "bbbb");
  const v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(status.message(), AllOf(HasSubstr("diverged"), HasSubstr("rank 0"),
                                      HasSubstr("rank 2"), HasSubstr("step 10")));
}

TEST_F(CoordinatorTest, RankFails_JobFailsWithItsReason_OthersAborted) {
  auto workers = StartThree();
  SendState(workers[1], 1, v1::WORKER_STATE_FAILED, "model.path: not a TorchScript file");
  EXPECT_EQ(workers[0].channel->Of(v1::CoordinatorMessage::kAbort).size(), 1u);
  const v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(status.message(), AllOf(HasSubstr("rank 0"), HasSubstr("not a TorchScript file")));
}

TEST_F(CoordinatorTest, StaleStateChange_RejectedButIdleAlwaysAccepted) {
  auto workers = StartThree();
  SendState(workers[0], 3, v1::WORKER_STATE_TRAINING);
  EXPECT_EQ(workers[0].channel->Of(v1::CoordinatorMessage::kRejected).size(), 1u);
  ASSERT_THAT(core_.CancelJob("test-job", "operator"), IsOk());
  SendState(workers[0], 1, v1::WORKER_STATE_IDLE, "left: job cancelled");
  const v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_CANCELLED);
  for (const auto& w : status.workers()) {
    if (w.worker_id() == workers[0].session.worker_id) {
      EXPECT_EQ(w.state(), v1::WORKER_STATE_IDLE);
    }
  }
}

TEST_F(CoordinatorTest, CancelJob_WrongIdOrEnded_ClearErrors) {
  StartThree();
  EXPECT_THAT(core_.CancelJob("nope", ""),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("test-job")));
  ASSERT_THAT(core_.CancelJob("test-job", "enough"), IsOk());
  EXPECT_THAT(core_.CancelJob("test-job", ""), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(Status().message(), HasSubstr("enough"));
}

TEST_F(CoordinatorTest, NewJobAfterSuccess_NextGenerationNumber) {
  auto workers = StartThree();
  for (const auto& w : workers) SendState(w, 1, v1::WORKER_STATE_DONE);
  ASSERT_EQ(Status().state(), v1::JOB_STATE_SUCCEEDED);
  ASSERT_THAT(core_.SubmitJob(Job(3)), IsOk());
  for (const auto& w : workers) EXPECT_EQ(w.assignment().generation(), 2u);
}

TEST_F(CoordinatorTest, Restore_ContinuesGenerationNumbersAndWaitsForWorkers) {
  v1::DurableState saved;
  *saved.mutable_job() = WithDefaults(Job(1));
  saved.set_job_state(v1::JOB_STATE_RUNNING);
  saved.set_latest_generation(41);
  core_.Restore(saved);
  EXPECT_EQ(Status().state(), v1::JOB_STATE_WAITING);
  auto w = Attach("h", "cpu:0");
  EXPECT_EQ(w->assignment().generation(), 42u);
}

}  // namespace
}  // namespace ddp
