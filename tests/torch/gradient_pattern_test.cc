// DistributedDataParallel's construction (and a rejoin) gives every rank
// rank root's pattern of gradient tensors: a joiner that holds none where
// the others keep zeros would otherwise part from them at the first step
// that leaves that parameter unused everywhere (SGD's momentum moves a
// zero gradient's parameter; the optimizer skips one without a gradient).
#include <torch/torch.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tests/test_util.h"
#include "tests/torch/ranks.h"
#include "worker/api/library_internals.h"

namespace ddp {
namespace {

TEST(GradientPattern, Construction_EveryRankTakesTheRootsPattern) {
  std::vector<std::vector<bool>> defined(2);
  std::vector<std::vector<float>> a_grads(2);
  RunRanks(2, [&](int rank, Communicator* comm) {
    torch::Tensor a = torch::ones({3}).requires_grad_();
    torch::Tensor b = torch::ones({2}).requires_grad_();
    torch::Tensor c = torch::ones({4}).requires_grad_();
    if (rank == 0) {
      a.mutable_grad() = torch::full({3}, 5.0);  // root: a and c have gradients, b none
      c.mutable_grad() = torch::zeros({4});
    } else {
      b.mutable_grad() = torch::ones({2});  // the other way round
    }
    std::unique_ptr<Session> session = LibraryInternals::SessionOver(comm, StepDriver{});
    auto ddp = LibraryInternals::DataParallelOver(*session, {{"a", a}, {"b", b}, {"c", c}}, {},
                                                  DistributedDataParallel::Options{});
    ASSERT_THAT(ddp.status(), IsOk());
    defined[rank] = {a.grad().defined(), b.grad().defined(), c.grad().defined()};
    if (a.grad().defined()) {
      a_grads[rank] =
          std::vector<float>(a.grad().data_ptr<float>(), a.grad().data_ptr<float>() + 3);
    }
  });
  EXPECT_EQ(defined[0], (std::vector<bool>{true, false, true}));
  EXPECT_EQ(defined[1], (std::vector<bool>{true, false, true}));
  EXPECT_EQ(a_grads[0], (std::vector<float>{5, 5, 5})) << "the root's own values stay";
  EXPECT_EQ(a_grads[1], (std::vector<float>{0, 0, 0})) << "a missing gradient arrives as zeros";
}

}  // namespace
}  // namespace ddp
