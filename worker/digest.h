// Fingerprints of a model's parameters: equal on two replicas exactly when
// their parameters agree bit for bit.
#ifndef DDP_WORKER_DIGEST_H_
#define DDP_WORKER_DIGEST_H_

#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "worker/elastic/tensor_digest.h"
#include "worker/model.h"

namespace ddp {

// TensorDigest of model.Parameters(), in their registration order.
std::string ParameterDigest(Model& model);

}  // namespace ddp

#endif  // DDP_WORKER_DIGEST_H_
