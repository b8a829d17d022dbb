// Batches of data read from disk (a SampleSource: an image folder, shards),
// read, decoded and transformed on several threads into one tensor: what
// the loader and the evaluation use where in-memory data would
// index_select. Also in the public library (ddp::DiskDataset).
#ifndef DDP_WORKER_SAMPLE_BATCHES_H_
#define DDP_WORKER_SAMPLE_BATCHES_H_

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/data/sample_source.h"

namespace ddp {

struct Batch {
  at::Tensor x;
  at::Tensor y;
};

// Samples `indices` of `epoch`, in that order, on `threads` threads (one
// sample each at a time): x [n, sample shape...] float32 (in pinned memory
// when `pinned`), y [n] int64. The first bad sample's error (naming its
// file).
absl::StatusOr<Batch> ReadSampleBatch(const SampleSource& source, absl::Span<const int64_t> indices,
                                      uint64_t epoch, int threads, bool pinned = false);

}  // namespace ddp

#endif  // DDP_WORKER_SAMPLE_BATCHES_H_
