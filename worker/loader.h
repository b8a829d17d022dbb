// Batches for one epoch, assembled on a prefetch thread so that gathering
// rows overlaps the training step.
#ifndef DDP_WORKER_LOADER_H_
#define DDP_WORKER_LOADER_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "worker/data/sample_source.h"
#include "worker/sample_batches.h"

namespace ddp {

// `batch` on `device`: through pinned memory, without blocking, for a GPU.
Batch ToDevice(Batch batch, c10::Device device);

// Number of batches `samples` indices make.
int64_t NumBatches(int64_t samples, int64_t batch_size, bool drop_last);

class BatchLoader {
 public:
  // Rows of (x, y) in the order of `indices`, `batch_size` at a time (the
  // last batch smaller unless `drop_last`), skipping the first
  // `skip_batches`; at most `depth` batches are ready ahead, on `device`:
  // for a GPU, gathered into pinned host memory and copied without
  // blocking, so the copy overlaps the step before.
  BatchLoader(at::Tensor x, at::Tensor y, std::vector<int64_t> indices, int64_t batch_size,
              bool drop_last, int64_t skip_batches, size_t depth = 4,
              c10::Device device = c10::kCPU);
  // The same from data read from disk as the batches are made: each batch
  // read and decoded on `threads` threads (sample_batches.h), sample i of
  // `epoch` transformed as (seed, epoch, i) says.
  BatchLoader(std::shared_ptr<const SampleSource> source, uint64_t epoch, int threads,
              std::vector<int64_t> indices, int64_t batch_size, bool drop_last,
              int64_t skip_batches, size_t depth = 4, c10::Device device = c10::kCPU);
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  // The next batch, or nullopt after the last (or when a batch could not be
  // made: status() says why). Called from one thread.
  std::optional<Batch> Next();
  // Why a batch could not be made (a bad image, named); OK otherwise.
  absl::Status status() const;
  int64_t num_batches() const { return num_batches_; }

 private:
  // Both of the above: in-memory rows when `source` is null.
  BatchLoader(at::Tensor x, at::Tensor y, std::shared_ptr<const SampleSource> source,
              uint64_t epoch, int threads, std::vector<int64_t> indices, int64_t batch_size,
              bool drop_last, int64_t skip_batches, size_t depth, c10::Device device);
  void Produce();

  const at::Tensor x_, y_;
  const std::shared_ptr<const SampleSource> source_;
  const uint64_t epoch_ = 0;
  const int threads_ = 1;
  const std::vector<int64_t> indices_;
  const int64_t batch_size_;
  const int64_t num_batches_;
  const int64_t first_batch_;
  const size_t depth_;
  const c10::Device device_;
  std::thread thread_;

  mutable absl::Mutex mu_;
  std::deque<Batch> ready_ ABSL_GUARDED_BY(mu_);
  int64_t consumed_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ddp

#endif  // DDP_WORKER_LOADER_H_
