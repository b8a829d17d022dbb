// The reducer against a hand-computed DDP average: N ranks as threads,
// real Gloo pairs, gradients compared with the mean of per-rank gradients
// computed without any communication.
#include "worker/collective/reducer.h"

#include <torch/torch.h>

#include "gtest/gtest.h"
#include "tests/test_util.h"
#include "tests/torch/ranks.h"

namespace ddp {
namespace {

using ::testing::ElementsAre;
using ::testing::UnorderedElementsAre;

// A tiny network with a branch some ranks skip and a layer nobody uses.
struct Net {
  std::vector<NamedTensor> params;

  static Net Make(uint64_t seed) {
    torch::manual_seed(seed);
    Net n;
    for (auto [name, shape] :
         std::vector<std::pair<std::string, std::vector<int64_t>>>{{"fc1.weight", {8, 3}},
                                                                   {"fc1.bias", {8}},
                                                                   {"fc2.weight", {2, 8}},
                                                                   {"fc2.bias", {2}},
                                                                   {"branch.weight", {2, 8}},
                                                                   {"unused.weight", {5}}}) {
      n.params.emplace_back(name, torch::randn(shape).requires_grad_(true));
    }
    return n;
  }
  Net Clone() const {
    Net n;
    for (const auto& [name, t] : params) {
      n.params.emplace_back(name, t.detach().clone().requires_grad_(true));
    }
    return n;
  }
  at::Tensor& p(size_t i) { return params[i].second; }

