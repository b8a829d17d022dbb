#include "worker/tensor_digest.h"

#include <cstdint>

#include <ATen/ATen.h>

#include "absl/strings/str_format.h"

namespace ddp {
namespace {

constexpr uint64_t kFnvOffset = 1469598103934665603ull;
constexpr uint64_t kFnvPrime = 1099511628211ull;

}  // namespace

std::string TensorDigest(const std::vector<at::Tensor>& tensors) {
  uint64_t h = kFnvOffset;
  for (const at::Tensor& t : tensors) {
    at::Tensor c = t.to(at::kCPU).contiguous();
    const auto* p = static_cast<const unsigned char*>(c.data_ptr());
    for (size_t i = 0, n = c.nbytes(); i < n; ++i) h = (h ^ p[i]) * kFnvPrime;
  }
  return absl::StrFormat("%016x", h);
}

}  // namespace ddp
