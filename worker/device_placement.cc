#include "worker/device_placement.h"

#include <ATen/Context.h>
#include <torch/cuda.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace ddp {

c10::Device TorchDevice(const Device& device) {
  if (!device.is_cuda()) return c10::Device(c10::kCPU);
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(device.index));
}

absl::Status CheckDeviceUsable(const Device& device) {
  if (!device.is_cuda()) return absl::OkStatus();
  if (!torch::cuda::is_available()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--device ", device.ToString(),
        ": this worker's LibTorch has no CUDA, or the machine no usable GPU (Debian's libtorch "
        "is CPU-only: build against a CUDA LibTorch, as README's \"GPUs\" says, or use --device "
        "cpu:N)"));
  }
  const size_t count = torch::cuda::device_count();
  if (device.index < 0 || static_cast<size_t>(device.index) >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat("--device ", device.ToString(), ": this machine has ", count,
                     " CUDA device(s), cuda:0 to cuda:", count - 1));
  }
  return absl::OkStatus();
}

void UseDeterministicAlgorithms() {
  // cuBLAS reads this when it starts: deterministic workspaces.
  ::setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  at::Context& context = at::globalContext();
  context.setAllowTF32CuBLAS(false);
  context.setAllowTF32CuDNN(false);
  context.setBenchmarkCuDNN(false);
  context.setDeterministicCuDNN(true);
  context.setDeterministicAlgorithms(true, /*warn_only=*/false);
}

}  // namespace ddp
