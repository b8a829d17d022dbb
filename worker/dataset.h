// Training and test data, held in memory as contiguous tensors: x float32
// [N, ...], y int64 class labels [N].
#ifndef DDP_WORKER_DATASET_H_
#define DDP_WORKER_DATASET_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "ddp/v1/job.pb.h"
#include "worker/data/sample_source.h"
#include "worker/data/skipping_source.h"
#include "worker/input_files.h"

namespace ddp {

struct Dataset {
  // In memory; undefined for data read from disk as it is asked for.
  at::Tensor train_x, train_y;
  // Undefined when the dataset has no held-out part (or it is read from disk).
  at::Tensor test_x, test_y;
  // Set instead of the tensors for data read from disk (an image folder,
  // shards): read, decoded and transformed sample by sample
  // (sample_batches.h); SkippingSources with dataset.skip_bad_samples.
  std::shared_ptr<const SampleSource> train_source, test_source;
  int64_t num_classes = 0;

  int64_t train_size() const;
  bool has_test() const { return test_x.defined() || test_source != nullptr; }
  int64_t test_size() const;
  // Shape of one sample, without the batch dimension.
  std::vector<int64_t> sample_shape() const;
  // dataset.skip_bad_samples: what the sources replaced since the last
  // call, and the bad samples they found (at most `max_named` named).
  SkippingSource::Skipped TakeSkipped(size_t max_named) const;
};

// Loads what `spec` names:
//  - "fashion-mnist": the gzip idx files in spec.path, pixels scaled to
//    [0, 1] and normalized with the training set's mean 0.2860 and standard
//    deviation 0.3530, shape [N, 1, 28, 28];
//  - "synthetic": a fixed random problem of the same shape, 10 classes,
//    each a noisy copy of a random prototype, made from `seed`;
//  - "tensors": an (x, y) tuple saved with torch.save (and spec.test_path);
//  - "image-folder": the folders indexed, walked or through their manifests
//    (and each one's first image read to learn the samples' shape); images
//    are read as batches need them;
//  - "shards": ddp-pack's index read; records are read as batches need
//    them.
// INVALID_ARGUMENT names the field and says what is wrong with the file;
// files are read within the limits of data_files.h, through `inputs` (the
// job's pins; null: unpinned). Never throws.
absl::StatusOr<Dataset> LoadDataset(const v1::DatasetSpec& spec, uint64_t seed,
                                    InputFiles* inputs = nullptr);

// LoadDataset, remembered for the life of the process: a worker keeps its
// data across generations and jobs (keyed by the pins too). Thread-safe.
absl::StatusOr<std::shared_ptr<const Dataset>> LoadDatasetCached(const v1::DatasetSpec& spec,
                                                                 uint64_t seed,
                                                                 InputFiles* inputs = nullptr);

}  // namespace ddp

#endif  // DDP_WORKER_DATASET_H_
