#include "coordinator/worker_registry.h"

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ddp {
namespace {

using ::testing::HasSubstr;

v1::RegisterRequest Req(const std::string& host, const std::string& device,
                        const std::string& name = "") {
  v1::RegisterRequest r;
  r.set_host(host);
  r.set_device(device);
  r.set_version("1.0");
  r.set_name(name);
  r.set_pid(42);
  return r;
}

class WorkerRegistryTest : public testing::Test {
 protected:
  FakeClock clock_;
  WorkerRegistry registry_{&clock_, WorkerRegistry::Options{}};
};

TEST_F(WorkerRegistryTest, Register_NewSlot_IdIsHostAndDevice) {
  auto w = registry_.Register(Req("h1", "cpu"), "1.0", 1);
  ASSERT_THAT(w, IsOk());
  EXPECT_EQ((*w)->id, "h1/cpu:0");
  EXPECT_EQ(registry_.num_attached(), 1u);
}

TEST_F(WorkerRegistryTest, RegisterWorker_DuplicateDevice_FailsWithAlreadyExists) {
  ASSERT_THAT(registry_.Register(Req("h1", "cuda:0", "a"), "1.0", 1), IsOk());
  EXPECT_THAT(registry_.Register(Req("h1", "cuda:0", "b"), "1.0", 2),
              StatusIs(absl::StatusCode::kAlreadyExists,
                       testing::AllOf(HasSubstr("cuda:0"), HasSubstr("\"a\""))));
  // "cpu" is "cpu:0".
  ASSERT_THAT(registry_.Register(Req("h1", "cpu"), "1.0", 3), IsOk());
  EXPECT_THAT(registry_.Register(Req("h1", "cpu:0"), "1.0", 4),
              StatusIs(absl::StatusCode::kAlreadyExists));
  // Same device on another host is fine.
  EXPECT_THAT(registry_.Register(Req("h2", "cuda:0"), "1.0", 5), IsOk());
}

TEST_F(WorkerRegistryTest, Register_DuplicateName_AlreadyExists) {
  ASSERT_THAT(registry_.Register(Req("h1", "cpu:0", "w"), "1.0", 1), IsOk());
  EXPECT_THAT(registry_.Register(Req("h1", "cpu:1", "w"), "1.0", 2),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("worker id")));
}

TEST_F(WorkerRegistryTest, Register_UnknownDevice_InvalidArgument) {
  EXPECT_THAT(registry_.Register(Req("h1", "gpu0"), "1.0", 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("register.device")));
  EXPECT_THAT(registry_.Register(Req("", "cpu"), "1.0", 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("host")));
}

TEST_F(WorkerRegistryTest, Register_OtherVersion_FailedPrecondition) {
  EXPECT_THAT(registry_.Register(Req("h1", "cpu"), "2.0", 1),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("version")));
}

TEST_F(WorkerRegistryTest, ExpireSilent_AfterHeartbeatTimeout_MarksLost) {
  auto a = registry_.Register(Req("h1", "cpu:0"), "1.0", 1);
  auto b = registry_.Register(Req("h1", "cpu:1"), "1.0", 2);
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
  ASSERT_THAT(registry_.Register(Req("h1", "cpu:0"), "1.0", 1), IsOk());
  ASSERT_TRUE(registry_.MarkLost("h1/cpu:0", 1, "stream closed"));
  auto again = registry_.Register(Req("h1", "cpu:0"), "1.0", 2);
  ASSERT_THAT(again, IsOk());
  EXPECT_FALSE((*again)->lost);
  EXPECT_EQ(registry_.FindAttached("h1/cpu:0", 1), nullptr);  // old session is gone
  EXPECT_NE(registry_.FindAttached("h1/cpu:0", 2), nullptr);
}

TEST_F(WorkerRegistryTest, All_OrderedByHostThenDevice) {
  registry_.Register(Req("h2", "cpu:0"), "1.0", 1).IgnoreError();
  registry_.Register(Req("h1", "cpu:10"), "1.0", 2).IgnoreError();
  registry_.Register(Req("h1", "cpu:2"), "1.0", 3).IgnoreError();
  std::vector<std::string> ids;
  for (const WorkerRecord* w : registry_.All()) ids.push_back(w->id);
  EXPECT_EQ(ids, (std::vector<std::string>{"h1/cpu:2", "h1/cpu:10", "h2/cpu:0"}));
}

}  // namespace
}  // namespace ddp
