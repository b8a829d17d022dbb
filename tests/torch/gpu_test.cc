// Training on cuda:0 against the same training on the CPU: the GPU half of
// issue 22's proof, run by tests/gpu/device_check.sh. Every test skips
// where LibTorch has no CUDA (Debian's); the CPU halves are elsewhere
// (device_placement_test.cc, the reducer's staging tests).
#include <torch/torch.h>

#include "gtest/gtest.h"
#include "tests/test_util.h"
#include "tests/torch/ranks.h"
#include "tests/torch/trainer_harness.h"
#include "worker/device_placement.h"
#include "worker/model.h"
#include "worker/training_state.h"

namespace ddp {
namespace {

const Device kCuda0{Device::Kind::kCuda, 0};

class GpuTraining : public testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA in this LibTorch or machine";
    // The CPU's float32 arithmetic, not TF32's, so the two compare closely.
    at::globalContext().setAllowTF32CuBLAS(false);
    at::globalContext().setAllowTF32CuDNN(false);
  }

  // Trains one generation of `world` ranks on `device` from the same
  // initial weights; rank 0's parameters, on the CPU.
  std::vector<at::Tensor> Train(int world, const Device& device, Backend backend) {
    std::vector<std::unique_ptr<TrainingState>> states(world);
    for (int rank = 0; rank < world; ++rank) {
      auto state = TrainingState::Create(SyntheticJob(rank, world).spec(), device);
      EXPECT_THAT(state, IsOk());
      if (!state.ok()) return {};
      states[rank] = std::move(*state);
    }
    std::vector<Recorder> recorders(world);
    std::atomic<bool> abort{false};
    RunRanks(
        world,
        [&](int rank, Communicator* comm) {
          GenerationControl control;
          control.abort = &abort;
          control.leave = &recorders[rank].leave;
          EXPECT_THAT(TrainGeneration(SyntheticJob(rank, world), states[rank].get(), comm,
                                      &recorders[rank], control),
                      IsOk());
        },
        absl::Seconds(60), backend);
    EXPECT_TRUE(DeviceOf(states[0]->model()) == TorchDevice(device));
    std::vector<at::Tensor> out;
    for (auto& [name, t] : states[0]->model().Parameters()) out.push_back(t.detach().cpu());
    return out;
  }
};

void ExpectClose(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(torch::allclose(a[i], b[i], /*rtol=*/1e-4, /*atol=*/1e-5)) << "parameter " << i;
  }
}

TEST_F(GpuTraining, OneRankOnCuda0_SameWeightsAsOnTheCpu) {
  ExpectClose(Train(1, kCuda0, Backend::kGloo), Train(1, Device{}, Backend::kGloo));
}

// Two ranks on one GPU: NCCL refuses that, so shared memory carries the
// gradients, staged through host memory.
TEST_F(GpuTraining, TwoRanksOnOneGpuOverSharedMemory_SameWeightsAsOnTheCpu) {
  ExpectClose(Train(2, kCuda0, Backend::kShm), Train(2, Device{}, Backend::kShm));
}

// A state encoded on the GPU (what a checkpoint holds) decodes into a CPU
// model, and back, with the same values.
TEST_F(GpuTraining, StateFromTheGpuResumesOnTheCpuAndBack) {
  auto gpu = TrainingState::Create(SyntheticJob(0, 1).spec(), kCuda0);
  auto cpu = TrainingState::Create(SyntheticJob(0, 1).spec(), Device{});
  ASSERT_THAT(gpu, IsOk());
  ASSERT_THAT(cpu, IsOk());
  for (auto& [name, t] : (*gpu)->model().Parameters()) {
    torch::NoGradGuard no_grad;
    t.add_(1.0);
  }
  absl::StatusOr<std::string> bytes = (*gpu)->Encode(1, 1);
  ASSERT_THAT(bytes, IsOk());
  ASSERT_THAT((*cpu)->Decode(*bytes), IsOk());
  auto g = (*gpu)->model().Parameters(), c = (*cpu)->model().Parameters();
  for (size_t i = 0; i < g.size(); ++i) {
    EXPECT_TRUE(c[i].second.is_cpu());
    EXPECT_TRUE(torch::equal(g[i].second.cpu(), c[i].second)) << g[i].first;
  }
  absl::StatusOr<std::string> back = (*cpu)->Encode(1, 1);
  ASSERT_THAT(back, IsOk());
  ASSERT_THAT((*gpu)->Decode(*back), IsOk());
  EXPECT_TRUE((*gpu)->model().Parameters()[0].second.is_cuda());
}

}  // namespace
}  // namespace ddp
