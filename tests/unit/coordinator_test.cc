// The coordinator's message side: attaching, assignments, jobs, reports, the
// rendezvous store and status. Faults and re-forming are in
// coordinator_recovery_test.cc, joiners and hung members in
// coordinator_membership_test.cc, restarts in coordinator_restart_test.cc.
#include <optional>
#include <set>

#include "tests/unit/coordinator_fixture.h"

namespace ddp {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

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

TEST_F(CoordinatorTest, SubmitJob_WorkerSelector_OnlyMatchingWorkersTrainAndStatusSaysWhy) {
  v1::RegisterRequest zone_a = Req("h", "cpu:0");
  (*zone_a.mutable_labels())["zone"] = "a";
  auto in_a = *AttachWith(zone_a);
  v1::RegisterRequest zone_b = Req("h", "cpu:1");
  (*zone_b.mutable_labels())["zone"] = "b";
  auto in_b = *AttachWith(zone_b);
  auto unlabelled = *Attach("h", "cpu:2");
  v1::JobSpec spec = Job(2);
  (*spec.mutable_worker_selector())["zone"] = "a";
  ASSERT_THAT(Submit(*core_, spec), IsOk());
  core_->Tick();
  v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_WAITING);
  EXPECT_THAT(status.message(), HasSubstr("only workers labelled zone=a count"));
  EXPECT_EQ(in_b.assignments() + unlabelled.assignments() + in_a.assignments(), 0u);
  // The worker's labels are in the status, for the operator to compare.
  for (const v1::WorkerStatus& w : status.workers()) {
    if (w.worker_id() == in_b.id()) {
      EXPECT_EQ(w.labels().at("zone"), "b");
    }
  }
  v1::RegisterRequest second_a = Req("h", "cpu:3");
  (*second_a.mutable_labels())["zone"] = "a";
  auto also_in_a = *AttachWith(second_a);
  EXPECT_EQ(in_a.assignment().world_size(), 2u);
  EXPECT_EQ(also_in_a.assignment().world_size(), 2u);
  EXPECT_EQ(in_b.assignments() + unlabelled.assignments(), 0u);
}

TEST_F(CoordinatorTest, Report_StepTimings_ShownForItsWorkerUntilTheNextGeneration) {
  auto workers = Start(1, Job(1));
  SendState(workers[0], 1, v1::WORKER_STATE_TRAINING);
  v1::WorkerMessage m;
  v1::StepReport* r = m.mutable_reports()->add_reports();
  r->set_generation(1);
  r->set_step(1);
  r->set_samples(64);
  r->set_step_seconds(0.02);
  r->mutable_timings()->set_forward_ms(5);
  r->mutable_timings()->set_allreduce_wait_ms(2.5);
  Send(workers[0], m);
  const v1::JobStatus status = Status();
  const v1::WorkerStatus* w = Find(status, workers[0].id());
  EXPECT_DOUBLE_EQ(w->step_seconds(), 0.02);
  EXPECT_DOUBLE_EQ(w->timings().forward_ms(), 5);
  EXPECT_DOUBLE_EQ(w->timings().allreduce_wait_ms(), 2.5);
}

TEST_F(CoordinatorTest, Assignment_SingleMachineOnlyWhenEveryMachineIdMatches) {
  auto a = *Attach("h", "cpu:0", "m1");
  auto b = *Attach("h", "cpu:1", "m1");
  ASSERT_THAT(Submit(*core_, Job(2)), IsOk());
  EXPECT_TRUE(a.assignment().single_machine());
  EXPECT_TRUE(b.assignment().single_machine());
  for (const auto& w : {a, b}) SendState(w, 1, v1::WORKER_STATE_DONE);
  auto c = *Attach("h2", "cpu:0", "m2");
  v1::JobSpec three = Job(3);
  three.set_name("three");
  ASSERT_THAT(Submit(*core_, three), IsOk());
  EXPECT_FALSE(c.assignment().single_machine());
  EXPECT_FALSE(a.assignment().single_machine());
}

TEST_F(CoordinatorTest, SubmitJob_InvalidSpec_NamesFieldAndLeavesRunningJobAlone) {
  StartThree();
  v1::JobSpec bad = Job(3);
  bad.set_batch_size(100000);
  EXPECT_THAT(Submit(*core_, bad),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("job.batch_size")));
  v1::JobSpec other = Job(3);
  other.set_name("other");
  EXPECT_THAT(Submit(*core_, other), IsOk());  // queued (coordinator_queue_test.cc)
  EXPECT_EQ(core_->GetJob("other")->state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(Status().state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Status().generation(), 1u);
}

