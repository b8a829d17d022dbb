#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <numeric>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"
#include "tests/torch/ranks.h"

namespace ddp {
namespace {

// Both CPU communicators, on 2 and 3 ranks.
class CommunicatorTest : public testing::TestWithParam<std::tuple<Backend, int>> {
 protected:
  Backend backend() const { return std::get<0>(GetParam()); }
  int world() const { return std::get<1>(GetParam()); }
  // Small shared-memory slots, so big buffers go through in pieces.
  void Run(const std::function<void(int, Communicator*)>& body) {
    RunRanks(world(), body, absl::Seconds(30), backend(), /*shm_slot_bytes=*/64 << 10);
  }
};

TEST_P(CommunicatorTest, AllReduceSum_EveryRankGetsTheSum) {
  const int world = this->world();
  for (size_t n : {size_t{1}, size_t{1000}, size_t{1} << 20}) {
    Run([&](int rank, Communicator* comm) {
      std::vector<float> data(n);
      for (size_t i = 0; i < n; ++i) data[i] = static_cast<float>(rank * 1000 + i % 1000);
      ASSERT_THAT(comm->AllReduceSum(data.data(), n), IsOk());
      for (size_t i = 0; i < n; i += 997) {
        const float want = 1000.0f * world * (world - 1) / 2 + world * static_cast<float>(i % 1000);
        ASSERT_EQ(data[i], want) << "rank " << rank << " element " << i;
      }
    });
  }
}

TEST_P(CommunicatorTest, Broadcast_FromAnyRoot_EveryoneGetsRootsBytes) {
  const int root = world() - 1;
  Run([&](int rank, Communicator* comm) {
    // 100 KB: more than one shared-memory piece.
    std::vector<int64_t> data(12800, rank);
    ASSERT_THAT(comm->Broadcast(data.data(), data.size() * sizeof(int64_t), root), IsOk());
    for (int64_t v : data) ASSERT_EQ(v, root);
  });
}

TEST_P(CommunicatorTest, AllReduceSum_SameBitsOnEveryRank) {
  std::vector<std::vector<float>> results(world());
  Run([&](int rank, Communicator* comm) {
    std::vector<float> data(5000);
    for (size_t i = 0; i < data.size(); ++i) data[i] = 0.1f * (rank + 1) / (i + 1);
    ASSERT_THAT(comm->AllReduceSum(data.data(), data.size()), IsOk());
    results[rank] = data;
  });
  for (int r = 1; r < world(); ++r) EXPECT_EQ(results[r], results[0]);
}

// Compressed gradients: every rank gets the same 16-bit sum, each partial
// sum rounded to the type (for two ranks: the exact sum, rounded once).
TEST_P(CommunicatorTest, AllReduceSumHalf_EveryRankGetsTheRoundedSum) {
  for (HalfType type : {HalfType::kFloat16, HalfType::kBFloat16}) {
    auto to_half = [type](float f) {
      return type == HalfType::kFloat16 ? FloatToFloat16(f) : FloatToBFloat16(f);
    };
    auto to_float = [type](uint16_t h) {
      return type == HalfType::kFloat16 ? Float16ToFloat(h) : BFloat16ToFloat(h);
    };
    // Spans more than one shared-memory slot (64 KiB here).
    const size_t n = 50000;
    auto value = [](int rank, size_t i) { return 0.37f * (rank + 1) / (1 + i % 977); };
    std::vector<std::vector<uint16_t>> results(world());
    Run([&](int rank, Communicator* comm) {
      std::vector<uint16_t> data(n);
      for (size_t i = 0; i < n; ++i) data[i] = to_half(value(rank, i));
      ASSERT_THAT(comm->AllReduceSumHalf(data.data(), n, type), IsOk());
      results[rank] = data;
    });
    for (int r = 1; r < world(); ++r) EXPECT_EQ(results[r], results[0]);
    for (size_t i = 0; i < n; i += 101) {
      float exact = 0;
      for (int r = 0; r < world(); ++r) exact += to_float(to_half(value(r, i)));
      if (world() == 2) {
        ASSERT_EQ(results[0][i], to_half(exact)) << "element " << i;
      } else {  // rounded once per partial sum
        const float tolerance = type == HalfType::kFloat16 ? 2e-3f : 1.6e-2f;
        ASSERT_NEAR(to_float(results[0][i]), exact, tolerance * exact) << "element " << i;
      }
    }
  }
}

TEST_P(CommunicatorTest, Abort_CollectiveInFlight_FailsPromptlyWithAborted) {
  std::atomic<bool> rank0_done{false};
  Run([&](int rank, Communicator* comm) {
    if (rank != 0) {
      // Stays connected but never joins the collective: a hung peer.
      while (!rank0_done) absl::SleepFor(absl::Milliseconds(10));
      return;
    }
    std::atomic<bool> entered{false};
    std::atomic<bool> returned{false};
    std::thread aborter([&] {
      // Only once the all-reduce was called and has not returned (its peer
      // never joins, so it can't): the abort lands on a collective in
      // flight, not before one.
      for (int i = 0; i < 1000 && !entered; ++i) absl::SleepFor(absl::Milliseconds(10));
      absl::SleepFor(absl::Milliseconds(200));  // let the all-reduce block
      EXPECT_TRUE(entered);
      EXPECT_FALSE(returned);
      comm->Abort();
    });
    float x = 1;
    const absl::Time start = absl::Now();
    entered = true;
    EXPECT_THAT(comm->AllReduceSum(&x, 1), StatusIs(absl::StatusCode::kAborted));
    returned = true;
    EXPECT_LT(absl::Now() - start, absl::Seconds(10));  // not the 30 s timeout
    aborter.join();
    EXPECT_THAT(comm->AllReduceSum(&x, 1), StatusIs(absl::StatusCode::kAborted));
    rank0_done = true;
  });
}

// A partitioned peer: it hangs without closing anything, and the coordinator
// aborts every other rank at about the same moment.
TEST_P(CommunicatorTest, OthersAbortedTogetherWhileOnePeerHangs_AllReturnAborted) {
  if (world() < 3) GTEST_SKIP() << "needs two ranks besides the hung one";
  std::atomic<bool> done{false};
  std::atomic<int> returned{0};
  Run([&](int rank, Communicator* comm) {
    if (rank == 0) {
      while (!done) absl::SleepFor(absl::Milliseconds(10));
      return;
    }
    std::thread aborter([&] {
      absl::SleepFor(absl::Milliseconds(200));
      comm->Abort();
    });
    float x = 1;
    EXPECT_FALSE(comm->AllReduceSum(&x, 1).ok());
    aborter.join();
    if (++returned == world() - 1) done = true;
  });
}

TEST_P(CommunicatorTest, PeerAborts_OthersFailPromptly) {
  Run([&](int rank, Communicator* comm) {
    if (rank == world() - 1) {
      absl::SleepFor(absl::Milliseconds(100));
      comm->Abort();
      return;
    }
    float x = 1;
    const absl::Time start = absl::Now();
    EXPECT_FALSE(comm->AllReduceSum(&x, 1).ok());
    EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  });
}

INSTANTIATE_TEST_SUITE_P(Backends, CommunicatorTest,
                         testing::Combine(testing::Values(Backend::kGloo, Backend::kShm),
                                          testing::Values(2, 3)),
                         [](const testing::TestParamInfo<CommunicatorTest::ParamType>& info) {
                           return BackendName(std::get<0>(info.param)) +
                                  std::to_string(std::get<1>(info.param));
                         });

// Two ranks to a machine: 3 ranks are machines of 2 and 1, 4 ranks two of 2.
INSTANTIATE_TEST_SUITE_P(Hierarchical, CommunicatorTest,
                         testing::Combine(testing::Values(Backend::kHierarchical),
                                          testing::Values(3, 4)),
                         [](const testing::TestParamInfo<CommunicatorTest::ParamType>& info) {
                           return BackendName(std::get<0>(info.param)) +
                                  std::to_string(std::get<1>(info.param));
                         });

// The flat ring's sums, in another order: equal within float rounding.
TEST(HierarchicalCommunicator, AllReduceSum_MatchesTheFlatRingWithinRounding) {
  const int world = 4;
  auto value = [](int rank, size_t i) { return 0.1f * (rank + 1) / (1.0f + i % 1013) - 0.02f; };
  const size_t n = 300000;
  std::vector<std::vector<float>> flat(world), hierarchical(world);
  for (Backend backend : {Backend::kGloo, Backend::kHierarchical}) {
    auto& out = backend == Backend::kGloo ? flat : hierarchical;
    RunRanks(
        world,
        [&](int rank, Communicator* comm) {
          std::vector<float> data(n);
          for (size_t i = 0; i < n; ++i) data[i] = value(rank, i);
          ASSERT_THAT(comm->AllReduceSum(data.data(), n), IsOk());
          out[rank] = std::move(data);
        },
        absl::Seconds(30), backend, /*shm_slot_bytes=*/64 << 10);
  }
  for (int r = 1; r < world; ++r) EXPECT_EQ(hierarchical[r], hierarchical[0]);
  for (size_t i = 0; i < n; ++i) {
    ASSERT_NEAR(hierarchical[0][i], flat[0][i], 1e-6f * (1.0f + std::abs(flat[0][i])))
        << "element " << i;
  }
}

TEST(HierarchicalCommunicator, Create_MachinesDontAddUpToTheWorld_InvalidArgumentOnEveryRank) {
  // Three ranks that think the world is four: machine 0 holds rank 0,
  // machine 1 ranks 1 and 2.
  gloo::rendezvous::HashStore store;
  std::vector<absl::Status> results(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      HierarchicalCommunicator::Options options;
      options.rank = r;
      options.world_size = 4;
      options.machine = r == 0 ? 0 : 1;
      options.machines = 2;
      options.local_rank = r == 0 ? 0 : r - 1;
      options.local_size = r == 0 ? 1 : 2;
      options.timeout = absl::Seconds(30);
      results[r] = HierarchicalCommunicator::Create(store, options).status();
    });
  }
  for (auto& t : threads) t.join();
  for (const absl::Status& s : results) {
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument,
                            testing::HasSubstr("the machines hold 3 ranks")));
  }
}

