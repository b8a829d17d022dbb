#include "worker/preflight.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/job_kinds.h"
#include "common/job_spec.h"
#include "worker/data_files.h"
#include "worker/dataset.h"
#include "worker/elastic/torch_error.h"
#include "worker/model.h"

namespace ddp {

namespace {

// Samples read when a job is checked: evenly spread over data read from
// disk, so that a folder of the wrong images or shards that don't match
// their index fail the check rather than the job (the rest is read only by
// the workers, as training needs it).
constexpr int64_t kSamplesChecked = 16;

absl::Status CheckSomeSamples(const SampleSource& source, absl::string_view field) {
  const int64_t n = static_cast<int64_t>(source.size());
  for (int64_t k = 0; k < std::min(n, kSamplesChecked); ++k) {
    const int64_t index = k * n / std::min(n, kSamplesChecked);
    // Headers, not pixels, for images: a folder of decompression bombs is
    // refused (or skipped) in milliseconds.
    if (absl::Status s = source.Check(index); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status Preflight(const v1::JobSpec& spec, InputFiles* inputs) {
  std::vector<int64_t> shape = {1, 28, 28};
  int64_t classes = 10;
  const auto& data = spec.dataset();
  const v1::DatasetKind kind = DatasetKindOf(data);
  if (kind == v1::DATASET_KIND_FASHION_MNIST) {
    // The labels are small; reading them proves the folder is there.
    for (const char* file : {"train-labels-idx1-ubyte.gz", "t10k-labels-idx1-ubyte.gz"}) {
      absl::StatusOr<at::Tensor> labels = ReadIdxFile(absl::StrCat(data.path(), "/", file), inputs);
      if (!labels.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(labels.status().message(),
                         " (Fashion-MNIST comes with Debian's dataset-fashion-mnist package)"));
      }
    }
    // The images are pinned too (read and hashed), though not decoded.
    for (const char* file : {"train-images-idx3-ubyte.gz", "t10k-images-idx3-ubyte.gz"}) {
      const std::string path = absl::StrCat(data.path(), "/", file);
      if (absl::Status s = CheckDataFile("dataset.path", path); !s.ok()) return s;
      if (absl::StatusOr<std::string> read = inputs->Read("dataset.path", path, kMaxDataFileBytes);
          !read.ok()) {
        return read.status();
      }
    }
  } else if (kind == v1::DATASET_KIND_TENSORS || kind == v1::DATASET_KIND_IMAGE_FOLDER ||
             kind == v1::DATASET_KIND_SHARDS) {
    absl::StatusOr<Dataset> loaded = LoadDataset(data, spec.seed(), inputs);
    if (!loaded.ok()) return loaded.status();
    for (const auto& [source, field] : {std::pair{loaded->train_source, "dataset.path"},
                                        std::pair{loaded->test_source, "dataset.test_path"}}) {
      if (source == nullptr) continue;
      if (absl::Status s = CheckSomeSamples(*source, field); !s.ok()) return s;
    }
    shape = loaded->sample_shape();
    classes = loaded->num_classes;
  }
  absl::StatusOr<std::unique_ptr<Model>> model =
      MakeModel(spec.model(), shape, classes, spec.seed(), inputs);
  if (!model.ok()) return model.status();
  // At the job's batch sizes, as the workers will run it: a model that
  // behaves at 2 samples may not at 64. (Other sizes, such as an epoch's
  // last partial batch, are left to the confinement.)
  const int64_t train_batch = std::max<int64_t>(2, spec.batch_size());
  const int64_t eval_batch = std::max<int64_t>(2, EvaluationBatchSize(spec));
  absl::Status fits = CheckModelFits(**model, spec.model(), shape, classes, train_batch);
  if (fits.ok() && eval_batch != train_batch) {
    fits = CheckModelFits(**model, spec.model(), shape, classes, eval_batch);
  }
  return fits;
}

}  // namespace

absl::Status PreflightJob(const v1::JobSpec& spec, InputFiles* inputs) {
  InputFiles recorded;
  // LibTorch reports much as exceptions; none may escape into the caller.
  try {
    return Preflight(spec, inputs ? inputs : &recorded);
  } catch (const std::exception& e) {
    return TorchErrorStatus(absl::StatusCode::kInvalidArgument,
                            "can't load the job's model or data", e);
  }
}

}  // namespace ddp
