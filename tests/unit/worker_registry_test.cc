#include "coordinator/worker_registry.h"

#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ddp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

// Each call is another process (another pid) unless `pid` says otherwise.
v1::RegisterRequest Req(const std::string& host, const std::string& device,
                        const std::string& name = "", int64_t pid = 0) {
  static int64_t next_pid = 100;
  v1::RegisterRequest r;
  r.set_host(host);
  r.set_device(device);
  r.set_version("1.0");
  r.set_name(name);
  r.set_pid(pid != 0 ? pid : next_pid++);
  r.set_machine_id("m1");
  return r;
}

class WorkerRegistryTest : public testing::Test {
 protected:
  FakeClock clock_;
  WorkerRegistry registry_{&clock_, WorkerRegistry::Options{}};
  bool took_over_ = false;
};

TEST_F(WorkerRegistryTest, Register_NewSlot_IdIsHostAndDevice) {
  auto w = registry_.Register(Req("h1", "cpu"), "1.0", 1, &took_over_);
  ASSERT_THAT(w, IsOk());
  EXPECT_EQ((*w)->id, "h1/cpu:0");
  EXPECT_EQ(registry_.num_attached(), 1u);
}

TEST_F(WorkerRegistryTest, RegisterWorker_DuplicateDevice_FailsWithAlreadyExists) {
  ASSERT_THAT(registry_.Register(Req("h1", "cuda:0", "a"), "1.0", 1, &took_over_), IsOk());
  EXPECT_THAT(registry_.Register(Req("h1", "cuda:0", "b"), "1.0", 2, &took_over_),
              StatusIs(absl::StatusCode::kAlreadyExists,
                       testing::AllOf(HasSubstr("cuda:0"), HasSubstr("\"a\""))));
  // "cpu" is "cpu:0".
  ASSERT_THAT(registry_.Register(Req("h1", "cpu"), "1.0", 3, &took_over_), IsOk());
  EXPECT_THAT(registry_.Register(Req("h1", "cpu:0"), "1.0", 4, &took_over_),
              StatusIs(absl::StatusCode::kAlreadyExists));
  // Same device on another host is fine.
  EXPECT_THAT(registry_.Register(Req("h2", "cuda:0"), "1.0", 5, &took_over_), IsOk());
}

TEST_F(WorkerRegistryTest, Register_DuplicateName_AlreadyExists) {
  ASSERT_THAT(registry_.Register(Req("h1", "cpu:0", "w"), "1.0", 1, &took_over_), IsOk());
  EXPECT_THAT(registry_.Register(Req("h1", "cpu:1", "w"), "1.0", 2, &took_over_),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("worker id")));
}

TEST_F(WorkerRegistryTest, Register_Labels_KeptOrRefusedNamingTheLabel) {
  v1::RegisterRequest r = Req("h1", "cpu");
  (*r.mutable_labels())["zone"] = "a";
  auto w = registry_.Register(r, "1.0", 1, &took_over_);
  ASSERT_THAT(w, IsOk());
  EXPECT_EQ((*w)->labels, (Labels{{"zone", "a"}}));
  v1::RegisterRequest bad = Req("h2", "cpu");
  (*bad.mutable_labels())["zone"] = std::string(64, 'a');
  EXPECT_THAT(registry_.Register(bad, "1.0", 2, &took_over_),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("register.labels: the value of zone")));
  EXPECT_EQ(registry_.num_attached(), 1u);
}

TEST_F(WorkerRegistryTest, Register_UnknownDevice_InvalidArgument) {
  EXPECT_THAT(registry_.Register(Req("h1", "gpu0"), "1.0", 1, &took_over_),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("register.device")));
  EXPECT_THAT(registry_.Register(Req("", "cpu"), "1.0", 1, &took_over_),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("host")));
}

