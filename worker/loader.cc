#include "worker/loader.h"

#include <algorithm>

#include <torch/torch.h>

#include "absl/types/span.h"
#include "worker/sample_batches.h"

namespace ddp {

Batch ToDevice(Batch batch, c10::Device device) {
  if (device.is_cuda()) {
    batch.x = batch.x.pin_memory();
    batch.y = batch.y.pin_memory();
  }
  return Batch{batch.x.to(device, /*non_blocking=*/true),
               batch.y.to(device, /*non_blocking=*/true)};
}

int64_t NumBatches(int64_t samples, int64_t batch_size, bool drop_last) {
  return drop_last ? samples / batch_size : (samples + batch_size - 1) / batch_size;
}

BatchLoader::BatchLoader(at::Tensor x, at::Tensor y, std::vector<int64_t> indices,
                         int64_t batch_size, bool drop_last, int64_t skip_batches, size_t depth,
                         c10::Device device)
    : BatchLoader(std::move(x), std::move(y), nullptr, 0, 1, std::move(indices), batch_size,
                  drop_last, skip_batches, depth, device) {}

BatchLoader::BatchLoader(std::shared_ptr<const SampleSource> source, uint64_t epoch, int threads,
                         std::vector<int64_t> indices, int64_t batch_size, bool drop_last,
                         int64_t skip_batches, size_t depth, c10::Device device)
    : BatchLoader(at::Tensor(), at::Tensor(), std::move(source), epoch, threads, std::move(indices),
                  batch_size, drop_last, skip_batches, depth, device) {}

BatchLoader::BatchLoader(at::Tensor x, at::Tensor y, std::shared_ptr<const SampleSource> source,
                         uint64_t epoch, int threads, std::vector<int64_t> indices,
                         int64_t batch_size, bool drop_last, int64_t skip_batches, size_t depth,
                         c10::Device device)
    : x_(std::move(x)),
      y_(std::move(y)),
      source_(std::move(source)),
      epoch_(epoch),
      threads_(std::max(1, threads)),
      indices_(std::move(indices)),
      batch_size_(batch_size),
      num_batches_(NumBatches(static_cast<int64_t>(indices_.size()), batch_size, drop_last)),
      first_batch_(std::min(skip_batches, num_batches_)),
      depth_(depth),
      device_(device) {
  {
    absl::MutexLock lock(&mu_);
    consumed_ = first_batch_;
  }
  thread_ = std::thread([this] { Produce(); });
}

BatchLoader::~BatchLoader() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void BatchLoader::Produce() {
  for (int64_t b = first_batch_; b < num_batches_; ++b) {
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](BatchLoader* l) ABSL_EXCLUSIVE_LOCKS_REQUIRED(l->mu_) {
            return l->stopping_ || l->ready_.size() < l->depth_;
          },
          this));
      if (stopping_) return;
    }
    const int64_t begin = b * batch_size_;
    const int64_t end = std::min<int64_t>(begin + batch_size_, indices_.size());
    Batch batch;
    if (source_) {
      absl::StatusOr<Batch> read =
          ReadSampleBatch(*source_, absl::MakeConstSpan(indices_.data() + begin, end - begin),
                          epoch_, threads_, device_.is_cuda());
      if (!read.ok()) {
        absl::MutexLock lock(&mu_);
        status_ = read.status();
        return;
      }
      batch = *std::move(read);
    } else {
      at::Tensor idx = torch::from_blob(const_cast<int64_t*>(indices_.data() + begin),
                                        {end - begin}, torch::kInt64);
      batch = Batch{x_.index_select(0, idx), y_.index_select(0, idx)};
    }
    if (!device_.is_cpu()) batch = ToDevice(std::move(batch), device_);
    absl::MutexLock lock(&mu_);
    ready_.push_back(std::move(batch));
  }
}

std::optional<Batch> BatchLoader::Next() {
  absl::MutexLock lock(&mu_);
  if (consumed_ >= num_batches_) return std::nullopt;
  mu_.Await(absl::Condition(
      +[](BatchLoader* l)
           ABSL_EXCLUSIVE_LOCKS_REQUIRED(l->mu_) { return !l->ready_.empty() || !l->status_.ok(); },
      this));
  if (ready_.empty()) return std::nullopt;  // status_ says why
  Batch batch = std::move(ready_.front());
  ready_.pop_front();
  ++consumed_;
  return batch;
}

absl::Status BatchLoader::status() const {
  absl::MutexLock lock(&mu_);
  return status_;
}

}  // namespace ddp
