// One decoded image through a job's transforms into a sample's floats: what
// every image source does once it has the image's bytes.
//
// No LibTorch.
#ifndef DDP_WORKER_DATA_IMAGE_SAMPLE_H_
#define DDP_WORKER_DATA_IMAGE_SAMPLE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/data/image_decode.h"
#include "worker/data/image_pipeline.h"

namespace ddp {

// [3, height, width] of what `pipeline` makes of `image` (the first
// sample's shape: every other must come out the same).
std::vector<int64_t> TransformedShape(const ImagePipeline& pipeline, RgbImage image, uint64_t seed);

// `image` (sample `index` of `epoch`, read from `name`) through `pipeline`
// into `out`. INVALID_ARGUMENT naming `name` when it comes out of another
// shape than `shape`.
absl::Status TransformInto(const ImagePipeline& pipeline, RgbImage image, uint64_t seed,
                           uint64_t epoch, int64_t index, const std::vector<int64_t>& shape,
                           absl::string_view name, float* out);

}  // namespace ddp

#endif  // DDP_WORKER_DATA_IMAGE_SAMPLE_H_