TEST_F(WorkerRegistryTest, Register_OtherVersion_FailedPreconditionNotNamingOurs) {
  // By default (callers may be anonymous) the refusal doesn't say which
  // build the coordinator runs.
  EXPECT_THAT(registry_.Register(Req("h1", "cpu"), "2.0.7-secret", 1, &took_over_),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("worker version \"1.0\""), HasSubstr("--version"),
                             Not(HasSubstr("2.0.7")))));
}

TEST_F(WorkerRegistryTest, Register_OtherVersionWhenCallersAreAuthenticated_NamesOurs) {
  WorkerRegistry::Options options;
  options.name_version_in_refusals = true;
  WorkerRegistry registry(&clock_, options);
  EXPECT_THAT(registry.Register(Req("h1", "cpu"), "2.0.7", 1, &took_over_),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("\"2.0.7\"")));
}

TEST_F(WorkerRegistryTest, ExpireSilent_AfterHeartbeatTimeout_MarksLost) {
  auto a = registry_.Register(Req("h1", "cpu:0"), "1.0", 1, &took_over_);
  auto b = registry_.Register(Req("h1", "cpu:1"), "1.0", 2, &took_over_);
  clock_.Advance(absl::Seconds(4));
  registry_.Touch(*b);
  clock_.Advance(absl::Seconds(2));
  EXPECT_EQ(registry_.ExpireSilent(), std::vector<std::string>{"h1/cpu:0"});
  EXPECT_TRUE((*a)->lost());
  EXPECT_EQ((*a)->state(), v1::WORKER_STATE_LOST);
  EXPECT_THAT((*a)->detail(), HasSubstr("no heartbeat"));
  EXPECT_EQ(registry_.num_attached(), 1u);
}

TEST_F(WorkerRegistryTest, Register_LostWorkerComesBack_Replaced) {
  ASSERT_THAT(registry_.Register(Req("h1", "cpu:0"), "1.0", 1, &took_over_), IsOk());
  ASSERT_TRUE(registry_.MarkLost("h1/cpu:0", 1, "stream closed"));
  auto again = registry_.Register(Req("h1", "cpu:0"), "1.0", 2, &took_over_);
  ASSERT_THAT(again, IsOk());
  EXPECT_FALSE((*again)->lost());
  EXPECT_EQ(registry_.FindAttached("h1/cpu:0", 1), nullptr);  // old session is gone
  EXPECT_NE(registry_.FindAttached("h1/cpu:0", 2), nullptr);
}

TEST_F(WorkerRegistryTest, Register_SameProcessOnNewStream_TakesOverRecordKeepingState) {
  auto first = registry_.Register(Req("h1", "cpu:0", "", 7), "1.0", 1, &took_over_);
  ASSERT_THAT(first, IsOk());
  EXPECT_FALSE(took_over_);
  registry_.MarkAssigned(*first, 1, 0, 12);
  registry_.MarkRejoined(*first, 1);  // TRAINING
  clock_.Advance(absl::Seconds(3));
  auto again = registry_.Register(Req("h1", "cpu:0", "", 7), "1.0", 2, &took_over_);
  ASSERT_THAT(again, IsOk());
  EXPECT_TRUE(took_over_);
  EXPECT_EQ(*again, *first);
  EXPECT_EQ((*again)->state(), v1::WORKER_STATE_TRAINING);
  EXPECT_EQ((*again)->step, 12u);
  EXPECT_EQ((*again)->last_seen, clock_.Now());
  EXPECT_EQ(registry_.num_attached(), 1u);
  EXPECT_EQ(registry_.FindAttached("h1/cpu:0", 1), nullptr);  // the old stream is ignored
  EXPECT_FALSE(registry_.MarkLost("h1/cpu:0", 1, "old stream closed"));
  EXPECT_NE(registry_.FindAttached("h1/cpu:0", 2), nullptr);
}