  at::Tensor Loss(const at::Tensor& x, bool use_branch) {
    at::Tensor h = torch::relu(torch::linear(x, p(0), p(1)));
    at::Tensor out = torch::linear(h, p(2), p(3));
    if (use_branch) out = out + torch::linear(h, p(4));
    return out.pow(2).mean();
  }
};

// Its own generator: rank threads must not share torch's global one.
at::Tensor Batch(int rank, int step, int micro = 0) {
  auto gen = at::detail::createCPUGenerator(1000 + 100 * rank + 10 * step + micro);
  return at::randn({4, 3}, gen);
}

// Mean over ranks of each rank's own gradient (zero where a rank did not
// use the parameter); undefined where no rank used it.
std::vector<at::Tensor> ExpectedGrads(const Net& init, int world, int step,
                                      const std::function<bool(int)>& uses_branch,
                                      int micro_batches = 1) {
  std::vector<at::Tensor> sum(init.params.size());
  for (int r = 0; r < world; ++r) {
    Net local = init.Clone();
    for (int m = 0; m < micro_batches; ++m) {
      (local.Loss(Batch(r, step, m), uses_branch(r)) / micro_batches).backward();
    }
    for (size_t i = 0; i < sum.size(); ++i) {
      at::Tensor g = local.p(i).grad();
      if (!g.defined()) continue;
      sum[i] = sum[i].defined() ? sum[i] + g : g.clone();
    }
  }
  for (auto& s : sum) {
    if (s.defined()) s = s / world;
  }
  return sum;
}

void ExpectGradsEqual(Net& net, const std::vector<at::Tensor>& want, int rank) {
  for (size_t i = 0; i < want.size(); ++i) {
    const at::Tensor got = net.p(i).grad();
    if (!want[i].defined()) {
      EXPECT_FALSE(got.defined()) << "rank " << rank << ": " << net.params[i].first
                                  << " should have no gradient";
      continue;
    }
    ASSERT_TRUE(got.defined()) << "rank " << rank << ": " << net.params[i].first;
    EXPECT_TRUE(torch::allclose(got, want[i], 1e-5, 1e-6))
        << "rank " << rank << ": " << net.params[i].first << "\n got " << got << "\n want "
        << want[i];
  }
}

// Each bucket starts once ready, in launch order, one at a time on the
// communication thread; the bytes add up to the step's.
void ExpectSerialTimeline(const std::vector<BucketTiming>& buckets, uint64_t bytes) {
  ASSERT_GT(buckets.size(), 1u);
  uint64_t sum = 0;
  for (size_t b = 0; b < buckets.size(); ++b) {
    const BucketTiming& t = buckets[b];
    EXPECT_GE(t.ready_ms, 0) << "bucket " << b;
    EXPECT_GE(t.started_ms, t.ready_ms) << "bucket " << b << " started before it was ready";
    EXPECT_GE(t.allreduce_ms, 0) << "bucket " << b;
    if (b > 0) {
      const BucketTiming& before = buckets[b - 1];
      // Rounding of the two clock readings aside.
      EXPECT_GE(t.started_ms + 1e-3, before.started_ms + before.allreduce_ms)
          << "bucket " << b << " overlapped bucket " << b - 1;
    }
    sum += t.bytes;
  }
  EXPECT_EQ(sum, bytes);
}

Reducer::Options SmallBuckets() {
  Reducer::Options o;
  o.first_bucket_cap_bytes = 16;  // several buckets even for a tiny net
  o.bucket_cap_bytes = 64;
  return o;
}

// Every reducer behaviour on both CPU communicators, on 2 and 3 ranks.
class ReducerTest : public testing::TestWithParam<std::tuple<Backend, int>> {
 protected:
  int world() const { return std::get<1>(GetParam()); }
  void Run(const std::function<void(int, Communicator*)>& body) {
    RunRanks(world(), body, absl::Seconds(30), std::get<0>(GetParam()));
  }
};

TEST_P(ReducerTest, FinishBackward_GradientsAreTheMeanOverRanks_AcrossRebuild) {
  const int world = this->world();
  const Net init = Net::Make(7);
  auto all_use_branch = [](int) { return true; };
  Run([&](int rank, Communicator* comm) {
    Net net = init.Clone();
    auto reducer = Reducer::Create(net.params, comm, SmallBuckets());
    ASSERT_THAT(reducer, IsOk());
    std::vector<std::vector<size_t>> first_plan = (*reducer)->plan();
    EXPECT_GT(first_plan.size(), 2u);
    for (int step = 0; step < 3; ++step) {
      ASSERT_THAT((*reducer)->StartGroup(), IsOk());
      (*reducer)->PrepareBackward(/*sync=*/true);
      net.Loss(Batch(rank, step), true).backward();
      auto stats = (*reducer)->FinishBackward();
      ASSERT_THAT(stats, IsOk());
      EXPECT_EQ(stats->buckets_reduced, stats->buckets_total);
      ExpectGradsEqual(net, ExpectedGrads(init, world, step, all_use_branch), rank);
      // Gradients live in the buckets: no copy. Besides them, a used-flag
      // per parameter and the two control words.
      EXPECT_EQ(stats->bytes, (8 * 3 + 8 + 16 + 2 + 16 + 5 + 6 + 2) * sizeof(float));
      ExpectSerialTimeline(stats->buckets, stats->bytes);
    }
    // After the first step, buckets follow the real ready order; "unused"
    // never became ready, so it lands last.
    const auto plan = (*reducer)->plan();
    EXPECT_EQ(plan.back().back(), 5u);
  });
}

TEST_P(ReducerTest, UnusedParameters_LocallyUnusedAveragedGloballyUnusedLeftWithoutGrad) {
  const int world = this->world();
  const Net init = Net::Make(11);
  // Only the last rank takes the branch.
  auto branch = [world](int r) { return r == world - 1; };
  Run([&](int rank, Communicator* comm) {
    Net net = init.Clone();
    auto reducer = *Reducer::Create(net.params, comm, SmallBuckets());
    for (int step = 0; step < 2; ++step) {
      ASSERT_THAT(reducer->StartGroup(), IsOk());
      reducer->PrepareBackward(true);
      net.Loss(Batch(rank, step), branch(rank)).backward();
      auto stats = reducer->FinishBackward();
      ASSERT_THAT(stats, IsOk());
      ExpectGradsEqual(net, ExpectedGrads(init, world, step, branch), rank);
      EXPECT_EQ(stats->globally_unused, 1u);
      EXPECT_EQ(stats->unused, branch(rank) ? 1u : 2u);
      if (step == 0) {
        if (branch(rank)) {
          EXPECT_THAT(stats->newly_unused, ElementsAre("unused.weight"));
        } else {
          EXPECT_THAT(stats->newly_unused, UnorderedElementsAre("unused.weight", "branch.weight"));
        }
      } else {
        EXPECT_TRUE(stats->newly_unused.empty());  // reported once
      }
    }
  });
}

TEST_P(ReducerTest, ControlWords_TokensSummedAndOneVoteToLeaveReachesEveryRank) {
  const int world = this->world();
  const Net init = Net::Make(17);
  Run([&](int rank, Communicator* comm) {
    Net net = init.Clone();
    auto reducer = *Reducer::Create(net.params, comm, SmallBuckets());
    for (int step = 0; step < 3; ++step) {
      std::atomic<bool> leave{step == 1 && rank == world - 1};
      // Step 2: one rank believes it completes another step (a torn step).
      const uint32_t token = StepToken(step == 2 && rank == 0 ? 99 : step + 1);
      ASSERT_THAT(reducer->StartGroup(), IsOk());
      reducer->PrepareBackward(true, ControlWords{token, &leave});
      net.Loss(Batch(rank, step), true).backward();
      auto stats = reducer->FinishBackward();
      ASSERT_THAT(stats, IsOk());
      EXPECT_EQ(stats->leave_votes, step == 1 ? 1u : 0u);
      if (step < 2) {
        EXPECT_EQ(stats->token_sum, uint64_t{StepToken(step + 1)} * world);
      } else {
        EXPECT_NE(stats->token_sum, uint64_t{StepToken(3)} * world);
      }
      // Averaging the gradients does not touch the words.
      ExpectGradsEqual(net, ExpectedGrads(init, world, step, [](int) { return true; }), rank);
    }
  });
}

TEST_P(ReducerTest, GradientAccumulation_OnlyTheLastMicroBatchReduces) {
  const int world = this->world();
  const Net init = Net::Make(13);
  auto all = [](int) { return true; };
  Run([&](int rank, Communicator* comm) {
    Net net = init.Clone();
    auto reducer = *Reducer::Create(net.params, comm, SmallBuckets());
    ASSERT_THAT(reducer->StartGroup(), IsOk());
    for (int m = 0; m < 3; ++m) {
      reducer->PrepareBackward(/*sync=*/m == 2);
      (net.Loss(Batch(rank, 0, m), true) / 3).backward();
    }
    ASSERT_THAT(reducer->FinishBackward(), IsOk());
    ExpectGradsEqual(net, ExpectedGrads(init, world, 0, all, 3), rank);
  });
}

TEST_P(ReducerTest, GradientAccumulation_BranchUsedOnlyInANoSyncMicroBatch_AveragedOnEveryRank) {
  const int world = this->world();
  const Net init = Net::Make(19);
  // Rank 0 takes the branch in the first micro-batch only; nobody takes it
  // in the synchronized one. PyTorch would leave rank 0's own gradient there
  // (and none elsewhere): replicas that drift.
  std::vector<at::Tensor> grads(world);  // each rank's branch gradient
  Run([&](int rank, Communicator* comm) {
    Net net = init.Clone();
    auto reducer = *Reducer::Create(net.params, comm, SmallBuckets());
    ASSERT_THAT(reducer->StartGroup(), IsOk());
    for (int m = 0; m < 2; ++m) {
      reducer->PrepareBackward(/*sync=*/m == 1);
      (net.Loss(Batch(rank, 0, m), m == 0 && rank == 0) / 2).backward();
    }
    auto stats = reducer->FinishBackward();
    ASSERT_THAT(stats, IsOk());
    EXPECT_EQ(stats->globally_unused, 1u);  // "unused" only
    // The mean of every rank's accumulated gradient, zeros where a rank had
    // none: the same on every rank.
    std::vector<at::Tensor> want(init.params.size());
    for (int r = 0; r < world; ++r) {
      Net local = init.Clone();
      for (int m = 0; m < 2; ++m) {
        (local.Loss(Batch(r, 0, m), m == 0 && r == 0) / 2).backward();
      }
      for (size_t i = 0; i < want.size(); ++i) {
        at::Tensor g = local.p(i).grad();
        if (g.defined()) want[i] = want[i].defined() ? want[i] + g : g.clone();
      }
    }
    for (auto& w : want) {
      if (w.defined()) w = w / world;
    }
    ASSERT_TRUE(want[4].defined());
    ExpectGradsEqual(net, want, rank);
    grads[rank] = net.p(4).grad().clone();  // its own slot: no lock
  });
  // The replicas take the same step: bit for bit, not only close.
  for (int r = 1; r < world; ++r) {
    EXPECT_TRUE(torch::equal(grads[r], grads[0])) << "rank " << r << " differs from rank 0";
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, ReducerTest,
                         testing::Combine(testing::Values(Backend::kGloo, Backend::kShm),
                                          testing::Values(2, 3)),
                         [](const testing::TestParamInfo<ReducerTest::ParamType>& info) {
                           return BackendName(std::get<0>(info.param)) +
                                  std::to_string(std::get<1>(info.param));
                         });

TEST(Reducer, Create_NonFloatParameter_InvalidArgumentNamingIt) {
  RunRanks(1, [](int, Communicator* comm) {
    std::vector<NamedTensor> params = {
        {"w", torch::zeros({2}, torch::kFloat64).requires_grad_(true)}};
    EXPECT_THAT(Reducer::Create(params, comm, Reducer::Options()),
                StatusIs(absl::StatusCode::kInvalidArgument, testing::HasSubstr("w")));
  });
}

TEST(Reducer, FinishBackward_PeerAborted_ReturnsError) {
  RunRanks(2, [](int rank, Communicator* comm) {
    Net net = Net::Make(3);
    auto reducer = *Reducer::Create(net.params, comm, Reducer::Options());
    ASSERT_THAT(reducer->StartGroup(), IsOk());
    if (rank == 1) {
      comm->Abort();  // this rank leaves; rank 0's all-reduce must not hang
      return;
    }
    reducer->PrepareBackward(true);
    net.Loss(Batch(0, 0), true).backward();
    EXPECT_FALSE(reducer->FinishBackward().ok());
  });
}

}  // namespace
}  // namespace ddp
