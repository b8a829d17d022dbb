// One bucket's collective, on the reducer's communication thread: staged
// through a host buffer when the communicator takes host memory, in
// float32, fp16/bf16 or PowerSGD.
#include <ATen/ops/empty.h>

#include "worker/collective/device_sync.h"
#include "worker/collective/reducer.h"

namespace ddp {

absl::Status Reducer::ReduceBucket(size_t index, float world, uint64_t* wire) {
  Bucket& bucket = buckets_[index];
  if (streams_) streams_->BeforeCollective(index);
  if (stage_) {
    if (!bucket.staged.defined()) {
      // Pinned on CUDA, so that both copies are asynchronous.
      bucket.staged =
          at::empty({bucket.buffer.numel()},
                    at::TensorOptions().dtype(at::kFloat).pinned_memory(bucket.buffer.is_cuda()));
    }
    bucket.staged.copy_(bucket.buffer, /*non_blocking=*/true);
    // The host collective reads host memory: the copy must have landed.
    if (streams_) streams_->SynchronizeComm();
  }
  const at::Tensor& buffer = stage_ ? bucket.staged : bucket.buffer;
  absl::Status s;
  if (powersgd_ && powersgd_->active()) {
    s = ReducePowerSgd(buffer, bucket, index, world, wire);
  } else if (options_.compression) {
    s = ReduceCompressed(buffer, bucket, world);
  } else {
    s = Reduce(buffer, bucket, world);
  }
  // Queued on the communication stream: the step's end waits for it.
  if (stage_ && s.ok()) bucket.buffer.copy_(bucket.staged, /*non_blocking=*/true);
  return s;
}

void Reducer::DeviceBufferReady() {
  // A device collective (NCCL) runs on a stream of its own: what the
  // communication stream queued on the buffer (the wait for backward, the
  // division) must have completed. The communication thread waits, not
  // backward.
  if (streams_ && !stage_) streams_->SynchronizeComm();
}

absl::Status Reducer::Reduce(const at::Tensor& buffer, Bucket& bucket, float world) {
  // Average as DDP does: divide before summing (ATen's vectorized kernel).
  // The control words are summed as they are.
  buffer.narrow(0, 0, buffer.numel() - bucket.control_words).div_(world);
  DeviceBufferReady();
  return comm_->AllReduceSum(buffer.data_ptr<float>(), static_cast<size_t>(buffer.numel()));
}

absl::Status Reducer::ReduceCompressed(const at::Tensor& buffer, Bucket& bucket, float world) {
  // As PyTorch's fp16/bf16 compress hooks: the gradients cast to the 16-bit
  // type, divided by the world in it, summed in it, and cast back.
  at::Tensor grads = buffer.narrow(0, 0, bucket.grad_elements);
  if (!bucket.compressed.defined()) {
    bucket.compressed =
        at::empty({bucket.grad_elements},
                  grads.options().dtype(
                      *options_.compression == HalfType::kFloat16 ? at::kHalf : at::kBFloat16));
  }
  bucket.compressed.copy_(grads).div_(world);
  DeviceBufferReady();
  absl::Status s =
      comm_->AllReduceSumHalf(static_cast<uint16_t*>(bucket.compressed.data_ptr()),
                              static_cast<size_t>(bucket.grad_elements), *options_.compression);
  if (!s.ok()) return s;
  grads.copy_(bucket.compressed);
  return ReduceTail(buffer, bucket, world);
}

absl::Status Reducer::ReducePowerSgd(const at::Tensor& buffer, Bucket& bucket, size_t index,
                                     float world, uint64_t* wire) {
  at::Tensor grads = buffer.narrow(0, 0, bucket.grad_elements);
  absl::Status s = powersgd_->Reduce(index, grads, bucket.shapes, *comm_, world, wire);
  if (!s.ok()) return s;
  *wire += (buffer.numel() - bucket.grad_elements) * sizeof(float);
  return ReduceTail(buffer, bucket, world);
}

absl::Status Reducer::ReduceTail(const at::Tensor& buffer, const Bucket& bucket, float world) {
  // The used flags and control words are counts: they stay exact, in float.
  at::Tensor tail = buffer.narrow(0, bucket.grad_elements, buffer.numel() - bucket.grad_elements);
  tail.narrow(0, 0, tail.numel() - bucket.control_words).div_(world);
  DeviceBufferReady();
  return comm_->AllReduceSum(tail.data_ptr<float>(), static_cast<size_t>(tail.numel()));
}

}  // namespace ddp
