// Where the job stands between generations: who is leaving and for how
// long, the quorum clock, admitting joiners, adoption after a restart, and
// how a coordinator pause moves every one of those deadlines.
#include "coordinator/generation_lifecycle.h"

#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ddp {
namespace {

using ::testing::ElementsAre;
using ::testing::Pair;

class GenerationLifecycleTest : public testing::Test {
 protected:
  FakeClock clock_;
  GenerationLifecycle lifecycle_{&clock_};
};

TEST_F(GenerationLifecycleTest, TakeOverdueLeavers_PastLimit_RemovedWithHowLongTheyWere) {
  lifecycle_.ToldToLeave("a");
  clock_.Advance(absl::Seconds(5));
  lifecycle_.ToldToLeave("b");
  lifecycle_.ToldToLeave("a");  // told again: its first time counts
  clock_.Advance(absl::Seconds(6));
  EXPECT_THAT(lifecycle_.TakeOverdueLeavers(absl::Seconds(10)),
              ElementsAre(Pair("a", absl::Seconds(11))));
  EXPECT_TRUE(lifecycle_.anyone_leaving());  // b
  lifecycle_.Left("b");
  EXPECT_FALSE(lifecycle_.anyone_leaving());
}

TEST_F(GenerationLifecycleTest, NoteQuorum_SettleWindowStartsOnceAndStartsOverWhenLost) {
  FormationInput in;
  lifecycle_.NoteQuorum(true);
  const absl::Time first = clock_.Now();
  clock_.Advance(absl::Seconds(2));
  lifecycle_.NoteQuorum(true);
  lifecycle_.FillFormationInput(&in);
  EXPECT_EQ(in.quorum_since, first);
  lifecycle_.NoteQuorum(false);
  lifecycle_.FillFormationInput(&in);
  EXPECT_FALSE(in.quorum_since.has_value());
}

TEST_F(GenerationLifecycleTest, Formed_ClearsLeaversAndQuorumAndStampsTheTime) {
  lifecycle_.ToldToLeave("a");
  lifecycle_.NoteQuorum(true);
  clock_.Advance(absl::Seconds(3));
  lifecycle_.Formed();
  FormationInput in;
  lifecycle_.FillFormationInput(&in);
  EXPECT_EQ(in.leaving_members, 0u);
  EXPECT_FALSE(in.quorum_since.has_value());
  EXPECT_EQ(in.last_formed_at, clock_.Now());
}

TEST_F(GenerationLifecycleTest, IsJoiner_OnlyNewWorkersWithUntrainedStateOnceAGenerationRan) {
  Candidate newcomer{RankCandidate{"new", "h", Device{}, ""}, std::nullopt};
  EXPECT_FALSE(lifecycle_.IsJoiner(newcomer));  // the first generation has no joiners
  lifecycle_.RememberMembers({"old"});
  EXPECT_TRUE(lifecycle_.IsJoiner(newcomer));
  Candidate old{RankCandidate{"old", "h", Device{}, ""}, std::nullopt};
  EXPECT_FALSE(lifecycle_.IsJoiner(old));
  v1::HeldState trained;
  trained.set_generation(2);
  Candidate trained_elsewhere{RankCandidate{"new2", "h", Device{}, ""}, trained};
  EXPECT_FALSE(lifecycle_.IsJoiner(trained_elsewhere));
}

TEST_F(GenerationLifecycleTest, Admitting_OverdueOnlyPastLimitCountedFromTheLastBoundedPhase) {
  EXPECT_FALSE(lifecycle_.AdmittingOverdue(absl::ZeroDuration()));
  lifecycle_.BeginAdmitting();
  clock_.Advance(absl::Seconds(8));
  lifecycle_.BoundedPhaseEnded();  // an evaluation ended: the wait counts from now
  clock_.Advance(absl::Seconds(5));
  EXPECT_FALSE(lifecycle_.AdmittingOverdue(absl::Seconds(10)));
  clock_.Advance(absl::Seconds(6));
  EXPECT_TRUE(lifecycle_.AdmittingOverdue(absl::Seconds(10)));
  lifecycle_.EndAdmitting();
  EXPECT_FALSE(lifecycle_.AdmittingOverdue(absl::Seconds(10)));
}

TEST_F(GenerationLifecycleTest, Adoption_CountsReturnsAndNamesTheMissing) {
  EXPECT_FALSE(lifecycle_.AwaitingReturn("a"));  // nothing to adopt
  lifecycle_.BeginAdoption(clock_.Now() + absl::Seconds(10));
  lifecycle_.MemberReturned("a");
  lifecycle_.MemberReturnedIdle();
  const AdoptionInput in = lifecycle_.AdoptionState(3);
  EXPECT_EQ(in.members, 3u);
  EXPECT_EQ(in.returned, 1u);
  EXPECT_EQ(in.returned_idle, 1u);
  EXPECT_EQ(in.deadline, clock_.Now() + absl::Seconds(10));
  EXPECT_FALSE(lifecycle_.AwaitingReturn("a"));
  EXPECT_THAT(lifecycle_.NotReturned({"a", "b", "c"}), ElementsAre("b", "c"));
  lifecycle_.Adopted();
  EXPECT_FALSE(lifecycle_.adopting());
  FormationInput formation;
  lifecycle_.FillFormationInput(&formation);
  EXPECT_EQ(formation.last_formed_at, clock_.Now());
}

TEST_F(GenerationLifecycleTest, Grace_CoordinatorPause_MovesEveryDeadline) {
  lifecycle_.ToldToLeave("a");
  lifecycle_.BeginAdmitting();
  lifecycle_.BeginRecovery();
  const absl::Time start = clock_.Now();
  lifecycle_.BeginAdoption(start + absl::Seconds(10));
  clock_.Advance(absl::Seconds(30));
  lifecycle_.Grace(absl::Seconds(25));
  EXPECT_TRUE(lifecycle_.TakeOverdueLeavers(absl::Seconds(6)).empty());  // 5s counted, not 30
  EXPECT_FALSE(lifecycle_.AdmittingOverdue(absl::Seconds(6)));
  EXPECT_EQ(lifecycle_.AdoptionState(1).deadline, start + absl::Seconds(35));
  FormationInput in;
  lifecycle_.FillFormationInput(&in);
  EXPECT_EQ(in.recovering_since, start + absl::Seconds(25));
}

}  // namespace
}  // namespace ddp