TEST_F(CoordinatorTest, SubmitJob_CheckFails_RefusedWithItsMessage) {
  Coordinator::Options options;
  options.validate_job = [](const v1::JobSpec&,
                            std::function<void(absl::StatusOr<v1::JobSpec>)> done) {
    done(absl::InvalidArgumentError("model.path: corrupt"));
  };
  Coordinator core(&clock_, options);
  EXPECT_THAT(Submit(core, Job(1)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("model.path")));
  EXPECT_EQ(core.job_state(), v1::JOB_STATE_UNSPECIFIED);
}

// A check that answers when the test says so, as the helper process does.
struct DeferredChecks {
  struct Check {
    std::string name;
    v1::JobSpec spec;
    std::function<void(absl::StatusOr<v1::JobSpec>)> done;
    // Passes it, as the helper does: the spec back with its pins.
    void Pass() const {
      v1::JobSpec checked = spec;
      v1::InputFile* pin = checked.add_input_files();
      pin->set_path("/data/model.pt");
      pin->set_sha256(std::string(64, 'a'));
      v1::WriteFolder* folder = checked.add_write_folders();
      folder->set_field("checkpoint.dir");
      folder->set_path("/out/ckpt");
      folder->set_real_path("/mnt/out/ckpt");
      done(checked);
    }
  };
  std::vector<Check> pending;
  Coordinator::Options Options() {
    Coordinator::Options options;
    options.validate_job = [this](const v1::JobSpec& spec,
                                  std::function<void(absl::StatusOr<v1::JobSpec>)> done) {
      pending.push_back({spec.name(), spec, std::move(done)});
    };
    return options;
  }
};

TEST_F(CoordinatorTest, SubmitJob_CheckAnswersLater_AnsweredAndTakenOnlyThen) {
  DeferredChecks checks;
  Coordinator core(&clock_, checks.Options());
  std::optional<absl::StatusOr<v1::JobSpec>> answer;
  core.SubmitJob(Job(1), [&](absl::StatusOr<v1::JobSpec> s) { answer = std::move(s); });
  ASSERT_EQ(checks.pending.size(), 1u);
  EXPECT_FALSE(answer.has_value());
  EXPECT_EQ(core.job_state(), v1::JOB_STATE_UNSPECIFIED);
  checks.pending[0].Pass();
  ASSERT_TRUE(answer.has_value());
  ASSERT_THAT(*answer, IsOk());
  // The job runs as checked: pinned to the files the check read.
  EXPECT_EQ((*answer)->input_files_size(), 1);
  EXPECT_NE(core.job_state(), v1::JOB_STATE_UNSPECIFIED);
}

TEST_F(CoordinatorTest, SubmitJob_WithInputFiles_RefusedUnchecked) {
  DeferredChecks checks;
  Coordinator core(&clock_, checks.Options());
  v1::JobSpec spec = Job(1);
  spec.add_input_files()->set_path("/data/model.pt");
  EXPECT_THAT(Submit(core, spec), StatusIs(absl::StatusCode::kInvalidArgument,
                                           HasSubstr("input_files: set by the coordinator")));
  EXPECT_TRUE(checks.pending.empty());
}

TEST_F(CoordinatorTest, SubmitJob_WithWriteFolders_RefusedUnchecked) {
  DeferredChecks checks;
  Coordinator core(&clock_, checks.Options());
  v1::JobSpec spec = Job(1);
  spec.add_write_folders()->set_real_path("/");
  EXPECT_THAT(Submit(core, spec), StatusIs(absl::StatusCode::kInvalidArgument,
                                           HasSubstr("write_folders: set by the coordinator")));
  EXPECT_TRUE(checks.pending.empty());
}

