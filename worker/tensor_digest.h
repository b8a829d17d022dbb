// A fingerprint of tensors' bytes: equal on two replicas exactly when the
// tensors agree bit for bit.
#ifndef DDP_WORKER_TENSOR_DIGEST_H_
#define DDP_WORKER_TENSOR_DIGEST_H_

#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace ddp {

// 64-bit FNV-1a over the bytes of `tensors`, in order, as 16 hex digits.
// Tensors on another device are copied to the CPU first.
std::string TensorDigest(const std::vector<at::Tensor>& tensors);

}  // namespace ddp

#endif  // DDP_WORKER_TENSOR_DIGEST_H_
