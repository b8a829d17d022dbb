// Fingerprints of a model's parameters: equal on two replicas exactly when
// their parameters agree bit for bit.
#ifndef DDP_WORKER_DIGEST_H_
#define DDP_WORKER_DIGEST_H_

#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "worker/model.h"

namespace ddp {

// 64-bit FNV-1a over the bytes of `tensors`, in order, as 16 hex digits.
// Tensors on another device are copied to the CPU first.
std::string TensorDigest(const std::vector<at::Tensor>& tensors);

// TensorDigest of model.Parameters(), in their registration order.
std::string ParameterDigest(Model& model);

}  // namespace ddp

#endif  // DDP_WORKER_DIGEST_H_
