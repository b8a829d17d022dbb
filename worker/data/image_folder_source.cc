#include "worker/data/image_folder_source.h"

#include <utility>

#include "worker/data/image_decode.h"
#include "worker/data/image_sample.h"

namespace ddp {

absl::StatusOr<std::shared_ptr<const ImageFolderSource>> ImageFolderSource::Open(
    const std::string& root, ImagePipeline pipeline, uint64_t seed, uint64_t limit,
    OtherFormats others) {
  if (absl::Status s = ValidatePipeline(pipeline); !s.ok()) return s;
  absl::StatusOr<ImageFolder> folder = ImageFolder::Scan(root, limit, others);
  if (!folder.ok()) return folder.status();
  std::shared_ptr<ImageFolderSource> source(
      new ImageFolderSource(*std::move(folder), std::move(pipeline), seed));
  // The shape from the first image that decodes (with others kept, the
  // first may be one that doesn't); a few tries, not the whole folder.
  constexpr size_t kShapeTries = 64;
  absl::Status first_error = absl::OkStatus();
  const std::vector<ImageSample>& samples = source->folder_.samples();
  for (size_t i = 0; i < samples.size() && i < kShapeTries; ++i) {
    absl::StatusOr<RgbImage> image = ReadImage(samples[i].path, samples[i].size);
    if (image.ok()) {
      source->shape_ = TransformedShape(source->pipeline_, *std::move(image), seed);
      return std::shared_ptr<const ImageFolderSource>(std::move(source));
    }
    if (first_error.ok()) first_error = image.status();
    if (others == OtherFormats::kRefuse) break;
  }
  return first_error;
}

absl::StatusOr<int64_t> ImageFolderSource::Read(int64_t index, uint64_t epoch, float* out) const {
  const ImageSample& sample = folder_.samples().at(static_cast<size_t>(index));
  absl::StatusOr<RgbImage> image = ReadImage(sample.path, sample.size);
  if (!image.ok()) return image.status();
  if (absl::Status s = TransformInto(pipeline_, *std::move(image), seed_, epoch, index, shape_,
                                     sample.path, out);
      !s.ok()) {
    return s;
  }
  return sample.label;
}

absl::Status ImageFolderSource::Check(int64_t index) const {
  const ImageSample& sample = folder_.samples().at(static_cast<size_t>(index));
  return CheckImageFile(sample.path, sample.size);
}

}  // namespace ddp
