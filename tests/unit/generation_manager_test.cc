#include "coordinator/generation_manager.h"

#include "gtest/gtest.h"

namespace ddp {
namespace {

RankCandidate Slot(int index, const std::string& machine = "m1") {
  return RankCandidate{"w" + std::to_string(index), "h", Device{Device::Kind::kCpu, index},
                       machine};
}

std::vector<RankCandidate> Workers(int n) {
  std::vector<RankCandidate> v;
  for (int i = 0; i < n; ++i) v.push_back(Slot(i));
  return v;
}

SourceChoice FromMemory(uint32_t rank, uint64_t step) {
  SourceChoice s;
  s.rank = rank;
  s.source = v1::STATE_SOURCE_MEMORY;
  s.step = step;
  s.epoch = 1;
  s.cursor = 320;
  return s;
}

class GenerationManagerTest : public testing::Test {
 protected:
  FakeClock clock_;
  GenerationManager generations_{&clock_};
};

// Machines are runs of one machine id in rank order; a member without one
// is a machine of its own. The hierarchical all-reduce's layout comes from
// here.
TEST_F(GenerationManagerTest, Form_MachinesAreRunsOfOneMachineId) {
  const Generation& g = generations_.Form(
      {Slot(0, "a"), Slot(1, "a"), Slot(2, "b"), Slot(3, "b"), Slot(4, "b"), Slot(5, "")},
      FromMemory(0, 0), 0.1);
  EXPECT_EQ(g.machine_starts, (std::vector<int>{0, 2, 5, 6}));
  EXPECT_EQ(g.MachineOf(0), 0);
  EXPECT_EQ(g.MachineOf(1), 0);
  EXPECT_EQ(g.MachineOf(4), 1);
  EXPECT_EQ(g.MachineOf(5), 2);
  EXPECT_EQ(g.MachineSize(1), 3);
  EXPECT_EQ(g.MachineSize(2), 1);
  EXPECT_EQ(g.LargestMachine(), 3);
}

TEST_F(GenerationManagerTest, Form_First_NumberedOneMembersInGivenOrder) {
  EXPECT_EQ(generations_.current(), nullptr);
  EXPECT_EQ(generations_.latest(), 0u);
  const Generation& g = generations_.Form(Workers(3), FromMemory(2, 40), 0.05);
  EXPECT_EQ(g.number, 1u);
  EXPECT_EQ(g.MemberIds(), (std::vector<std::string>{"w0", "w1", "w2"}));
  EXPECT_EQ(g.RankOf("w2"), 2);
  EXPECT_EQ(g.RankOf("nobody"), -1);
  EXPECT_EQ(g.source.step, 40u);
  EXPECT_EQ(g.source.rank, 2u);
  EXPECT_DOUBLE_EQ(g.lr, 0.05);
  EXPECT_EQ(g.formed_at, clock_.Now());
  EXPECT_TRUE(generations_.IsCurrent(1));
  EXPECT_EQ(generations_.latest(), 1u);
}

TEST_F(GenerationManagerTest, Form_SingleMachine_OnlyWhenEveryMachineIdIsSetAndEqual) {
  EXPECT_TRUE(generations_.Form({Slot(0), Slot(1)}, SourceChoice{}, 0.1).single_machine);
  EXPECT_FALSE(generations_.Form({Slot(0), Slot(1, "m2")}, SourceChoice{}, 0.1).single_machine);
  EXPECT_FALSE(generations_.Form({Slot(0, ""), Slot(1, "")}, SourceChoice{}, 0.1).single_machine);
  EXPECT_FALSE(generations_.Form({}, SourceChoice{}, 0.1).single_machine);
}

TEST_F(GenerationManagerTest, EndCurrent_LastStaysVisible_NextNumberGrows) {
  generations_.Form(Workers(2), SourceChoice{}, 0.1);
  generations_.EndCurrent();
  EXPECT_EQ(generations_.current(), nullptr);
  EXPECT_FALSE(generations_.IsCurrent(1));
  ASSERT_NE(generations_.last(), nullptr);
  EXPECT_EQ(generations_.last()->number, 1u);
  EXPECT_EQ(generations_.last()->RankOf("w1"), 1);
  EXPECT_EQ(generations_.Form(Workers(1), SourceChoice{}, 0.1).number, 2u);
  EXPECT_EQ(generations_.latest(), 2u);
  EXPECT_FALSE(generations_.IsCurrent(1));
  EXPECT_TRUE(generations_.IsCurrent(2));
}

TEST_F(GenerationManagerTest, RestoreLatest_NeverLowers) {
  generations_.RestoreLatest(41);
  EXPECT_EQ(generations_.latest(), 41u);
  generations_.RestoreLatest(3);
  EXPECT_EQ(generations_.latest(), 41u);
  EXPECT_EQ(generations_.Form(Workers(1), SourceChoice{}, 0.1).number, 42u);
  generations_.RestoreLatest(10);
  EXPECT_EQ(generations_.Form(Workers(1), SourceChoice{}, 0.1).number, 43u);
}

TEST_F(GenerationManagerTest, FillDurable_RestoreCurrent_RoundTrip) {
  std::vector<RankCandidate> members = {
      RankCandidate{"a", "h1", Device{Device::Kind::kCuda, 3}, "m1"},
      RankCandidate{"b", "h2", Device{Device::Kind::kCpu, 0}, "m2"}};
  generations_.RestoreLatest(6);
  generations_.Form(members, FromMemory(1, 77), 0.025);
  v1::DurableGeneration saved;
  generations_.FillDurable(&saved);
  EXPECT_EQ(saved.number(), 7u);
  ASSERT_EQ(saved.members_size(), 2);
  EXPECT_EQ(saved.members(0).device(), "cuda:3");

  FakeClock later(clock_.Now() + absl::Hours(1));
  GenerationManager restored(&later);
  restored.RestoreCurrent(saved);
  ASSERT_NE(restored.current(), nullptr);
  const Generation& g = *restored.current();
  EXPECT_EQ(g.number, 7u);
  EXPECT_TRUE(restored.IsCurrent(7));
  EXPECT_EQ(restored.latest(), 7u);
  EXPECT_EQ(g.MemberIds(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(g.members[0].host, "h1");
  EXPECT_TRUE(g.members[0].device == (Device{Device::Kind::kCuda, 3}));
  EXPECT_EQ(g.members[1].machine_id, "m2");
  EXPECT_EQ(g.source.source, v1::STATE_SOURCE_MEMORY);
  EXPECT_EQ(g.source.rank, 1u);
  EXPECT_EQ(g.source.step, 77u);
  EXPECT_EQ(g.source.epoch, 1u);
  EXPECT_EQ(g.source.cursor, 320u);
  EXPECT_DOUBLE_EQ(g.lr, 0.025);
  EXPECT_FALSE(g.single_machine);
  EXPECT_EQ(g.formed_at, later.Now());
  v1::DurableGeneration again;
  restored.FillDurable(&again);
  EXPECT_EQ(again.SerializeAsString(), saved.SerializeAsString());
  EXPECT_EQ(restored.Form(Workers(1), SourceChoice{}, 0.1).number, 8u);
}

TEST_F(GenerationManagerTest, RestoreCurrent_BelowLatest_NumbersStillOnlyGrow) {
  generations_.RestoreLatest(50);
  v1::DurableGeneration saved;
  saved.set_number(7);
  generations_.RestoreCurrent(saved);
  EXPECT_TRUE(generations_.IsCurrent(7));
  EXPECT_EQ(generations_.latest(), 50u);
  generations_.EndCurrent();
  EXPECT_EQ(generations_.Form(Workers(1), SourceChoice{}, 0.1).number, 51u);
}

TEST_F(GenerationManagerTest, FillDurable_NoCurrent_LeavesItEmpty) {
  generations_.Form(Workers(1), SourceChoice{}, 0.1);
  generations_.EndCurrent();
  v1::DurableGeneration saved;
  generations_.FillDurable(&saved);
  EXPECT_EQ(saved.number(), 0u);
  EXPECT_EQ(saved.members_size(), 0);
}

}  // namespace
}  // namespace ddp
