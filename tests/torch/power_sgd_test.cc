// PowerSGD's parts that PyTorch parity rests on (tests/py/ddp_parity_test.py
// compares whole runs with powerSGD_hook): numpy's seeds, the
// orthogonalization, and what an all-reduce through it leaves on 2 ranks.
#include "worker/collective/power_sgd.h"

#include <torch/torch.h>

#include "worker/collective/reducer.h"

#include "gtest/gtest.h"
#include "tests/test_util.h"
#include "tests/torch/ranks.h"

namespace ddp {
namespace {

TEST(PowerSgd, LegacyNumpySeeds_AreRandomStateRandint) {
  // numpy.random.RandomState(0).randint(1_000_000_000), four times.
  LegacyNumpySeeds seeds(0);
  std::vector<uint32_t> got;
  for (int i = 0; i < 4; ++i) got.push_back(seeds.Next());
  EXPECT_EQ(got, (std::vector<uint32_t>{209652396, 398764591, 924231285, 404868288}));
}

TEST(PowerSgd, OrthogonalizeColumns_OrthonormalByGramSchmidtAndByQr) {
  for (int64_t rank : {1, 2, 4}) {
    auto gen = at::detail::createCPUGenerator(rank);
    at::Tensor m = at::randn({3, 20, rank}, gen);
    OrthogonalizeColumns(m);
    at::Tensor gram = at::bmm(m.transpose(1, 2), m);
    EXPECT_TRUE(torch::allclose(gram, at::eye(rank).expand({3, rank, rank}), 1e-5, 1e-5))
        << "rank " << rank << "\n"
        << gram;
  }
}

// Each rank holds the same rank-1 matrix u v^T (recovered exactly by rank-1
// factors) and its own bias; the plain part is averaged exactly. Before the
// start step nothing is compressed; after it, far fewer bytes cross.
TEST(PowerSgd, Reduce_RecoversALowRankAverageAndAveragesTheRest) {
  RunRanks(2, [](int rank, Communicator* comm) {
    PowerSgdOptions options;
    options.rank = 1;
    options.start_iter = 2;
    PowerSgd powersgd(options);
    EXPECT_FALSE(powersgd.active());
    powersgd.StepDone();
    powersgd.StepDone();
    ASSERT_TRUE(powersgd.active());
    const at::Tensor u = at::arange(1, 33, at::kFloat) / 10;
    const at::Tensor v = at::cos(at::arange(0, 48, at::kFloat));
    const at::Tensor matrix = at::outer(u, v);
    const at::Tensor bias = at::full({32}, static_cast<float>(rank + 1));
    at::Tensor grads = at::cat({matrix.flatten(), bias});
    uint64_t wire = 0;
    ASSERT_THAT(powersgd.Reduce(0, grads, {{32, 48}, {32}}, *comm, 2.0f, &wire), IsOk());
    EXPECT_TRUE(torch::allclose(grads.narrow(0, 0, 32 * 48).view({32, 48}), matrix, 1e-4, 1e-5));
    EXPECT_TRUE(torch::equal(grads.narrow(0, 32 * 48, 32), at::full({32}, 1.5f)));
    // The bias, P (32) and Q (48) as float32, against 32 x 48 + 32.
    EXPECT_EQ(wire, (32 + 32 + 48) * sizeof(float));
  });
}

// Alone, as PyTorch's hook: plain steps until the start step, then the
// rank-1 approximation (and far fewer bytes), though nothing crosses a wire.
TEST(PowerSgd, Reducer_AloneStillApproximatesAfterTheStartStep) {
  RunRanks(1, [](int, Communicator* comm) {
    at::Tensor weight = torch::zeros({8, 16}).requires_grad_(true);
    auto gen = at::detail::createCPUGenerator(5);
    const at::Tensor target = at::randn({8, 16}, gen);  // full rank
    Reducer::Options options;
    options.powersgd = PowerSgdOptions{/*rank=*/1, /*start_iter=*/2};
    options.split_tail = false;
    auto reducer = Reducer::Create({{"weight", weight}}, comm, options);
    ASSERT_THAT(reducer, IsOk());
    for (int step = 0; step < 3; ++step) {
      ASSERT_THAT((*reducer)->StartGroup(), IsOk());
      (*reducer)->PrepareBackward(/*sync=*/true);
      (weight * target).sum().backward();
      auto stats = (*reducer)->FinishBackward();
      ASSERT_THAT(stats, IsOk());
      if (step < 2) {
        EXPECT_TRUE(torch::equal(weight.grad(), target)) << "step " << step;
        EXPECT_GE(stats->bytes, 8 * 16 * sizeof(float));
      } else {
        EXPECT_FALSE(torch::allclose(weight.grad(), target));
        EXPECT_EQ(at::linalg_matrix_rank(weight.grad()).item<int64_t>(), 1);
        EXPECT_LT(stats->bytes, 8 * 16 * sizeof(float) / 2);
      }
    }
  });
}

}  // namespace
}  // namespace ddp
