// Where a worker's training runs: its --device as LibTorch's device, and
// whether this process can use it.
#ifndef DDP_WORKER_DEVICE_PLACEMENT_H_
#define DDP_WORKER_DEVICE_PLACEMENT_H_

#include <c10/core/Device.h>

#include "absl/status/status.h"
#include "common/device.h"

namespace ddp {

// cpu:N is the CPU (N only tells a machine's workers apart); cuda:N the
// GPU of that index.
c10::Device TorchDevice(const Device& device);

// OK for a CPU; for cuda:N, FAILED_PRECONDITION unless this LibTorch has
// CUDA and the machine a GPU of that index, saying which is missing.
absl::Status CheckDeviceUsable(const Device& device);

// For --deterministic: no TF32 in matrix products or convolutions,
// deterministic cuDNN and cuBLAS algorithms, as PyTorch's
// use_deterministic_algorithms(True) with TF32 off. Before CUDA starts.
void UseDeterministicAlgorithms();

}  // namespace ddp

#endif  // DDP_WORKER_DEVICE_PLACEMENT_H_
