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

TEST(RankAssignment, WhyNotOwnGpus_Table) {
  const auto cuda = Device::Kind::kCuda;
  const auto cpu = Device::Kind::kCpu;
  auto M = [](const char* host, Device::Kind kind, int index, const char* machine) {
    return RankCandidate{"w", host, Device{kind, index}, machine};
  };
  struct Row {
    const char* name;
    std::vector<RankCandidate> members;
    std::string want;  // empty: every member has its own GPU
  };
  const Row rows[] = {
      {"one GPU each on one machine", {M("h", cuda, 0, "m"), M("h", cuda, 1, "m")}, ""},
      {"cuda:0 on two machines", {M("h1", cuda, 0, "m1"), M("h2", cuda, 0, "m2")}, ""},
      {"cuda:0 on two hosts without machine ids", {M("h1", cuda, 0, ""), M("h2", cuda, 0, "")}, ""},
      {"two addresses of one machine on cuda:0",
       {M("10.0.0.1", cuda, 0, "m"), M("10.0.0.2", cuda, 1, "m"), M("127.0.0.1", cuda, 0, "m")},
       "ranks 0 and 2 share cuda:0 on m (NCCL refuses two ranks on one device)"},
      {"a CPU member",
       {M("h", cuda, 0, "m"), M("h", cpu, 0, "m")},
       "rank 1 is on cpu:0 (NCCL needs a GPU on every rank)"},
      {"no members", {}, "no members"},
  };
  for (const Row& row : rows) {
    EXPECT_EQ(WhyNotOwnGpus(row.members), row.want) << row.name;
  }
}

}  // namespace
}  // namespace ddp
