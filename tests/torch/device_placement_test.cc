// Where training runs. This machine's LibTorch is CPU-only: a GPU is
// refused up front with what to do, and the CPU path stays what it was.
// The GPU half runs in tests/gpu/device_check.sh.
#include "worker/device_placement.h"

#include <torch/torch.h>

#include "gtest/gtest.h"
#include "tests/test_util.h"
#include "tests/torch/trainer_harness.h"
#include "worker/loader.h"
#include "worker/model.h"
#include "worker/training_state.h"

namespace ddp {
namespace {

using ::testing::HasSubstr;

Device Cuda(int index) { return Device{Device::Kind::kCuda, index}; }

TEST(DevicePlacement, TorchDevice_CpuIndexIsTheCpuCudaIndexIsThatGpu) {
  EXPECT_EQ(TorchDevice(Device{Device::Kind::kCpu, 3}), c10::Device(c10::kCPU));
  EXPECT_EQ(TorchDevice(Cuda(2)), c10::Device(c10::kCUDA, 2));
}

TEST(DevicePlacement, CudaOnACpuOnlyLibTorch_FailedPreconditionSaysWhatToDo) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "this LibTorch has CUDA";
  EXPECT_THAT(CheckDeviceUsable(Cuda(0)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       testing::AllOf(HasSubstr("cuda:0"), HasSubstr("no CUDA"),
                                      HasSubstr("--device cpu:N"))));
  EXPECT_THAT(CheckDeviceUsable(Device{}), IsOk());
}

TEST(DevicePlacement, TrainingStateOnAGpuItCannotUse_RefusedBeforeLoadingAnything) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "this LibTorch has CUDA";
  absl::StatusOr<std::unique_ptr<TrainingState>> state =
      TrainingState::Create(SyntheticJob(0, 1).spec(), Cuda(0));
  EXPECT_THAT(state.status(), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("cuda:0")));
}

TEST(DevicePlacement, TrainingStateOnTheCpu_ModelAndOptimizerThere) {
  absl::StatusOr<std::unique_ptr<TrainingState>> state =
      TrainingState::Create(SyntheticJob(0, 1).spec(), Device{Device::Kind::kCpu, 1});
  ASSERT_THAT(state.status(), IsOk());
  EXPECT_TRUE(DeviceOf((*state)->model()).is_cpu());
  EXPECT_EQ((*state)->device().ToString(), "cpu:1");
}

TEST(DevicePlacement, ToDeviceOnTheCpu_SameValues) {
  Batch batch{torch::arange(6, torch::kFloat32).view({3, 2}), torch::tensor({0, 1, 2})};
  Batch moved = ToDevice(batch, c10::kCPU);
  EXPECT_TRUE(torch::equal(moved.x, batch.x));
  EXPECT_TRUE(torch::equal(moved.y, batch.y));
}

}  // namespace
}  // namespace ddp
