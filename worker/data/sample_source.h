// Training data read from disk one sample at a time, as the sampler asks
// for it: an image folder (ImageFolderSource), record shards or an image
// folder's manifest (PackedSource), or either with bad samples skipped
// (SkippingSource). Nothing of the dataset is kept in memory beyond its
// index, so a worker's memory does not grow with the data.
//
// No LibTorch.
#ifndef DDP_WORKER_DATA_SAMPLE_SOURCE_H_
#define DDP_WORKER_DATA_SAMPLE_SOURCE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ddp {

class SampleSource {
 public:
  virtual ~SampleSource() = default;

  virtual size_t size() const = 0;
  // Label i names classes()[i].
  virtual const std::vector<std::string>& classes() const = 0;
  // Every sample's shape ([3, height, width] for images).
  virtual const std::vector<int64_t>& sample_shape() const = 0;
  int64_t sample_floats() const {
    int64_t n = 1;
    for (int64_t d : sample_shape()) n *= d;
    return n;
  }

  // Sample `index` of `epoch` into `out` (sample_floats() floats): its
  // label. INVALID_ARGUMENT naming the file (and record) when it can't be
  // read or decoded, changed since it was pinned, or comes out of another
  // shape than the others. Thread-safe.
  virtual absl::StatusOr<int64_t> Read(int64_t index, uint64_t epoch, float* out) const = 0;
  // What a job's check reads of sample `index`: enough to refuse what Read
  // would, without the cost a crafted sample could make it pay (an image
  // source reads the file and its header, not its pixels). Thread-safe.
  virtual absl::Status Check(int64_t index) const {
    std::vector<float> sample(static_cast<size_t>(sample_floats()));
    return Read(index, 0, sample.data()).status();
  }
};

}  // namespace ddp

#endif  // DDP_WORKER_DATA_SAMPLE_SOURCE_H_
