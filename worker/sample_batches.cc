#include "worker/sample_batches.h"

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include <torch/torch.h>

#include "absl/synchronization/mutex.h"

namespace ddp {

absl::StatusOr<Batch> ReadSampleBatch(const SampleSource& source, absl::Span<const int64_t> indices,
                                      uint64_t epoch, int threads, bool pinned) {
  const int64_t n = static_cast<int64_t>(indices.size());
  std::vector<int64_t> shape = {n};
  shape.insert(shape.end(), source.sample_shape().begin(), source.sample_shape().end());
  auto options = torch::TensorOptions().pinned_memory(pinned);
  Batch batch{torch::empty(shape, options.dtype(torch::kFloat32)),
              torch::empty({n}, options.dtype(torch::kInt64))};
  float* x = batch.x.data_ptr<float>();
  int64_t* y = batch.y.data_ptr<int64_t>();
  const int64_t floats = source.sample_floats();
  // Each thread takes the next sample until none is left; the first error
  // stops the others at their next sample.
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  absl::Mutex mu;
  absl::Status error;
  auto work = [&] {
    for (int64_t i = next++; i < n && !failed; i = next++) {
      absl::StatusOr<int64_t> label = source.Read(indices[i], epoch, x + i * floats);
      if (!label.ok()) {
        absl::MutexLock lock(&mu);
        if (!failed.exchange(true)) error = label.status();
        return;
      }
      y[i] = *label;
    }
  };
  std::vector<std::thread> helpers;
  const int extra = std::max(0, std::min<int>(threads, static_cast<int>(n)) - 1);
  for (int t = 0; t < extra; ++t) helpers.emplace_back(work);
  work();
  for (std::thread& t : helpers) t.join();
  if (failed) return error;
  return batch;
}

}  // namespace ddp
