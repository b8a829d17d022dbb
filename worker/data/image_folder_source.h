// An image folder as training data read from disk as it is asked for: the
// index (ImageFolder, walked once), the transforms (ImagePipeline), and one
// sample at a time decoded into the caller's buffer. Nothing of the images
// is kept, so memory does not grow with the dataset; many threads may read
// at once.
//
// No LibTorch.
#ifndef DDP_WORKER_DATA_IMAGE_FOLDER_SOURCE_H_
#define DDP_WORKER_DATA_IMAGE_FOLDER_SOURCE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/data/image_folder.h"
#include "worker/data/image_pipeline.h"
#include "worker/data/sample_source.h"

namespace ddp {

class ImageFolderSource : public SampleSource {
 public:
  // Scans `root` (the first `limit` samples when non-zero; `others`: what
  // of images it can't decode) and runs the pipeline on its first image
  // that decodes to learn the samples' shape. INVALID_ARGUMENT naming the
  // folder or file.
  static absl::StatusOr<std::shared_ptr<const ImageFolderSource>> Open(
      const std::string& root, ImagePipeline pipeline, uint64_t seed, uint64_t limit = 0,
      OtherFormats others = OtherFormats::kRefuse);

  size_t size() const override { return folder_.size(); }
  const std::vector<std::string>& classes() const override { return folder_.classes(); }
  const std::vector<int64_t>& sample_shape() const override { return shape_; }
  const ImageFolder& folder() const { return folder_; }

  absl::StatusOr<int64_t> Read(int64_t index, uint64_t epoch, float* out) const override;
  // The file and its header only (CheckImageFile).
  absl::Status Check(int64_t index) const override;

 private:
  ImageFolderSource(ImageFolder folder, ImagePipeline pipeline, uint64_t seed)
      : folder_(std::move(folder)), pipeline_(std::move(pipeline)), seed_(seed) {}

  ImageFolder folder_;
  const ImagePipeline pipeline_;
  const uint64_t seed_;
  std::vector<int64_t> shape_;
};

}  // namespace ddp

#endif  // DDP_WORKER_DATA_IMAGE_FOLDER_SOURCE_H_
