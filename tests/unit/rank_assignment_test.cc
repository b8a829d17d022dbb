#include "coordinator/rank_assignment.h"

#include "gtest/gtest.h"

namespace ddp {
namespace {

RankCandidate C(const char* id, const char* host, Device::Kind kind, int index) {
  return RankCandidate{id, host, Device{kind, index}};
}

std::vector<std::string> Ids(const std::vector<RankCandidate>& v) {
  std::vector<std::string> ids;
  for (const auto& c : v) ids.push_back(c.worker_id);
  return ids;
}

TEST(RankAssignment, OrderByRank_HostThenDeviceNumerically) {
  const auto cuda = Device::Kind::kCuda;
  const auto cpu = Device::Kind::kCpu;
  std::vector<RankCandidate> in = {C("b10", "hostb", cuda, 10), C("a1", "hosta", cuda, 1),
                                   C("b2", "hostb", cuda, 2), C("a0", "hosta", cuda, 0),
                                   C("acpu", "hosta", cpu, 0)};
  EXPECT_EQ(Ids(OrderByRank(in)), (std::vector<std::string>{"acpu", "a0", "a1", "b2", "b10"}));
}

TEST(RankAssignment, OrderByRank_IndependentOfArrivalOrder) {
  const auto cpu = Device::Kind::kCpu;
  std::vector<RankCandidate> in = {C("w2", "h", cpu, 2), C("w0", "h", cpu, 0),
                                   C("w1", "h", cpu, 1)};
  const auto first = Ids(OrderByRank(in));
  std::reverse(in.begin(), in.end());
  EXPECT_EQ(Ids(OrderByRank(in)), first);
  EXPECT_EQ(first, (std::vector<std::string>{"w0", "w1", "w2"}));
}

}  // namespace
}  // namespace ddp
