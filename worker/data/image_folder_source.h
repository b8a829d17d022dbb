// An image folder as training data read from disk as it is asked for: the
// index (ImageFolder), the transforms (ImagePipeline), and one sample at a
// time decoded into the caller's buffer. Nothing of the images is kept, so
// memory does not grow with the dataset; many threads may read at once.
//
// No LibTorch.
#ifndef DDP_WORKER_DATA_IMAGE_FOLDER_SOURCE_H_
#define DDP_WORKER_DATA_IMAGE_FOLDER_SOURCE_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/data/image_folder.h"
#include "worker/data/image_pipeline.h"

namespace ddp {

class ImageFolderSource {
 public:
  // Scans `root` (the first `limit` samples when non-zero) and runs the
  // pipeline on its first image to learn the samples' shape.
  // INVALID_ARGUMENT naming the folder or file.
  static absl::StatusOr<std::shared_ptr<const ImageFolderSource>> Open(const std::string& root,
                                                                       ImagePipeline pipeline,
                                                                       uint64_t seed,
                                                                       uint64_t limit = 0);

  size_t size() const { return folder_.size(); }
  const ImageFolder& folder() const { return folder_; }
  // [3, height, width] of every sample.
  std::array<int64_t, 3> sample_shape() const { return shape_; }
  int64_t sample_floats() const { return shape_[0] * shape_[1] * shape_[2]; }

  // Sample `index` of `epoch` into `out` (sample_floats() floats): its
  // label. INVALID_ARGUMENT naming the file when it can't be read or
  // decoded, or comes out of another size than the others. Thread-safe.
  absl::StatusOr<int64_t> Read(int64_t index, uint64_t epoch, float* out) const;

 private:
  ImageFolderSource(ImageFolder folder, ImagePipeline pipeline, uint64_t seed)
      : folder_(std::move(folder)), pipeline_(std::move(pipeline)), seed_(seed) {}

  ImageFolder folder_;
  const ImagePipeline pipeline_;
  const uint64_t seed_;
  std::array<int64_t, 3> shape_ = {3, 0, 0};
};

}  // namespace ddp

#endif  // DDP_WORKER_DATA_IMAGE_FOLDER_SOURCE_H_
