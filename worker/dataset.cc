#include "worker/dataset.h"

#include <zlib.h>

#include <fstream>
#include <map>
#include <sstream>

#include <torch/serialize.h>
#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/job_kinds.h"
#include "worker/data/disk_source.h"
#include "worker/data_files.h"
#include "worker/elastic/torch_error.h"

namespace ddp {
namespace {

constexpr double kFashionMean = 0.2860;
constexpr double kFashionStd = 0.3530;
// An index of 50 M samples is about 1.5 GB.
constexpr uint64_t kMaxPackIndexBytes = uint64_t{2000} << 20;

absl::StatusOr<Dataset> LoadFashionMnist(const v1::DatasetSpec& spec, InputFiles* inputs) {
  const std::string& dir = spec.path();
  Dataset d;
  auto load = [&](const char* images, const char* labels, at::Tensor* x,
                  at::Tensor* y) -> absl::Status {
    absl::StatusOr<at::Tensor> xi = ReadIdxFile(absl::StrCat(dir, "/", images), inputs);
    if (!xi.ok()) return xi.status();
    absl::StatusOr<at::Tensor> yi = ReadIdxFile(absl::StrCat(dir, "/", labels), inputs);
    if (!yi.ok()) return yi.status();
    if (xi->dim() != 3 || yi->dim() != 1 || xi->size(0) != yi->size(0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("dataset.path: ", images, " and ", labels, " in ", dir, " don't match"));
    }
    *x = ((xi->to(torch::kFloat32) / 255.0 - kFashionMean) / kFashionStd).unsqueeze(1);
    *y = yi->to(torch::kInt64);
    return absl::OkStatus();
  };
  if (absl::Status s =
          load("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", &d.train_x, &d.train_y);
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          load("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz", &d.test_x, &d.test_y);
      !s.ok()) {
    return s;
  }
  d.num_classes = 10;
  return d;
}

Dataset MakeSynthetic(const v1::DatasetSpec& spec, uint64_t seed) {
  torch::NoGradGuard no_grad;
  auto gen = at::detail::createCPUGenerator(seed);
  const int64_t n = static_cast<int64_t>(spec.train_size() + spec.test_size());
  // Ten noisy prototypes: learnable from a few hundred samples, not trivial.
  at::Tensor prototypes = at::randn({10, 1, 28, 28}, gen) * 0.3;
  at::Tensor y = at::randint(10, {n}, gen);
  at::Tensor x = prototypes.index_select(0, y) + at::randn({n, 1, 28, 28}, gen);
  const int64_t n_train = static_cast<int64_t>(spec.train_size());
  Dataset d;
  d.train_x = x.narrow(0, 0, n_train).contiguous();
  d.train_y = y.narrow(0, 0, n_train).contiguous();
  d.test_x = x.narrow(0, n_train, n - n_train).contiguous();
  d.test_y = y.narrow(0, n_train, n - n_train).contiguous();
  d.num_classes = 10;
  return d;
}

absl::Status LoadTensorPair(const std::string& field, const std::string& path, InputFiles* inputs,
                            at::Tensor* x, at::Tensor* y) {
  if (absl::Status s = CheckDataFile(field, path); !s.ok()) return s;
  absl::StatusOr<std::string> read = inputs->Read(field, path, kMaxDataFileBytes);
  if (!read.ok()) return read.status();
  std::vector<char> bytes(read->begin(), read->end());
  *read = std::string();
  c10::IValue value;
  try {
    value = torch::pickle_load(bytes);
  } catch (const std::exception& e) {
    return TorchErrorStatus(absl::StatusCode::kInvalidArgument,
                            absl::StrCat(field, ": ", path, " is not a file saved with torch.save"),
                            e);
  }
  std::vector<c10::IValue> items;
  if (value.isTuple()) {
    items = value.toTupleRef().elements().vec();
  } else if (value.isList()) {
    items = value.toListRef().vec();
  }
  if (items.size() != 2 || !items[0].isTensor() || !items[1].isTensor()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", path, " must hold an (x, y) tuple of two tensors"));
  }
  // Shapes, sizes and labels first: nothing is converted (allocated) for
  // a file that claims more than it holds.
  if (absl::Status s = CheckTensorPair(field, path, items[0].toTensor(), items[1].toTensor());
      !s.ok()) {
    return s;
  }
  *x = items[0].toTensor().to(torch::kFloat32).contiguous();
  *y = items[1].toTensor().to(torch::kInt64).contiguous();
  return absl::OkStatus();
}

// An (x, y) pair saved with torch.save, and its held-out pair if named.
absl::StatusOr<Dataset> LoadTensors(const v1::DatasetSpec& spec, InputFiles* inputs) {
  Dataset t;
  if (absl::Status s = LoadTensorPair("dataset.path", spec.path(), inputs, &t.train_x, &t.train_y);
      !s.ok()) {
    return s;
  }
  if (!spec.test_path().empty()) {
    if (absl::Status s =
            LoadTensorPair("dataset.test_path", spec.test_path(), inputs, &t.test_x, &t.test_y);
        !s.ok()) {
      return s;
    }
  }
  int64_t max_label = t.train_y.numel() ? t.train_y.max().item<int64_t>() : 0;
  if (t.test_y.defined() && t.test_y.numel()) {
    max_label = std::max(max_label, t.test_y.max().item<int64_t>());
  }
  t.num_classes = max_label + 1;
  return t;
}

absl::StatusOr<Dataset> LoadFromDisk(const v1::DatasetSpec& spec, uint64_t seed,
                                     InputFiles* inputs) {
  Dataset d;
  DiskInputs disk;
  disk.read_index = [inputs](absl::string_view field, const std::string& path) {
    return inputs->Read(field, path, kMaxPackIndexBytes);
  };
  disk.pin_listing = [inputs](absl::string_view field, const std::string& path, uint64_t images,
                              const std::string& digest) {
    return inputs->PinListing(field, path, images, digest);
  };
  absl::StatusOr<std::shared_ptr<const SampleSource>> train =
      OpenDiskSource(spec, /*test=*/false, seed, disk);
  if (!train.ok()) return train.status();
  d.train_source = *train;
  d.num_classes = static_cast<int64_t>(d.train_source->classes().size());
  if (!spec.test_path().empty()) {
    absl::StatusOr<std::shared_ptr<const SampleSource>> test =
        OpenDiskSource(spec, /*test=*/true, seed, disk);
    if (!test.ok()) return test.status();
    if ((*test)->classes() != d.train_source->classes()) {
      return absl::InvalidArgumentError(
          absl::StrCat("dataset.test_path: its classes are not those of dataset.path (",
                       (*test)->classes().size(), " and ", d.num_classes,
                       " classes): label i must name the same class in both"));
    }
    if ((*test)->sample_shape() != d.train_source->sample_shape()) {
      return absl::InvalidArgumentError(
          "dataset.test_transforms: evaluation samples come out of another shape than "
          "training's");
    }
    d.test_source = *test;
  }
  return d;
}

absl::StatusOr<Dataset> LoadDatasetUnguarded(const v1::DatasetSpec& spec, uint64_t seed,
                                             InputFiles* inputs) {
  absl::StatusOr<Dataset> d;
  const v1::DatasetKind kind = DatasetKindOf(spec);
  switch (kind) {
    case v1::DATASET_KIND_FASHION_MNIST:
      d = LoadFashionMnist(spec, inputs);
      break;
    case v1::DATASET_KIND_SYNTHETIC:
      d = MakeSynthetic(spec, seed);
      break;
    case v1::DATASET_KIND_TENSORS:
      d = LoadTensors(spec, inputs);
      break;
    case v1::DATASET_KIND_IMAGE_FOLDER:  // their own train_size limit
    case v1::DATASET_KIND_SHARDS:
      d = LoadFromDisk(spec, seed, inputs);
      break;
    case v1::DATASET_KIND_PROGRAM:  // a program reads its own
    case v1::DATASET_KIND_UNKNOWN:
      return absl::InvalidArgumentError(
          absl::StrCat("dataset.kind: unknown \"", spec.kind(), "\""));
  }
  if (!d.ok()) return d;
  if (!d->train_source && kind != v1::DATASET_KIND_SYNTHETIC && spec.train_size() > 0 &&
      static_cast<int64_t>(spec.train_size()) < d->train_size()) {
    d->train_x = d->train_x.narrow(0, 0, spec.train_size()).contiguous();
    d->train_y = d->train_y.narrow(0, 0, spec.train_size()).contiguous();
  }
  if (d->train_size() == 0) {
    return absl::InvalidArgumentError("dataset: the training set is empty");
  }
  return d;
}

}  // namespace

int64_t Dataset::train_size() const {
  return train_source ? static_cast<int64_t>(train_source->size()) : train_x.size(0);
}

int64_t Dataset::test_size() const {
  if (test_source) return static_cast<int64_t>(test_source->size());
  return test_x.defined() ? test_x.size(0) : 0;
}

std::vector<int64_t> Dataset::sample_shape() const {
  if (train_source) return train_source->sample_shape();
  auto sizes = train_x.sizes();
  return std::vector<int64_t>(sizes.begin() + 1, sizes.end());
}

SkippingSource::Skipped Dataset::TakeSkipped(size_t max_named) const {
  SkippingSource::Skipped all;
  for (const auto& source : {train_source, test_source}) {
    const auto* skipping = dynamic_cast<const SkippingSource*>(source.get());
    if (skipping == nullptr) continue;
    SkippingSource::Skipped taken = skipping->Take(max_named - all.newly_bad.size());
    all.replaced += taken.replaced;
    for (std::string& bad : taken.newly_bad) all.newly_bad.push_back(std::move(bad));
  }
  return all;
}

absl::StatusOr<Dataset> LoadDataset(const v1::DatasetSpec& spec, uint64_t seed,
                                    InputFiles* inputs) {
  InputFiles unpinned;
  // LibTorch reports much as exceptions (memory running out among them);
  // none may escape into a worker's thread or a check.
  try {
    return LoadDatasetUnguarded(spec, seed, inputs ? inputs : &unpinned);
  } catch (const std::exception& e) {
    return TorchErrorStatus(absl::StatusCode::kInvalidArgument, "dataset: can't load it", e);
  }
}

absl::StatusOr<std::shared_ptr<const Dataset>> LoadDatasetCached(const v1::DatasetSpec& spec,
                                                                 uint64_t seed,
                                                                 InputFiles* inputs) {
  static absl::Mutex mu(absl::kConstInit);
  static auto* cache ABSL_GUARDED_BY(mu) =
      new std::map<std::string, std::shared_ptr<const Dataset>>();
  // The pins too: a file rewritten between two jobs is another dataset.
  std::string key = absl::StrCat(spec.SerializeAsString(), "/", seed);
  if (inputs != nullptr) {
    for (const v1::InputFile& pin : inputs->Recorded()) absl::StrAppend(&key, "/", pin.sha256());
  }
  absl::MutexLock lock(&mu);
  auto it = cache->find(key);
  if (it != cache->end()) return it->second;
  absl::StatusOr<Dataset> d = LoadDataset(spec, seed, inputs);
  if (!d.ok()) return d.status();
  // One dataset at a time: a new job's data replaces the last one's.
  cache->clear();
  auto shared = std::make_shared<const Dataset>(std::move(*d));
  (*cache)[key] = shared;
  return shared;
}

}  // namespace ddp
