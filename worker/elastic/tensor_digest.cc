#include "worker/elastic/tensor_digest.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/fnv1a.h"

namespace ddp {
namespace {

uint64_t Fold(uint64_t h, const at::Tensor& t) {
  at::Tensor c = t.to(at::kCPU).contiguous();
  return Fnv1a(h, c.data_ptr(), c.nbytes());
}

// Tensors per entry when `n` share at most `max_entries`.
size_t PerEntry(size_t n, size_t max_entries) {
  return max_entries == 0 ? n : std::max<size_t>(1, (n + max_entries - 1) / max_entries);
}

}  // namespace

std::string TensorDigest(const std::vector<at::Tensor>& tensors) {
  uint64_t h = kFnv1aOffset;
  for (const at::Tensor& t : tensors) h = Fold(h, t);
  return absl::StrFormat("%016x", h);
}

std::vector<uint64_t> TensorDigests(const std::vector<at::Tensor>& tensors, size_t max_entries) {
  const size_t per = PerEntry(tensors.size(), max_entries);
  std::vector<uint64_t> out;
  for (size_t i = 0; i < tensors.size(); i += per) {
    uint64_t h = kFnv1aOffset;
    for (size_t j = i; j < std::min(tensors.size(), i + per); ++j) h = Fold(h, tensors[j]);
    out.push_back(h);
  }
  return out;
}

std::vector<std::string> DigestEntryNames(const std::vector<std::string>& names, size_t max_entries,
                                          size_t max_bytes) {
  const size_t per = PerEntry(names.size(), max_entries);
  std::vector<std::string> out;
  for (size_t i = 0; i < names.size(); i += per) {
    const size_t last = std::min(names.size(), i + per) - 1;
    std::string name =
        last == i ? names[i]
                  : absl::StrCat(names[i], " .. ", names[last], " (", last - i + 1, " tensors)");
    if (name.size() > max_bytes) name.resize(max_bytes);
    out.push_back(std::move(name));
  }
  return out;
}

}  // namespace ddp
