// A job spec's dataset read from disk (dataset.kind "image-folder" or
// "shards"), as a SampleSource: what the worker's Dataset and the public
// library's ddp::DiskDataset both open, so that a program reads the same
// samples, transformed the same, as a job does.
//
// No LibTorch.
#ifndef DDP_WORKER_DATA_DISK_SOURCE_H_
#define DDP_WORKER_DATA_DISK_SOURCE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ddp/v1/job.pb.h"
#include "worker/data/image_pipeline.h"
#include "worker/data/sample_source.h"

namespace ddp {

// How a source's own inputs are read: the worker's pinned InputFiles, or
// (a program's) plain reads.
struct DiskInputs {
  // An index or manifest's bytes (`field` names it in errors).
  std::function<absl::StatusOr<std::string>(absl::string_view field, const std::string& path)>
      read_index;
  // A folder walked without a manifest: its listing's digest and image
  // count (ImageFolder::ListingDigest), recorded or checked. Null: not
  // pinned.
  std::function<absl::Status(absl::string_view field, const std::string& path, uint64_t images,
                             const std::string& digest)>
      pin_listing;
};

// `steps` of the spec, and its normalize, as the loader runs them.
ImagePipeline PipelineOf(const google::protobuf::RepeatedPtrField<v1::ImageTransform>& steps,
                         const v1::DatasetSpec& spec);

// The training part of `spec` (`test`: its test_path part), with
// skip_bad_samples applied. INVALID_ARGUMENT naming the spec's field.
absl::StatusOr<std::shared_ptr<const SampleSource>> OpenDiskSource(const v1::DatasetSpec& spec,
                                                                   bool test, uint64_t seed,
                                                                   const DiskInputs& inputs);

}  // namespace ddp

#endif  // DDP_WORKER_DATA_DISK_SOURCE_H_
