#include <atomic>
#include <numeric>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"
#include "tests/torch/ranks.h"
#ifdef DDP_HAVE_NCCL
#include <cuda_runtime_api.h>

#include "worker/nccl_communicator.h"
#endif

namespace ddp {
namespace {

class GlooCommunicatorTest : public testing::TestWithParam<int> {};

TEST_P(GlooCommunicatorTest, AllReduceSum_EveryRankGetsTheSum) {
  const int world = GetParam();
  for (size_t n : {size_t{1}, size_t{1000}, size_t{1} << 20}) {
    RunRanks(world, [&](int rank, Communicator* comm) {
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

TEST_P(GlooCommunicatorTest, Broadcast_FromAnyRoot_EveryoneGetsRootsBytes) {
  const int world = GetParam();
  const int root = world - 1;
  RunRanks(world, [&](int rank, Communicator* comm) {
    std::vector<int64_t> data(100, rank);
    ASSERT_THAT(comm->Broadcast(data.data(), data.size() * sizeof(int64_t), root), IsOk());
    for (int64_t v : data) ASSERT_EQ(v, root);
  });
}

INSTANTIATE_TEST_SUITE_P(Worlds, GlooCommunicatorTest, testing::Values(2, 3));

TEST(GlooCommunicator, Abort_CollectiveInFlight_FailsPromptlyWithAborted) {
  std::atomic<bool> rank0_done{false};
  RunRanks(2, [&](int rank, Communicator* comm) {
    if (rank == 1) {
      // Stays connected but never joins the collective: a hung peer.
      while (!rank0_done) absl::SleepFor(absl::Milliseconds(10));
      return;
    }
    std::atomic<bool> returned{false};
    std::thread aborter([&] {
      absl::SleepFor(absl::Milliseconds(200));  // let the all-reduce block
      EXPECT_FALSE(returned);
      comm->Abort();
    });
    float x = 1;
    const absl::Time start = absl::Now();
    EXPECT_THAT(comm->AllReduceSum(&x, 1), StatusIs(absl::StatusCode::kAborted));
    returned = true;
    EXPECT_LT(absl::Now() - start, absl::Seconds(10));  // not the 30 s timeout
    aborter.join();
    EXPECT_THAT(comm->AllReduceSum(&x, 1), StatusIs(absl::StatusCode::kAborted));
    rank0_done = true;
  });
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

#ifdef DDP_HAVE_NCCL
TEST(NcclCommunicator, Create_WithoutUsableGpu_FailedPreconditionSaysSo) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0) {
    GTEST_SKIP() << "a CUDA device is present; the device check covers NCCL there";
  }
  NcclCommunicator::Options options;
  options.device = 0;
  // Fails on the device check, before it would touch the store.
  EXPECT_THAT(NcclCommunicator::Create(/*store=*/nullptr, options),
              StatusIs(absl::StatusCode::kFailedPrecondition, testing::HasSubstr("CUDA")));
  EXPECT_THAT(NcclCommunicator::Version(), testing::MatchesRegex("2\\.[0-9]+\\.[0-9]+"));
}
#endif

}  // namespace
}  // namespace ddp
