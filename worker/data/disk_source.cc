#include "worker/data/disk_source.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/job_kinds.h"
#include "worker/data/image_folder_source.h"
#include "worker/data/pack_index.h"
#include "worker/data/packed_source.h"
#include "worker/data/skipping_source.h"

namespace ddp {

// The spec's transforms as the loader runs them.
ImagePipeline PipelineOf(const google::protobuf::RepeatedPtrField<v1::ImageTransform>& steps,
                         const v1::DatasetSpec& spec) {
  ImagePipeline p;
  for (const v1::ImageTransform& t : steps) {
    ImageStep step;
    const int first = t.size_size() > 0 ? static_cast<int>(t.size(0)) : 0;
    const int second = t.size_size() > 1 ? static_cast<int>(t.size(1)) : first;
    if (t.kind() == "Resize") {
      step.kind = ImageStep::Kind::kResize;
      step.height = t.size_size() > 1 ? first : 0;
      step.width = t.size_size() > 1 ? second : first;
    } else if (t.kind() == "CenterCrop" || t.kind() == "RandomResizedCrop") {
      step.kind = t.kind() == "CenterCrop" ? ImageStep::Kind::kCenterCrop
                                           : ImageStep::Kind::kRandomResizedCrop;
      step.height = first;
      step.width = second;
      if (t.scale_size() == 2) step.scale = {t.scale(0), t.scale(1)};
      if (t.ratio_size() == 2) step.ratio = {t.ratio(0), t.ratio(1)};
    } else {
      step.kind = ImageStep::Kind::kRandomHorizontalFlip;
      if (t.has_p()) step.p = t.p();
    }
    p.steps.push_back(step);
  }
  if (spec.has_normalize() && spec.normalize().mean_size() == 3 &&
      spec.normalize().std_size() == 3) {
    Normalization n;
    for (int c = 0; c < 3; ++c) {
      n.mean[c] = spec.normalize().mean(c);
      n.std[c] = spec.normalize().std(c);
    }
    p.normalize = n;
  }
  return p;
}

namespace {

// An image folder walked, pinned by its listing where `inputs` pins.
absl::StatusOr<std::shared_ptr<const SampleSource>> OpenWalkedFolder(
    absl::string_view field, const std::string& path, ImagePipeline pipeline, uint64_t seed,
    uint64_t limit, OtherFormats others, const DiskInputs& inputs) {
  absl::StatusOr<std::shared_ptr<const ImageFolderSource>> folder =
      ImageFolderSource::Open(path, std::move(pipeline), seed, limit, others);
  if (!folder.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", folder.status().message()));
  }
  if (inputs.pin_listing) {
    const ImageFolder& listed = (*folder)->folder();
    if (absl::Status s = inputs.pin_listing(field, path, listed.size(), listed.ListingDigest(path));
        !s.ok()) {
      return s;
    }
  }
  return std::shared_ptr<const SampleSource>(*std::move(folder));
}

// Shards (`manifest` empty: their index is in `path`) or an image folder
// through its manifest; the index read (pinned) through `inputs`.
absl::StatusOr<std::shared_ptr<const SampleSource>> OpenPacked(
    absl::string_view field, const std::string& path, const std::string& manifest,
    ImagePipeline pipeline, uint64_t seed, uint64_t limit, const DiskInputs& inputs) {
  const bool shards = manifest.empty();
  const std::string index_path = shards ? absl::StrCat(path, "/", kPackIndexName) : manifest;
  const std::string index_field =
      shards ? std::string(field)
             : (field == "dataset.path" ? "dataset.manifest" : "dataset.test_manifest");
  absl::StatusOr<std::string> bytes = inputs.read_index(index_field, index_path);
  if (!bytes.ok()) return bytes.status();
  absl::StatusOr<v1::PackIndex> index = ParsePackIndex(*bytes, index_path, limit);
  if (!index.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(index_field, ": ", index.status().message()));
  }
  if (!shards && index->payload() != kPayloadImage) {
    return absl::InvalidArgumentError(
        absl::StrCat(index_field, ": ", index_path,
                     " is a pack of float32 samples, not an image folder's manifest (use "
                     "dataset.kind \"shards\" for it)"));
  }
  absl::StatusOr<std::shared_ptr<const PackedSource>> packed =
      PackedSource::Open(*std::move(index), path, std::move(pipeline), seed);
  if (!packed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", packed.status().message()));
  }
  return std::shared_ptr<const SampleSource>(*std::move(packed));
}

// One part (training or test) of a dataset read from disk; `field` names
// the spec's path field. Errors are INVALID_ARGUMENT naming the field.
absl::StatusOr<std::shared_ptr<const SampleSource>> OpenDiskPart(
    const v1::DatasetSpec& spec, absl::string_view field, const std::string& path,
    const std::string& manifest, ImagePipeline pipeline, uint64_t seed, uint64_t limit,
    const DiskInputs& inputs) {
  const bool walked = DatasetKindOf(spec) == v1::DATASET_KIND_IMAGE_FOLDER && manifest.empty();
  absl::StatusOr<std::shared_ptr<const SampleSource>> source =
      walked ? OpenWalkedFolder(
                   field, path, std::move(pipeline), seed, limit,
                   // Images it can't decode are bad samples, replaced, when the
                   // job skips bad ones.
                   spec.skip_bad_samples() ? OtherFormats::kKeep : OtherFormats::kRefuse, inputs)
             : OpenPacked(field, path, manifest, std::move(pipeline), seed, limit, inputs);
  if (!source.ok()) return source.status();  // each names its field
  if (spec.skip_bad_samples()) return std::make_shared<const SkippingSource>(*std::move(source));
  return source;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const SampleSource>> OpenDiskSource(const v1::DatasetSpec& spec,
                                                                   bool test, uint64_t seed,
                                                                   const DiskInputs& inputs) {
  if (test) {
    return OpenDiskPart(spec, "dataset.test_path", spec.test_path(), spec.test_manifest(),
                        PipelineOf(spec.test_transforms(), spec), seed, 0, inputs);
  }
  return OpenDiskPart(spec, "dataset.path", spec.path(), spec.manifest(),
                      PipelineOf(spec.transforms(), spec), seed, spec.train_size(), inputs);
}

}  // namespace ddp