TEST_F(CoordinatorTest, SubmitJob_AnotherJobTakenWhileChecking_QueuedBehindIt) {
  DeferredChecks checks;
  Coordinator core(&clock_, checks.Options());
  v1::JobSpec first = Job(1), second = Job(1);
  first.set_name("first");
  second.set_name("second");
  std::optional<absl::StatusOr<v1::JobSpec>> first_answer, second_answer;
  core.SubmitJob(first, [&](absl::StatusOr<v1::JobSpec> s) { first_answer = std::move(s); });
  core.SubmitJob(second, [&](absl::StatusOr<v1::JobSpec> s) { second_answer = std::move(s); });
  ASSERT_EQ(checks.pending.size(), 2u);
  checks.pending[1].Pass();
  checks.pending[0].Pass();
  EXPECT_THAT(*second_answer, IsOk());
  EXPECT_THAT(*first_answer, IsOk());
  absl::StatusOr<v1::JobSummary> queued = core.GetJob("first");
  ASSERT_THAT(queued, IsOk());
  EXPECT_EQ(queued->state(), v1::JOB_STATE_QUEUED);
  EXPECT_THAT(queued->message(), HasSubstr("\"second\""));
}

// As a coordinator restarted with the same --job finds it: the held spec
// carries the check's pins (inputs, write folders), the submission none.
TEST_F(CoordinatorTest, SubmitJob_JobAlreadyHeld_NotCheckedAgain) {
  DeferredChecks checks;
  Coordinator core(&clock_, checks.Options());
  core.SubmitJob(Job(1), [](absl::StatusOr<v1::JobSpec>) {});
  checks.pending[0].Pass();
  EXPECT_THAT(Submit(core, Job(1)), IsOk());
  EXPECT_EQ(checks.pending.size(), 1u);
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
  EXPECT_THAT(core_->StoreSet(set), IsOk());
  set.set_generation(0);
  EXPECT_THAT(core_->StoreSet(set),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("stale generation 0")));
  set.set_job_id("other");
  set.set_generation(1);
  EXPECT_THAT(core_->StoreSet(set), StatusIs(absl::StatusCode::kFailedPrecondition));
  v1::StoreGetRequest get;
  get.set_job_id("test-job");
  get.set_generation(1);
  get.set_key("k");
  std::optional<absl::StatusOr<std::string>> got;
  core_->StoreGet(get, [&](absl::StatusOr<std::string> v) { got = v; });
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
  core_->StoreGet(get, [&](absl::StatusOr<std::string> v) { got = v; });
  clock_.Advance(absl::Seconds(1));
  core_->Tick();
  EXPECT_FALSE(got.has_value());
  clock_.Advance(absl::Seconds(1.5));
  core_->Tick();
  ASSERT_TRUE(got.has_value());
  EXPECT_THAT(*got, StatusIs(absl::StatusCode::kDeadlineExceeded));
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

// A program on the library trains only a program's job, and leaves when it
// ends; a ddp-worker trains only built-in jobs and stays for the next.
TEST_F(CoordinatorTest, ProgramJob_AssignsOnlyProgramsAndStopsThemWhenDone) {
  auto daemon = *Attach("h", "cpu:0");
  std::vector<TestWorker> programs;
  for (const char* device : {"cpu:2", "cpu:1"}) {
    v1::RegisterRequest r = Req("h", device);
    r.mutable_capabilities()->set_program(true);
    programs.push_back(*AttachWith(r));
  }
  v1::JobSpec spec = Job(2);
  spec.mutable_model()->set_kind("program");
  spec.clear_dataset();
  ASSERT_THAT(Submit(*core_, spec), IsOk());
  EXPECT_EQ(daemon.assignments(), 0u);
  ASSERT_EQ(programs[1].assignments(), 1u);
  ASSERT_EQ(programs[0].assignments(), 1u);
  EXPECT_EQ(programs[1].assignment().rank(), 0u);  // cpu:1 before cpu:2
  for (const auto& p : programs) SendState(p, 1, v1::WORKER_STATE_TRAINING);
  SendState(programs[0], 1, v1::WORKER_STATE_DONE);
  EXPECT_TRUE(programs[0].channel->Of(v1::CoordinatorMessage::kStop).empty());  // not yet
  SendState(programs[1], 1, v1::WORKER_STATE_DONE);
  EXPECT_EQ(Status().state(), v1::JOB_STATE_SUCCEEDED);
  for (const auto& p : programs) {
    auto stops = p.channel->Of(v1::CoordinatorMessage::kStop);
    ASSERT_EQ(stops.size(), 1u);
    EXPECT_EQ(stops[0].stop().reason(), "job test-job succeeded");
  }
  EXPECT_TRUE(daemon.channel->Of(v1::CoordinatorMessage::kStop).empty());

  // A built-in job next: the daemon trains it, no program does.
  auto late = Req("h", "cpu:3");
  late.mutable_capabilities()->set_program(true);
  auto program = *AttachWith(late);
  v1::JobSpec builtin = Job(1);
  builtin.set_name("builtin");
  ASSERT_THAT(Submit(*core_, builtin), IsOk());
  EXPECT_EQ(daemon.assignments(), 1u);
  EXPECT_EQ(program.assignments(), 0u);
}

