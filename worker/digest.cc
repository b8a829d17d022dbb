#include "worker/digest.h"

namespace ddp {

std::string ParameterDigest(Model& model) {
  std::vector<at::Tensor> tensors;
  for (auto& [name, t] : model.Parameters()) tensors.push_back(t);
  return TensorDigest(tensors);
}

}  // namespace ddp
