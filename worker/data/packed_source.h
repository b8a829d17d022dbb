// Samples read from what ddp-pack wrote (pack_index.h): record shards, or
// an image folder through its manifest. Each sample is one pread of the
// bytes its index names, checked against the CRC-32 packed with them, then
// decoded and transformed as an image folder's images (encoded-image) or
// used as they are (float32). Every file is held to the size the index
// lists: a few shards are opened once, more files (a manifest's images) as
// they are read.
//
// No LibTorch.
#ifndef DDP_WORKER_DATA_PACKED_SOURCE_H_
#define DDP_WORKER_DATA_PACKED_SOURCE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ddp/v1/pack.pb.h"
#include "worker/data/image_pipeline.h"
#include "worker/data/sample_source.h"

namespace ddp {

class PackedSource : public SampleSource {
 public:
  // `index` (checked by ParsePackIndex) of the files in `folder`; a float32
  // pack takes no transforms. Reads the first sample to learn the shape.
  // INVALID_ARGUMENT naming the file: a shard missing, not a regular file
  // or of another size than packed, the first sample bad.
  static absl::StatusOr<std::shared_ptr<const PackedSource>> Open(v1::PackIndex index,
                                                                  std::string folder,
                                                                  ImagePipeline pipeline,
                                                                  uint64_t seed);
  ~PackedSource() override;

  size_t size() const override { return static_cast<size_t>(index_.record_file_size()); }
  const std::vector<std::string>& classes() const override { return classes_; }
  const std::vector<int64_t>& sample_shape() const override { return shape_; }

  absl::StatusOr<int64_t> Read(int64_t index, uint64_t epoch, float* out) const override;
  // The record; an image's header only (CheckImageHeader).
  absl::Status Check(int64_t index) const override;

 private:
  PackedSource(v1::PackIndex index, std::string folder, ImagePipeline pipeline, uint64_t seed);
  // Record `i`'s bytes, checked; errors name its file (and record).
  absl::StatusOr<std::string> ReadRecord(int64_t i) const;
  std::string FilePath(uint32_t file) const;
  // What an error calls record `i`: its image's path, or its shard and
  // number.
  std::string RecordName(int64_t i) const;

  const v1::PackIndex index_;
  const std::string folder_;
  const ImagePipeline pipeline_;
  const uint64_t seed_;
  const bool image_;
  std::vector<std::string> classes_;
  std::vector<int64_t> shape_;
  // The files, held open when there are few; empty when each is opened
  // as it is read.
  std::vector<int> fds_;
};

}  // namespace ddp

#endif  // DDP_WORKER_DATA_PACKED_SOURCE_H_
