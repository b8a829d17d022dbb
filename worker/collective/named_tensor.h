// A tensor with its qualified name ("fc1.weight"): how the reducer, the
// state codec and the models list parameters and buffers.
#ifndef DDP_WORKER_COLLECTIVE_NAMED_TENSOR_H_
#define DDP_WORKER_COLLECTIVE_NAMED_TENSOR_H_

#include <string>
#include <utility>

#include <ATen/core/Tensor.h>

namespace ddp {

using NamedTensor = std::pair<std::string, at::Tensor>;

}  // namespace ddp

#endif  // DDP_WORKER_COLLECTIVE_NAMED_TENSOR_H_
