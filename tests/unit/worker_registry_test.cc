#include "coordinator/worker_registry.h"

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
  EXPECT_TRUE((*a)->lost);
  EXPECT_EQ((*a)->state, v1::WORKER_STATE_LOST);
  EXPECT_THAT((*a)->detail, HasSubstr("no heartbeat"));
  EXPECT_EQ(registry_.num_attached(), 1u);
}

TEST_F(WorkerRegistryTest, Register_LostWorkerComesBack_Replaced) {
  ASSERT_THAT(registry_.Register(Req("h1", "cpu:0"), "1.0", 1, &took_over_), IsOk());
  ASSERT_TRUE(registry_.MarkLost("h1/cpu:0", 1, "stream closed"));
  auto again = registry_.Register(Req("h1", "cpu:0"), "1.0", 2, &took_over_);
  ASSERT_THAT(again, IsOk());
  EXPECT_FALSE((*again)->lost);
  EXPECT_EQ(registry_.FindAttached("h1/cpu:0", 1), nullptr);  // old session is gone
  EXPECT_NE(registry_.FindAttached("h1/cpu:0", 2), nullptr);
}

TEST_F(WorkerRegistryTest, Register_SameProcessOnNewStream_TakesOverRecordKeepingState) {
  auto first = registry_.Register(Req("h1", "cpu:0", "", 7), "1.0", 1, &took_over_);
  ASSERT_THAT(first, IsOk());
  EXPECT_FALSE(took_over_);
  (*first)->state = v1::WORKER_STATE_TRAINING;
  (*first)->step = 12;
  clock_.Advance(absl::Seconds(3));
  auto again = registry_.Register(Req("h1", "cpu:0", "", 7), "1.0", 2, &took_over_);
  ASSERT_THAT(again, IsOk());
  EXPECT_TRUE(took_over_);
  EXPECT_EQ(*again, *first);
  EXPECT_EQ((*again)->state, v1::WORKER_STATE_TRAINING);
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
  EXPECT_TRUE(w->lost);
  EXPECT_EQ(w->state, v1::WORKER_STATE_LOST);
  EXPECT_EQ(w->detail, "evicted as hung");
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

}  // namespace
}  // namespace ddp