TEST_F(WorkerRegistryTest, Register_SameSlotOtherPidOrMachine_AlreadyExists) {
  ASSERT_THAT(registry_.Register(Req("h1", "cpu:0", "", 7), "1.0", 1, &took_over_), IsOk());
  EXPECT_THAT(registry_.Register(Req("h1", "cpu:0", "", 8), "1.0", 2, &took_over_),
              StatusIs(absl::StatusCode::kAlreadyExists));
  v1::RegisterRequest other_machine = Req("h1", "cpu:0", "", 7);
  other_machine.set_machine_id("m2");
  EXPECT_THAT(registry_.Register(other_machine, "1.0", 3, &took_over_),
              StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_FALSE(took_over_);
}

TEST_F(WorkerRegistryTest, NoteStep_OnlyALargerStepRestartsTheHangClock) {
  WorkerRecord* w = *registry_.Register(Req("h1", "cpu:0"), "1.0", 1, &took_over_);
  const absl::Time registered = clock_.Now();
  EXPECT_EQ(w->step_advanced_at, registered);
  clock_.Advance(absl::Seconds(5));
  registry_.NoteStep(w, 0);
  EXPECT_EQ(w->step_advanced_at, registered);
  registry_.NoteStep(w, 3);
  EXPECT_EQ(w->step, 3u);
  EXPECT_EQ(w->step_advanced_at, clock_.Now());
  clock_.Advance(absl::Seconds(5));
  registry_.NoteStep(w, 2);
  EXPECT_EQ(w->step, 3u);
  EXPECT_EQ(w->step_advanced_at, registered + absl::Seconds(5));
  registry_.RestartHangClock(w);
  EXPECT_EQ(w->step_advanced_at, clock_.Now());
}

TEST_F(WorkerRegistryTest, Evict_AttachedWorker_LostAndNoLongerCounted) {
  WorkerRecord* w = *registry_.Register(Req("h1", "cpu:0"), "1.0", 1, &took_over_);
  ASSERT_THAT(registry_.Register(Req("h1", "cpu:1"), "1.0", 2, &took_over_), IsOk());
  registry_.Evict(w, "evicted as hung");
  EXPECT_TRUE(w->lost());
  EXPECT_EQ(w->state(), v1::WORKER_STATE_LOST);
  EXPECT_EQ(w->detail(), "evicted as hung");
  EXPECT_EQ(registry_.num_attached(), 1u);
  EXPECT_EQ(registry_.FindAttached("h1/cpu:0", 1), nullptr);
  // Comes back as new.
  auto again = registry_.Register(Req("h1", "cpu:0"), "1.0", 3, &took_over_);
  ASSERT_THAT(again, IsOk());
  EXPECT_FALSE(took_over_);
  EXPECT_EQ(registry_.num_attached(), 2u);
}

TEST_F(WorkerRegistryTest, All_OrderedByHostThenDevice) {
  registry_.Register(Req("h2", "cpu:0"), "1.0", 1, &took_over_).IgnoreError();
  registry_.Register(Req("h1", "cpu:10"), "1.0", 2, &took_over_).IgnoreError();
  registry_.Register(Req("h1", "cpu:2"), "1.0", 3, &took_over_).IgnoreError();
  std::vector<std::string> ids;
  for (const WorkerRecord* w : registry_.All()) ids.push_back(w->id);
  EXPECT_EQ(ids, (std::vector<std::string>{"h1/cpu:2", "h1/cpu:10", "h2/cpu:0"}));
}

struct FieldLimitCase {
  const char* name;
  void (*set)(v1::RegisterRequest*);
  const char* field;
  const char* limit;
};

class RegisterFieldLimit : public testing::TestWithParam<FieldLimitCase> {};

TEST_P(RegisterFieldLimit, Register_FieldOverLimit_InvalidArgumentNamingFieldAndLimit) {
  FakeClock clock;
  WorkerRegistry registry(&clock, WorkerRegistry::Options{});
  v1::RegisterRequest r = Req("h1", "cpu:0");
  GetParam().set(&r);
  bool took_over = false;
  auto w = registry.Register(r, "1.0", 1, &took_over);
  EXPECT_THAT(w,
              StatusIs(absl::StatusCode::kInvalidArgument,
                       testing::AllOf(HasSubstr(GetParam().field), HasSubstr(GetParam().limit))));
  // Never the whole value back: the caller gets the reason, not a transport error.
  EXPECT_LT(w.status().message().size(), 400u);
  EXPECT_EQ(registry.num_attached(), 0u);
}

INSTANTIATE_TEST_SUITE_P(
    Table, RegisterFieldLimit,
    testing::Values(
        FieldLimitCase{"HugeHost",
                       [](v1::RegisterRequest* r) { r->set_host(std::string(2500000, 'h')); },
                       "register.host", "limit is 253 bytes"},
        FieldLimitCase{"Host254",
                       [](v1::RegisterRequest* r) { r->set_host(std::string(254, 'h')); },
                       "register.host", "limit is 253 bytes"},
        FieldLimitCase{"HostWithNewline",
                       [](v1::RegisterRequest* r) {
                         r->set_host("h\n2026-01-01 00:00:00.000 I coordinator] forged");
                       },
                       "register.host", "printable ASCII"},
        FieldLimitCase{"HostWithSpace", [](v1::RegisterRequest* r) { r->set_host("a b"); },
                       "register.host", "printable ASCII"},
        FieldLimitCase{"Name", [](v1::RegisterRequest* r) { r->set_name(std::string(129, 'n')); },
                       "register.name", "limit is 128 bytes"},
        FieldLimitCase{"NameWithEscape", [](v1::RegisterRequest* r) { r->set_name("w\x1b[2J"); },
                       "register.name", "control character"},
        FieldLimitCase{"Device",
                       [](v1::RegisterRequest* r) { r->set_device(std::string(65, 'd')); },
                       "register.device", "limit is 64 bytes"},
        FieldLimitCase{"Version",
                       [](v1::RegisterRequest* r) { r->set_version(std::string(65, 'v')); },
                       "register.version", "limit is 64 bytes"},
        FieldLimitCase{"MachineId",
                       [](v1::RegisterRequest* r) { r->set_machine_id(std::string(257, 'm')); },
                       "register.machine_id", "limit is 256 bytes"},
        FieldLimitCase{"ManyBackends",
                       [](v1::RegisterRequest* r) {
                         for (int i = 0; i < 9; ++i)
                           r->mutable_capabilities()->add_backends("gloo");
                       },
                       "register.capabilities.backends", "limit is 8"},
        FieldLimitCase{"LongBackend",
                       [](v1::RegisterRequest* r) {
                         r->mutable_capabilities()->add_backends(std::string(17, 'b'));
                       },
                       "register.capabilities.backends", "limit is 16 bytes"}),
    [](const testing::TestParamInfo<FieldLimitCase>& info) { return info.param.name; });

TEST_F(WorkerRegistryTest, Register_FieldsAtTheirLimits_Accepted) {
  v1::RegisterRequest r = Req(std::string(253, 'h'), "cpu:0", std::string(128, 'n'));
  r.set_machine_id(std::string(256, 'm'));
  for (int i = 0; i < 8; ++i) r.mutable_capabilities()->add_backends(std::string(16, 'b'));
  r.set_name("n\xc3\xa9");  // names may be UTF-8
  EXPECT_THAT(registry_.Register(r, "1.0", 1, &took_over_), IsOk());
}

TEST_F(WorkerRegistryTest, NoteUnusedParameters_OverLimits_CountedNotStored) {
  WorkerRecord* w = *registry_.Register(Req("h1", "cpu:0"), "1.0", 1, &took_over_);
  google::protobuf::RepeatedPtrField<std::string> names;
  for (int i = 0; i < 1500; ++i) *names.Add() = absl::StrCat("layer", i, ".weight");
  *names.Add() = std::string(257, 'p');
  registry_.NoteUnusedParameters(w, names);
  EXPECT_EQ(w->unused_parameters.size(), kMaxNewUnusedNamesPerReport);
  EXPECT_EQ(w->unused_names_dropped, 501u);
  // Names already known cost nothing; the per-worker total holds.
  for (int report = 0; report < 20; ++report) {
    names.Clear();
    for (int i = 0; i < 1000; ++i) *names.Add() = absl::StrCat("r", report, ".p", i);
    registry_.NoteUnusedParameters(w, names);
  }
  EXPECT_EQ(w->unused_parameters.size(), kMaxUnusedNamesPerWorker);
  EXPECT_EQ(w->unused_names_dropped, 501u + 11000u);
}

// ---- Transitions -----------------------------------------------------------

v1::StateChange Change(v1::WorkerState state, uint64_t generation) {
  v1::StateChange c;
  c.set_state(state);
  c.set_generation(generation);
  return c;
}

v1::StepReport Report(uint64_t generation, uint64_t step) {
  v1::StepReport r;
  r.set_generation(generation);
  r.set_epoch(1);
  r.set_step(step);
  r.set_loss(0.5);
  r.mutable_reduction()->set_phase(v1::STEP_PHASE_FORWARD);
  return r;
}

using Step = std::function<void(WorkerRegistry&, WorkerRecord*)>;

// One transition: from the state `from` reaches (a fresh worker is IDLE),
// what operators then see of the worker.
struct TransitionRow {
  std::string name;
  Step from;
  Step transition;
  v1::WorkerState state;
  std::string detail;
  uint64_t generation;
  bool lost;
};

TEST_F(WorkerRegistryTest, Transitions_Table_EachLeavesTheStateAndDetailOperatorsSee) {
  const Step idle = [](WorkerRegistry&, WorkerRecord*) {};
  const Step assigned = [](WorkerRegistry& r, WorkerRecord* w) { r.MarkAssigned(w, 3, 1, 40); };
  const Step training = [](WorkerRegistry& r, WorkerRecord* w) {
    r.MarkAssigned(w, 3, 1, 40);
    r.RecordReportedState(w, Change(v1::WORKER_STATE_TRAINING, 3), "training");
  };
  const Step failed = [training](WorkerRegistry& r, WorkerRecord* w) {
    training(r, w);
    r.RecordReportedState(w, Change(v1::WORKER_STATE_FAILED, 3), "nccl error");
  };
  const Step done_and_gone = [training](WorkerRegistry& r, WorkerRecord* w) {
    training(r, w);
    r.MarkDone(w, "finished");
    r.MarkLost(w->id, w->session, "stream closed");
  };
  v1::Heartbeat heartbeat;
  heartbeat.set_generation(3);
  heartbeat.set_step(41);
  const std::vector<TransitionRow> rows = {
      {"AssignedRank_Rendezvous", idle, assigned, v1::WORKER_STATE_RENDEZVOUS,
       "assigned rank 1 of generation 3", 3, false},
      {"StepReportAtRendezvous_Training", assigned,
       [](WorkerRegistry& r, WorkerRecord* w) { r.RecordStepReport(w, Report(3, 41)); },
       v1::WORKER_STATE_TRAINING, "training", 3, false},
      {"StepReportAfterFailing_StillFailed", failed,
       [](WorkerRegistry& r, WorkerRecord* w) { r.RecordStepReport(w, Report(3, 41)); },
       v1::WORKER_STATE_FAILED, "nccl error", 3, false},
      {"HeartbeatWhileTraining_Unchanged", training,
       [heartbeat](WorkerRegistry& r, WorkerRecord* w) { r.RecordHeartbeat(w, heartbeat); },
       v1::WORKER_STATE_TRAINING, "training", 3, false},
      {"ReportedTraining_Training", assigned,
       [](WorkerRegistry& r, WorkerRecord* w) {
         r.RecordReportedState(w, Change(v1::WORKER_STATE_TRAINING, 3), "took up rank 0's state");
       },
       v1::WORKER_STATE_TRAINING, "took up rank 0's state", 3, false},
      {"ReportedFailure_FailedInItsGeneration", training,
       [](WorkerRegistry& r, WorkerRecord* w) {
         r.RecordReportedState(w, Change(v1::WORKER_STATE_FAILED, 3), "peer gone");
       },
       v1::WORKER_STATE_FAILED, "peer gone", 3, false},
      {"LeftGeneration_IdleKeepingItsNumber", training,
       [](WorkerRegistry& r, WorkerRecord* w) { r.MarkIdle(w, "left generation 3"); },
       v1::WORKER_STATE_IDLE, "left generation 3", 3, false},
      {"Finished_Done", training,
       [](WorkerRegistry& r, WorkerRecord* w) { r.MarkDone(w, "finished"); }, v1::WORKER_STATE_DONE,
       "finished", 3, false},
      {"FailedPreparing_Failed", idle,
       [](WorkerRegistry& r, WorkerRecord* w) { r.MarkFailed(w, "can't load the model"); },
       v1::WORKER_STATE_FAILED, "can't load the model", 0, false},
      {"RejoinedAfterRestart_Training", idle,
       [](WorkerRegistry& r, WorkerRecord* w) { r.MarkRejoined(w, 5); }, v1::WORKER_STATE_TRAINING,
       "training (re-attached after a coordinator restart)", 5, false},
      {"StreamClosed_Lost", training,
       [](WorkerRegistry& r, WorkerRecord* w) { r.MarkLost(w->id, w->session, "stream closed"); },
       v1::WORKER_STATE_LOST, "stream closed", 3, true},
      {"StreamClosedOnAnOldSession_Unchanged", training,
       [](WorkerRegistry& r, WorkerRecord* w) { r.MarkLost(w->id, w->session + 1, "old stream"); },
       v1::WORKER_STATE_TRAINING, "training", 3, false},
      {"EvictedAsHung_Lost", training,
       [](WorkerRegistry& r, WorkerRecord* w) { r.Evict(w, "evicted as hung"); },
       v1::WORKER_STATE_LOST, "evicted as hung", 3, true},
      {"ProgramExitedAfterItsJob_DoneNotLost", done_and_gone,
       [](WorkerRegistry& r, WorkerRecord* w) { r.MarkExited(w, "exited after its job ended"); },
       v1::WORKER_STATE_DONE, "exited after its job ended", 3, true},
  };
  for (const TransitionRow& row : rows) {
    SCOPED_TRACE(row.name);
    WorkerRegistry registry(&clock_, WorkerRegistry::Options{});
    WorkerRecord* w = *registry.Register(Req("h1", "cpu:0"), "1.0", 1, &took_over_);
    row.from(registry, w);
    row.transition(registry, w);
    EXPECT_EQ(w->state(), row.state);
    EXPECT_EQ(w->detail(), row.detail);
    EXPECT_EQ(w->generation, row.generation);
    EXPECT_EQ(w->lost(), row.lost);
    EXPECT_EQ(IsFree(*w), !row.lost && (row.state == v1::WORKER_STATE_IDLE ||
                                        row.state == v1::WORKER_STATE_DONE ||
                                        row.state == v1::WORKER_STATE_FAILED));
  }
}

TEST_F(WorkerRegistryTest, MarkAssigned_AfterAGeneration_ForgetsItsReportsAndRestartsHangClock) {
  WorkerRecord* w = *registry_.Register(Req("h1", "cpu:0"), "1.0", 1, &took_over_);
  registry_.MarkAssigned(w, 1, 0, 0);
  v1::StepReport report = Report(1, 9);
  report.set_parameter_digest("abc");
  *report.mutable_reduction()->add_newly_unused_parameter_names() = "fc.bias";
  registry_.RecordStepReport(w, report);
  ASSERT_EQ(w->unused_parameters.size(), 1u);
  clock_.Advance(absl::Seconds(7));
  registry_.MarkAssigned(w, 2, 3, 5);
  EXPECT_EQ(w->step, 5u);
  EXPECT_EQ(w->step_advanced_at, clock_.Now());
  EXPECT_TRUE(w->unused_parameters.empty());
  EXPECT_TRUE(w->parameter_digest.empty());
  EXPECT_EQ(w->digest_step, 0u);
}

TEST_F(WorkerRegistryTest, MarkRejoined_HoldingState_StepIsTheHeldOne) {
  WorkerRecord* w = *registry_.Register(Req("h1", "cpu:0"), "1.0", 1, &took_over_);
  v1::HeldState held;
  held.set_step(77);
  registry_.SetHeld(w, held);
  registry_.MarkRejoined(w, 4);
  EXPECT_EQ(w->step, 77u);
  EXPECT_EQ(w->step_advanced_at, clock_.Now());
}

TEST_F(WorkerRegistryTest, RecordHeartbeat_BoundedPhaseEnds_SaysSoAndRestartsHangClock) {
  WorkerRecord* w = *registry_.Register(Req("h1", "cpu:0"), "1.0", 1, &took_over_);
  v1::Heartbeat evaluating;
  evaluating.set_step(3);
  evaluating.set_phase(v1::STEP_PHASE_EVALUATE);
  evaluating.set_phase_bound_seconds(60);
  EXPECT_FALSE(registry_.RecordHeartbeat(w, evaluating));
  EXPECT_EQ(w->phase_bound, absl::Seconds(60));
  clock_.Advance(absl::Seconds(30));
  v1::Heartbeat training;
  training.set_step(3);
  training.set_phase(v1::STEP_PHASE_FORWARD);
  EXPECT_TRUE(registry_.RecordHeartbeat(w, training));
  EXPECT_EQ(w->step_advanced_at, clock_.Now());
  EXPECT_EQ(w->phase, v1::STEP_PHASE_FORWARD);
  EXPECT_EQ(w->phase_bound, absl::ZeroDuration());
  clock_.Advance(absl::Seconds(1));
  EXPECT_FALSE(registry_.RecordHeartbeat(w, training));  // no bound ended this time
}

TEST_F(WorkerRegistryTest, RecordStepReport_OlderStepThanHeartbeat_KeepsHeartbeatPhase) {
  WorkerRecord* w = *registry_.Register(Req("h1", "cpu:0"), "1.0", 1, &took_over_);
  registry_.MarkAssigned(w, 1, 0, 0);
  v1::Heartbeat evaluating;
  evaluating.set_generation(1);
  evaluating.set_step(5);
  evaluating.set_phase(v1::STEP_PHASE_EVALUATE);
  registry_.RecordHeartbeat(w, evaluating);
  registry_.RecordStepReport(w, Report(1, 5));  // trails the heartbeat
  EXPECT_EQ(w->phase, v1::STEP_PHASE_EVALUATE);
  registry_.RecordStepReport(w, Report(1, 6));
  EXPECT_EQ(w->phase, v1::STEP_PHASE_FORWARD);
  EXPECT_EQ(w->step, 6u);
  EXPECT_EQ(w->last_loss, 0.5);
}

TEST_F(WorkerRegistryTest, PrepareFailed_NotAskedAgainForThatJob_AskedForAnother) {
  WorkerRecord* w = *registry_.Register(Req("h1", "cpu:0"), "1.0", 1, &took_over_);
  registry_.MarkPrepareAsked(w, "job/abc");
  registry_.MarkPrepareFailed(w);
  registry_.AllowPrepareAgain(w);  // failed: not asked again within the job
  EXPECT_EQ(w->prepare_asked, "job/abc");
  EXPECT_TRUE(w->prepare_failed);
  registry_.MarkPrepareAsked(w, "other/def");  // another job may ask
  EXPECT_EQ(w->prepare_asked, "other/def");
  EXPECT_FALSE(w->prepare_failed);
}

TEST_F(WorkerRegistryTest, ReserveAndRelease_TheJobAWorkerBelongsTo) {
  WorkerRecord* w = *registry_.Register(Req("h1", "cpu:0"), "1.0", 1, &took_over_);
  EXPECT_TRUE(w->job.empty());
  registry_.Reserve(w, "a");
  EXPECT_EQ(w->job, "a");
  registry_.Release(w);
  EXPECT_TRUE(w->job.empty());
}

}  // namespace
}  // namespace ddp