// A program learns how its job ended (finish() throws unless it
// succeeded), and one that finished and left shows DONE, not lost.
TEST_F(CoordinatorTest, ProgramJob_StopSaysHowTheJobEndedAndFinishedProgramsStayDone) {
  std::vector<TestWorker> programs;
  for (const char* device : {"cpu:0", "cpu:1"}) {
    v1::RegisterRequest r = Req("h", device);
    r.mutable_capabilities()->set_program(true);
    programs.push_back(*AttachWith(r));
  }
  v1::JobSpec spec = Job(2);
  spec.mutable_model()->set_kind("program");
  spec.clear_dataset();
  ASSERT_THAT(Submit(*core_, spec), IsOk());
  for (const auto& p : programs) SendState(p, 1, v1::WORKER_STATE_TRAINING);
  for (const auto& p : programs) SendState(p, 1, v1::WORKER_STATE_DONE);
  for (const auto& p : programs) {
    auto stops = p.channel->Of(v1::CoordinatorMessage::kStop);
    ASSERT_EQ(stops.size(), 1u);
    EXPECT_EQ(stops[0].stop().outcome(), v1::JOB_OUTCOME_SUCCEEDED);
    core_->OnStreamClosed(p.session, "its stream closed (process exited or connection lost)");
  }
  const v1::JobStatus done = Status();
  for (const auto& w : done.workers()) {
    EXPECT_EQ(w.state(), v1::WORKER_STATE_DONE) << w.worker_id() << ": " << w.detail();
  }

  // The next job fails: its programs are told why.
  std::vector<TestWorker> next;
  for (const char* device : {"cpu:2", "cpu:3"}) {
    v1::RegisterRequest r = Req("h", device);
    r.mutable_capabilities()->set_program(true);
    next.push_back(*AttachWith(r));
  }
  spec.set_name("second");
  ASSERT_THAT(Submit(*core_, spec), IsOk());
  for (const auto& p : next) SendState(p, 2, v1::WORKER_STATE_TRAINING);
  SendReport(next[0], 2, 100, 0.5, "aaaa");
  SendReport(next[1], 2, 100, 0.5, "bbbb");
  for (const auto& p : next) {
    auto stops = p.channel->Of(v1::CoordinatorMessage::kStop);
    ASSERT_EQ(stops.size(), 1u);
    EXPECT_EQ(stops[0].stop().outcome(), v1::JOB_OUTCOME_FAILED);
    EXPECT_THAT(stops[0].stop().job_message(), HasSubstr("replicas diverged"));
    // Not done: a program that leaves a failed job is lost as before.
    core_->OnStreamClosed(p.session, "its stream closed (process exited or connection lost)");
  }
  const v1::JobStatus failed = Status();
  for (const auto& w : failed.workers()) {
    if (w.worker_id() == next[0].id()) {
      EXPECT_EQ(w.state(), v1::WORKER_STATE_LOST);
    }
  }
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

TEST_F(CoordinatorTest, StaleStateChange_RejectedButIdleAlwaysAccepted) {
  auto workers = StartThree();
  SendState(workers[0], 3, v1::WORKER_STATE_TRAINING);
  EXPECT_EQ(workers[0].channel->Of(v1::CoordinatorMessage::kRejected).size(), 1u);
  ASSERT_THAT(Cancel(*core_, "test-job", "operator"), IsOk());
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
  EXPECT_THAT(Cancel(*core_, "nope", ""),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("test-job")));
  ASSERT_THAT(Cancel(*core_, "test-job", "enough"), IsOk());
  EXPECT_THAT(Cancel(*core_, "test-job", ""), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(Status().message(), HasSubstr("enough"));
}

TEST_F(CoordinatorTest, NewJobAfterSuccess_NextGenerationNumber) {
  auto workers = StartThree();
  for (const auto& w : workers) SendState(w, 1, v1::WORKER_STATE_DONE);
  ASSERT_EQ(Status().state(), v1::JOB_STATE_SUCCEEDED);
  v1::JobSpec next = Job(3);
  next.set_name("next-job");
  ASSERT_THAT(Submit(*core_, next), IsOk());
  for (const auto& w : workers) EXPECT_EQ(w.assignment().generation(), 2u);
  EXPECT_EQ(workers[0].assignment().job_id(), "next-job");
}

TEST_F(CoordinatorTest, SubmitJob_SameNameSameSpecWhileRunning_OkAndNothingChanges) {
  auto workers = StartThree();
  v1::JobSpec same = Job(3);
  same.set_batch_size(64);  // the default, spelt out: still the same spec
  auto again = Submit(*core_, same);
  ASSERT_THAT(again, IsOk());
  EXPECT_EQ(again->name(), "test-job");
  for (const auto& w : workers) EXPECT_EQ(w.assignments(), 1u);
  const v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(status.generation(), 1u);
}

TEST_F(CoordinatorTest, SubmitJob_SameNameSameSpecAfterItEnded_OkAndNotRunAgain) {
  auto workers = StartThree();
  for (const auto& w : workers) SendState(w, 1, v1::WORKER_STATE_DONE);
  ASSERT_EQ(Status().state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_THAT(Submit(*core_, Job(3)), IsOk());
  for (const auto& w : workers) EXPECT_EQ(w.assignments(), 1u);
  EXPECT_EQ(Status().state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(Status().generation(), 1u);
}

TEST_F(CoordinatorTest, SubmitJob_SameNameOtherSpec_FailedPreconditionNamingTheField) {
  auto workers = StartThree();
  v1::JobSpec other = Job(3);
  other.set_batch_size(32);
  EXPECT_THAT(Submit(*core_, other),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("test-job"), HasSubstr("batch_size"))));
  for (const auto& w : workers) SendState(w, 1, v1::WORKER_STATE_DONE);
  ASSERT_EQ(Status().state(), v1::JOB_STATE_SUCCEEDED);
  other = Job(3);
  other.set_seed(7);
  EXPECT_THAT(Submit(*core_, other),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("seed")));
  EXPECT_EQ(Status().spec().seed(), 0u);
}

