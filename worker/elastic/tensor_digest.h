// A fingerprint of tensors' bytes: equal on two replicas exactly when the
// tensors agree bit for bit.
#ifndef DDP_WORKER_ELASTIC_TENSOR_DIGEST_H_
#define DDP_WORKER_ELASTIC_TENSOR_DIGEST_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace ddp {

// 64-bit FNV-1a over the bytes of `tensors`, in order, as 16 hex digits.
// Tensors on another device are copied to the CPU first.
std::string TensorDigest(const std::vector<at::Tensor>& tensors);

// One 64-bit FNV-1a per tensor, so that differing replicas can be told
// apart tensor by tensor; with more than `max_entries` tensors, each entry
// covers a run of consecutive ones (the same runs as DigestEntryNames').
std::vector<uint64_t> TensorDigests(const std::vector<at::Tensor>& tensors, size_t max_entries);

// What each of TensorDigests' entries covers: the tensor's name, or "FIRST
// .. LAST (N tensors)" for a run; each cut to `max_bytes`.
std::vector<std::string> DigestEntryNames(const std::vector<std::string>& names, size_t max_entries,
                                          size_t max_bytes);

}  // namespace ddp

#endif  // DDP_WORKER_ELASTIC_TENSOR_DIGEST_H_
