// dataset.skip_bad_samples: a source whose bad samples (a corrupt or
// truncated image, a file that vanished or changed) are replaced rather than
// failing the job. The replacement of sample i is the first good one of a
// fixed sequence of indices drawn from i alone, so every rank, every run and
// every replay of a step takes the same sample in its place, and batches
// keep their size (every rank still takes the same number of steps).
//
// No LibTorch.
#ifndef DDP_WORKER_DATA_SKIPPING_SOURCE_H_
#define DDP_WORKER_DATA_SKIPPING_SOURCE_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "worker/data/sample_source.h"

namespace ddp {

class SkippingSource : public SampleSource {
 public:
  // Candidates tried in place of a bad sample before the read fails.
  static constexpr int kMaxReplacements = 16;

  explicit SkippingSource(std::shared_ptr<const SampleSource> inner) : inner_(std::move(inner)) {}

  size_t size() const override { return inner_->size(); }
  const std::vector<std::string>& classes() const override { return inner_->classes(); }
  const std::vector<int64_t>& sample_shape() const override { return inner_->sample_shape(); }

  // The sample, or its replacement's tensor and label. Fails only when the
  // sample and its kMaxReplacements candidates are all bad.
  absl::StatusOr<int64_t> Read(int64_t index, uint64_t epoch, float* out) const override;
  // As Read, with the inner source's Check: OK when the sample or one of
  // its replacements passes.
  absl::Status Check(int64_t index) const override;

  // The `attempt`-th (from 1) candidate to replace sample `index` of `size`.
  static int64_t Replacement(int64_t index, int attempt, size_t size);

  struct Skipped {
    // Reads replaced since the last Take.
    uint64_t replaced = 0;
    // Bad samples found since the last Take (each one's error, each sample
    // once), at most `max_named`; the rest wait for the next Take.
    std::vector<std::string> newly_bad;
  };
  Skipped Take(size_t max_named) const;

 private:
  // Tries sample `index`, then its candidates in turn, until `try_sample`
  // passes one: which attempt it was (0: the sample itself), or the error
  // saying they all failed. `note_bad`: each failure is noted (NoteBad).
  absl::StatusOr<int> FirstGood(int64_t index, absl::FunctionRef<absl::Status(int64_t)> try_sample,
                                bool note_bad) const;
  void NoteBad(int64_t index, const absl::Status& error) const;

  const std::shared_ptr<const SampleSource> inner_;
  mutable absl::Mutex mu_;
  mutable absl::flat_hash_set<int64_t> bad_ ABSL_GUARDED_BY(mu_);
  // Bounded by the dataset's size (each bad sample once), and by
  // kMaxPendingNames.
  mutable std::deque<std::string> pending_names_ ABSL_GUARDED_BY(mu_);
  mutable uint64_t replaced_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ddp

#endif  // DDP_WORKER_DATA_SKIPPING_SOURCE_H_