TEST_F(CoordinatorTest, Assignment_LinearLrScaling_LrTimesWorldOverMaxWorkers) {
  v1::JobSpec spec = Job(2, 4);
  spec.mutable_optimizer()->set_lr(0.1);
  spec.set_lr_scaling("linear");
  auto workers = Start(2, spec);
  for (const auto& w : workers) EXPECT_DOUBLE_EQ(w.assignment().lr(), 0.05);
  const v1::JobStatus status = Status();
  EXPECT_DOUBLE_EQ(status.lr(), 0.05);
  EXPECT_EQ(status.global_batch(), 2u * 64u);
}

TEST_F(CoordinatorTest, Assignment_KeepLrScaling_JobLrWhateverTheWorld) {
  v1::JobSpec spec = Job(2, 4);
  spec.mutable_optimizer()->set_lr(0.1);
  auto workers = Start(2, spec);
  for (const auto& w : workers) EXPECT_DOUBLE_EQ(w.assignment().lr(), 0.1);
}

TEST_F(CoordinatorTest, Assignment_FirstGeneration_FreshStateFromRankZero) {
  auto workers = Start(2, Job(2));
  for (const auto& w : workers) {
    const v1::Assignment a = w.assignment();
    EXPECT_EQ(a.state_source(), v1::STATE_SOURCE_FRESH);
    EXPECT_EQ(a.source_rank(), 0u);
    EXPECT_EQ(a.start_step(), 0u);
    EXPECT_EQ(a.start_epoch(), 0u);
  }
  const v1::JobStatus status = Status();
  EXPECT_THAT(Ids(status.members()), ElementsAre("h/cpu:0", "h/cpu:1"));
  ASSERT_EQ(status.generation_changes_size(), 1);
  const v1::GenerationChange& start = status.generation_changes(0);
  EXPECT_EQ(start.cause(), v1::CHANGE_CAUSE_START);
  EXPECT_EQ(start.from_generation(), 0u);
  EXPECT_EQ(start.to_generation(), 1u);
  EXPECT_THAT(Ids(start.members()), ElementsAre("h/cpu:0", "h/cpu:1"));
  EXPECT_EQ(start.world_size(), 2u);
}

