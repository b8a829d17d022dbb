// The rendezvous store's per-generation capability: with tokens required,
// only a member of the generation a store call names reaches its keys.
#include <optional>
#include <set>

#include "common/tokens.h"
#include "coordinator/generation_manager.h"
#include "tests/unit/coordinator_fixture.h"

namespace ddp {
namespace {

using ::testing::HasSubstr;

class StoreTokenTest : public CoordinatorTest {
 protected:
  StoreTokenTest() {
    Coordinator::Options options = TestOptions();
    options.require_store_tokens = true;
    core_ = std::make_unique<Coordinator>(&clock_, options);
  }

  static v1::StoreSetRequest Set(uint64_t generation) {
    v1::StoreSetRequest set;
    set.set_job_id("test-job");
    set.set_generation(generation);
    set.set_key("k");
    set.set_value("v");
    return set;
  }
};

TEST_F(StoreTokenTest, Assignment_EachMemberItsOwnRandomToken) {
  auto w = Start(3, Job(3));
  std::set<std::string> tokens;
  for (const TestWorker& worker : w) {
    const std::string token = worker.assignment().store_token();
    EXPECT_EQ(token.size(), 32u);  // 128 bits, hex
    tokens.insert(token);
  }
  EXPECT_EQ(tokens.size(), 3u);
}

TEST_F(StoreTokenTest, MemberToken_Allowed_MissingOrUnknown_PermissionDenied) {
  auto w = Start(3, Job(3));
  for (const TestWorker& worker : w) {
    EXPECT_THAT(core_->StoreSet(Set(1), worker.assignment().store_token()), IsOk());
  }
  EXPECT_THAT(core_->StoreSet(Set(1)),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("no store token")));
  EXPECT_THAT(core_->StoreSet(Set(1), RandomToken()),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("not one of generation 1's members'")));
  v1::StoreAddRequest add;
  add.set_job_id("test-job");
  add.set_generation(1);
  add.set_key("n");
  add.set_delta(1);
  EXPECT_THAT(core_->StoreAdd(add, "guess"), StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(core_->StoreAdd(add, w[2].assignment().store_token()), IsOk());
  v1::StoreGetRequest get;
  get.set_job_id("test-job");
  get.set_generation(1);
  get.set_key("k");
  std::optional<absl::StatusOr<std::string>> got;
  core_->StoreGet(
      get, [&](absl::StatusOr<std::string> v) { got = v; }, "guess");
  ASSERT_TRUE(got.has_value());
  EXPECT_THAT(*got, StatusIs(absl::StatusCode::kPermissionDenied));
  got.reset();
  core_->StoreGet(
      get, [&](absl::StatusOr<std::string> v) { got = v; }, w[1].assignment().store_token());
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(**got, "v");
}

TEST_F(StoreTokenTest, OlderGenerationsToken_RefusedInTheNext_StaleStillFailedPrecondition) {
  auto w = Start(3, Job(2, 3));
  const std::string old_token = w[1].assignment().store_token();
  core_->OnStreamClosed(w[0].session, "its stream closed");
  Leave(w[1], 1, 5);
  Leave(w[2], 1, 5);
  ASSERT_EQ(Status().generation(), 2u);
  ASSERT_EQ(w[1].assignment().generation(), 2u);
  const std::string new_token = w[1].assignment().store_token();
  EXPECT_NE(new_token, old_token);
  EXPECT_THAT(core_->StoreSet(Set(2), old_token), StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(core_->StoreSet(Set(2), new_token), IsOk());
  // Fencing comes first: a stale generation is stale, whatever the token.
  EXPECT_THAT(core_->StoreSet(Set(1), old_token),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("stale generation 1")));
}

TEST_F(CoordinatorTest, Store_TokensNotRequired_OpenAsBefore) {
  StartThree();
  v1::StoreSetRequest set;
  set.set_job_id("test-job");
  set.set_generation(1);
  set.set_key("k");
  EXPECT_THAT(core_->StoreSet(set), IsOk());
  EXPECT_THAT(core_->StoreSet(set, "anything"), IsOk());
}

TEST(GenerationManagerStoreTokens, SurviveDurableRoundTrip) {
  FakeClock clock;
  GenerationManager before(&clock);
  std::vector<RankCandidate> members;
  for (int i = 0; i < 2; ++i) {
    members.push_back(
        RankCandidate{"w" + std::to_string(i), "h", Device{Device::Kind::kCpu, i}, ""});
  }
  const Generation& formed = before.Form(members, SourceChoice{}, 0.1);
  ASSERT_EQ(formed.store_tokens.size(), 2u);
  v1::DurableGeneration saved;
  before.FillDurable(&saved);
  GenerationManager after(&clock);
  after.RestoreCurrent(saved);
  ASSERT_NE(after.current(), nullptr);
  EXPECT_EQ(after.current()->store_tokens, before.current()->store_tokens);
  // A state saved before store tokens existed gets fresh ones.
  for (auto& m : *saved.mutable_members()) m.clear_store_token();
  GenerationManager old_state(&clock);
  old_state.RestoreCurrent(saved);
  ASSERT_EQ(old_state.current()->store_tokens.size(), 2u);
  EXPECT_EQ(old_state.current()->store_tokens[0].size(), 32u);
}

}  // namespace
}  // namespace ddp
