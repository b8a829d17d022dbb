// Batches for one epoch, assembled on a prefetch thread so that gathering
// rows overlaps the training step.
#ifndef DDP_WORKER_LOADER_H_
#define DDP_WORKER_LOADER_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <thread>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace ddp {

struct Batch {
  at::Tensor x;
  at::Tensor y;
};

// Number of batches `samples` indices make.
int64_t NumBatches(int64_t samples, int64_t batch_size, bool drop_last);

class BatchLoader {
 public:
  // Rows of (x, y) in the order of `indices`, `batch_size` at a time (the
  // last batch smaller unless `drop_last`), skipping the first
  // `skip_batches`; at most `depth` batches are ready ahead.
  BatchLoader(at::Tensor x, at::Tensor y, std::vector<int64_t> indices, int64_t batch_size,
              bool drop_last, int64_t skip_batches, size_t depth = 4);
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  // The next batch, or nullopt after the last. Called from one thread.
  std::optional<Batch> Next();
  int64_t num_batches() const { return num_batches_; }

 private:
  void Produce();

  const at::Tensor x_, y_;
  const std::vector<int64_t> indices_;
  const int64_t batch_size_;
  const int64_t num_batches_;
  const int64_t first_batch_;
  const size_t depth_;
  std::thread thread_;

  absl::Mutex mu_;
  std::deque<Batch> ready_ ABSL_GUARDED_BY(mu_);
  int64_t consumed_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace ddp

#endif  // DDP_WORKER_LOADER_H_
