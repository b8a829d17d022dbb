// The ranks' announcements before each collective: ranks that agree go on,
// ranks that don't all fail together, each naming what every rank was
// doing. Ranks as threads over both CPU transports.
#include "worker/collective/collective_check.h"

#include <mutex>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"
#include "tests/torch/ranks.h"

namespace ddp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

class CollectiveCheckTest : public testing::TestWithParam<Backend> {
 protected:
  // body(rank, check) on `world` ranks; each rank's last status is kept.
  std::vector<absl::Status> Run(int world,
                                const std::function<absl::Status(int, CollectiveCheck&)>& body) {
    std::vector<absl::Status> out(world);
    std::mutex mu;
    RunRanks(
        world,
        [&](int rank, Communicator* comm) {
          CollectiveCheck check(comm);
          absl::Status s = body(rank, check);
          std::lock_guard<std::mutex> lock(mu);
          out[rank] = s;
        },
        absl::Seconds(30), GetParam());
    return out;
  }
};

TEST_P(CollectiveCheckTest, SameCollectivesInTheSameOrder_Ok) {
  for (const absl::Status& s : Run(3, [](int, CollectiveCheck& check) {
         for (int i = 0; i < 20; ++i) {
           absl::Status s = check.Agree(Collective{CollectiveKind::kGradients, 1000, 3, 0, 64});
           if (s.ok()) s = check.Agree(Collective{CollectiveKind::kAllReduce, 2});
           if (!s.ok()) return s;
         }
         return check.Agree(Collective{CollectiveKind::kBroadcast, 8, 0, 2});
       })) {
    EXPECT_THAT(s, IsOk());
  }
}

TEST_P(CollectiveCheckTest, OneRankCallsAnotherCollective_EveryRankFailsNamingEach) {
  // Rank 1 makes an all_reduce_sum where ranks 0 and 2 reduce the
  // gradients of their second step.
  const std::vector<absl::Status> out = Run(3, [](int rank, CollectiveCheck& check) {
    absl::Status s = check.Agree(Collective{CollectiveKind::kGradients, 1000, 3});
    if (!s.ok()) return s;
    return rank == 1 ? check.Agree(Collective{CollectiveKind::kAllReduce, 1})
                     : check.Agree(Collective{CollectiveKind::kGradients, 1000, 3});
  });
  for (const absl::Status& s : out) {
    EXPECT_TRUE(IsMisaligned(s)) << s;
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kFailedPrecondition,
                            AllOf(HasSubstr("ranks 0, 2 at collective #2: the gradients of "
                                            "synchronized backward #2 (3 buckets, 1000 floats)"),
                                  HasSubstr("rank 1 at collective #2: all_reduce_sum of 1 float "
                                            "after synchronized backward #1"))));
  }
}

TEST_P(CollectiveCheckTest, SameKindOtherSize_EveryRankFails) {
  const std::vector<absl::Status> out = Run(2, [](int rank, CollectiveCheck& check) {
    return check.Agree(Collective{CollectiveKind::kBroadcast, rank == 0 ? 16u : 24u, 0, 0});
  });
  for (const absl::Status& s : out) {
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kFailedPrecondition,
                            AllOf(HasSubstr("rank 0 at collective #1: broadcast of 16 bytes"),
                                  HasSubstr("rank 1 at collective #1: broadcast of 24 bytes"))));
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, CollectiveCheckTest,
                         testing::Values(Backend::kGloo, Backend::kShm),
                         [](const testing::TestParamInfo<Backend>& info) {
                           return BackendName(info.param);
                         });

TEST(CollectiveCheck, Alone_AlwaysAgrees) {
  RunRanks(1, [](int, Communicator* comm) {
    CollectiveCheck check(comm);
    EXPECT_THAT(check.Agree(Collective{CollectiveKind::kBarrier}), IsOk());
  });
}

TEST(MisalignedError, ManyRanks_GroupsThemAndSaysWhatToDo) {
  std::vector<AnnouncedCollective> by_rank(12, {Collective{CollectiveKind::kBarrier}, 7, 3});
  by_rank[5] = {Collective{CollectiveKind::kState, 0, 0, 2}, 7, 3};
  const absl::Status s = MisalignedError(by_rank);
  EXPECT_TRUE(IsMisaligned(s));
  EXPECT_FALSE(IsMisaligned(absl::FailedPreconditionError("other")));
  EXPECT_THAT(s.message(),
              AllOf(HasSubstr("ranks 0, 1, 2, 3, 4, 6, 7, 8 and 3 more at collective #8: barrier "
                              "after synchronized backward #3"),
                    HasSubstr("rank 5 at collective #8: taking up rank 2's elastic state"),
                    HasSubstr("the same synchronized backwards (one whose loss reaches no "
                              "parameter still counts)")));
}

}  // namespace
}  // namespace ddp