TEST_F(CoordinatorTest, Attach_SameProcessOnNewStream_StaysMemberWithoutFault) {
  v1::RegisterRequest r = Req("h", "cpu:0", "m1");
  TestWorker old = *AttachWith(r);
  ASSERT_THAT(Submit(*core_, Job(1)), IsOk());
  SendReport(old, 1, 3, 0.5);
  r.set_generation(1);
  r.set_rank(0);
  auto renewed = AttachWith(r);  // same id, pid and machine: a new stream
  ASSERT_THAT(renewed, IsOk());
  ASSERT_TRUE(old.channel->closed().has_value());
  EXPECT_THAT(*old.channel->closed(), StatusIs(absl::StatusCode::kUnavailable));
  core_->OnStreamClosed(old.session, "the old stream ended");  // noticed late
  SendReport(*renewed, 1, 4, 0.25);
  SendReport(old, 1, 9, 9.0);  // the old stream is ignored
  EXPECT_TRUE(renewed->aborts().empty());
  EXPECT_EQ(renewed->assignments(), 0u);
  const v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(status.generation(), 1u);
  EXPECT_EQ(status.faults(), 0u);
  EXPECT_THAT(Ids(status.members()), ElementsAre("h/cpu:0"));
  ASSERT_NE(Find(status, "h/cpu:0"), nullptr);
  EXPECT_EQ(Find(status, "h/cpu:0")->step(), 4u);
  EXPECT_EQ(status.attached_workers(), 1u);
}

TEST_F(CoordinatorTest, Checkpoint_Results_LastGoodStepAndErrorInStatus) {
  v1::JobSpec spec = Job(1);
  spec.mutable_checkpoint()->set_dir("/tmp/ckpt");
  auto workers = Start(1, spec);
  v1::WorkerMessage m;
  v1::CheckpointResult* c = m.mutable_checkpoint();
  c->set_job_id(spec.name());
  c->set_generation(1);
  c->set_step(40);
  c->set_path("/tmp/ckpt/step-40");
  Send(workers[0], m);
  v1::JobStatus status = Status();
  EXPECT_EQ(status.last_checkpoint_step(), 40u);
  EXPECT_EQ(status.last_checkpoint_path(), "/tmp/ckpt/step-40");
  c->set_step(50);
  c->set_path("");
  c->set_error("/tmp/ckpt: no space left on device");
  Send(workers[0], m);
  status = Status();
  EXPECT_EQ(status.last_checkpoint_step(), 40u);
  EXPECT_THAT(status.checkpoint_error(), HasSubstr("no space left"));
}

TEST_F(CoordinatorTest, Checkpoint_ResultOfAnotherJob_RejectedAndIgnored) {
  v1::JobSpec spec = Job(1);
  spec.mutable_checkpoint()->set_dir("/tmp/ckpt");
  auto workers = Start(1, spec);
  v1::WorkerMessage m;
  v1::CheckpointResult* c = m.mutable_checkpoint();
  c->set_job_id("an-earlier-job");
  c->set_generation(1);
  c->set_step(900);
  c->set_path("/tmp/ckpt/old");
  Send(workers[0], m);
  EXPECT_EQ(Status().last_checkpoint_step(), 0u);
  auto rejected = workers[0].channel->Of(v1::CoordinatorMessage::kRejected);
  ASSERT_EQ(rejected.size(), 1u);
  EXPECT_THAT(rejected[0].rejected().message(), HasSubstr("an-earlier-job"));
}

}  // namespace
}  // namespace ddp

namespace ddp {
namespace {

// Two workers on one machine's GPUs, a Gloo job: assigned (their buckets are
// staged through host memory). An NCCL job is not given a CPU worker.
TEST_F(CoordinatorTest, GpuWorkers_GlooJobAssigned_NcclJobNotGivenACpuWorker) {
  auto a = *Attach("h", "cuda:0", "m1");
  auto b = *Attach("h", "cuda:1", "m1");
  ASSERT_THAT(Submit(*core_, Job(2)), IsOk());
  EXPECT_EQ(a.assignment().world_size(), 2u);
  EXPECT_EQ(b.assignment().world_size(), 2u);
  EXPECT_TRUE(a.assignment().own_gpus());
  for (const auto& w : {a, b}) SendState(w, 1, v1::WORKER_STATE_DONE);

  auto c = *Attach("h2", "cpu:0", "m2");
  v1::JobSpec nccl = Job(1);
  nccl.set_name("nccl");
  nccl.set_backend("nccl");
  ASSERT_THAT(Submit(*core_, nccl), IsOk());
  EXPECT_EQ(c.assignment().generation(), 0u);
}

}  // namespace
}  // namespace ddp