TEST(HierarchicalCommunicator, Create_ImpossibleLayout_InvalidArgumentSaysWhy) {
  gloo::rendezvous::HashStore store;
  HierarchicalCommunicator::Options options;
  options.rank = 0;
  options.world_size = 4;
  options.local_rank = 2;
  options.local_size = 2;
  EXPECT_THAT(HierarchicalCommunicator::Create(store, options),
              StatusIs(absl::StatusCode::kInvalidArgument, testing::HasSubstr("is not possible")));
}

TEST(ShmCommunicator, Create_TooManyRanks_FailedPrecondition) {
  gloo::rendezvous::HashStore store;
  ShmCommunicator::Options options;
  options.world_size = ShmCommunicator::kMaxRanks + 1;
  EXPECT_THAT(ShmCommunicator::Create(store, options),
              StatusIs(absl::StatusCode::kFailedPrecondition));
}

// Segments of this process in /dev/shm (named /ddp-<creator pid>-...).
std::vector<std::string> OwnSegments(pid_t pid = ::getpid()) {
  std::vector<std::string> names;
  const std::string prefix = "ddp-" + std::to_string(pid) + "-";
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) == 0) names.push_back(name);
  }
  return names;
}

TEST(ShmCommunicator, Create_PeerNeverComes_UnavailableAndNoSegmentLeft) {
  gloo::rendezvous::HashStore store;
  ShmCommunicator::Options options;
  options.world_size = 2;
  options.timeout = absl::Milliseconds(300);
  EXPECT_THAT(ShmCommunicator::Create(store, options), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(OwnSegments(), testing::IsEmpty());
}

TEST(ShmCommunicator, Create_SegmentOfADeadCreator_RemovedOthersKept) {
  // A creator that is gone (a child that exited) and one that is alive.
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ASSERT_GT(dead, 0);
  ::waitpid(dead, nullptr, 0);
  const std::string stale = "/ddp-" + std::to_string(dead) + "-0000000000000001";
  const std::string alive = "/ddp-" + std::to_string(::getppid()) + "-0000000000000002";
  for (const std::string& name : {stale, alive}) {
    const int fd = ::shm_open(name.c_str(), O_CREAT | O_RDWR, 0600);
    ASSERT_GE(fd, 0) << name;
    ::close(fd);
  }
  gloo::rendezvous::HashStore store;
  ShmCommunicator::Options options;  // one rank: created and unlinked at once
  EXPECT_THAT(ShmCommunicator::Create(store, options), IsOk());
  EXPECT_THAT(OwnSegments(dead), testing::IsEmpty());
  EXPECT_THAT(OwnSegments(::getppid()), testing::Contains(alive.substr(1)));
  ::shm_unlink(alive.c_str());
  EXPECT_THAT(OwnSegments(), testing::IsEmpty());
}

// A peer that aborts (or dies) while the others are still connecting, or
// while their first collective is failing on its own, and the coordinator's
// Abort arriving at the same moment: every rank ends with an error status,
// none crashes (Gloo alone would raise SIGPIPE, or throw on its event-loop
// thread: see worker/collective/gloo_workarounds.cc). Repeated to give the races room.
TEST(GlooCommunicator, PeerAbortsWhileOthersConnectOrReduce_ErrorsNeverCrashes) {
  for (int round = 0; round < 30; ++round) {
    const int world = 2 + round % 2;
    gloo::rendezvous::HashStore store;
    std::vector<std::thread> ranks;
    for (int rank = 0; rank < world; ++rank) {
      ranks.emplace_back([&, rank] {
        GlooCommunicator::Options options;
        options.rank = rank;
        options.world_size = world;
        options.timeout = absl::Seconds(10);
        auto comm = GlooCommunicator::Create(store, options);
        if (!comm.ok()) {
          EXPECT_THAT(comm, StatusIs(absl::StatusCode::kUnavailable));
          return;
        }
        if (rank == world - 1) {
          (*comm)->Abort();
          return;
        }
        std::thread aborter([&] {
          absl::SleepFor(absl::Microseconds(50 * round));
          (*comm)->Abort();
        });
        std::vector<float> x(1000, 1.0f);
        EXPECT_FALSE((*comm)->AllReduceSum(x.data(), x.size()).ok());
        aborter.join();
      });
    }
    for (auto& t : ranks) t.join();
  }
}

// A peer that stays connected but never joins: the wait gives up at the
// communicator's timeout and says so (DEADLINE_EXCEEDED), where a peer that
// left is UNAVAILABLE (PeerAborts_OthersFailPromptly).
TEST(GlooCommunicator, PeerHangs_DeadlineExceededAtTheTimeout) {
  std::atomic<bool> rank0_done{false};
  RunRanks(
      2,
      [&](int rank, Communicator* comm) {
        if (rank != 0) {
          for (int i = 0; i < 1000 && !rank0_done; ++i) absl::SleepFor(absl::Milliseconds(10));
          return;
        }
        float x = 1;
        const absl::Time start = absl::Now();
        EXPECT_THAT(comm->AllReduceSum(&x, 1),
                    StatusIs(absl::StatusCode::kDeadlineExceeded, testing::HasSubstr("timed out")));
        EXPECT_GE(absl::Now() - start, absl::Milliseconds(500));
        rank0_done = true;
      },
      absl::Milliseconds(500));
}

TEST(GlooCommunicator, Create_PeerNeverComes_UnavailableAfterTimeout) {
  gloo::rendezvous::HashStore store;
  GlooCommunicator::Options options;
  options.rank = 0;
  options.world_size = 2;
  options.timeout = absl::Milliseconds(300);
  EXPECT_THAT(GlooCommunicator::Create(store, options),
              StatusIs(absl::StatusCode::kUnavailable, testing::HasSubstr("rendezvous")));
}

}  // namespace
}  // namespace ddp
