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
#include "worker/torch_error.h"

namespace ddp {
namespace {

constexpr double kFashionMean = 0.2860;
constexpr double kFashionStd = 0.3530;

absl::StatusOr<std::string> ReadGzip(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) return absl::NotFoundError(absl::StrCat("can't open ", path));
  std::string data;
  char chunk[1 << 16];
  int n;
  while ((n = gzread(f, chunk, sizeof(chunk))) > 0) data.append(chunk, n);
  const bool failed = n < 0;
  gzclose(f);
  if (failed) return absl::DataLossError(absl::StrCat(path, " is not a readable gzip file"));
  return data;
}

uint32_t BigEndian32(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

absl::StatusOr<Dataset> LoadFashionMnist(const v1::DatasetSpec& spec) {
  const std::string& dir = spec.path();
  Dataset d;
  auto load = [&](const char* images, const char* labels, at::Tensor* x,
                  at::Tensor* y) -> absl::Status {
    absl::StatusOr<at::Tensor> xi = ReadIdxFile(absl::StrCat(dir, "/", images));
    if (!xi.ok()) return xi.status();
    absl::StatusOr<at::Tensor> yi = ReadIdxFile(absl::StrCat(dir, "/", labels));
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

absl::Status LoadTensorPair(const std::string& field, const std::string& path, at::Tensor* x,
                            at::Tensor* y) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(field, ": can't read ", path));
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
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
  *x = items[0].toTensor().to(torch::kFloat32).contiguous();
  *y = items[1].toTensor();
  if (y->dim() != 1 || x->dim() < 2 || x->size(0) != y->size(0) ||
      at::isFloatingType(y->scalar_type())) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", path, " needs x of shape [N, ...] and integer labels y of shape [N]; got x ",
        c10::str(x->sizes()), " and y ", c10::str(y->sizes()), " ",
        std::string(y->dtype().name())));
  }
  *y = y->to(torch::kInt64).contiguous();
  if (y->numel() > 0 && y->min().item<int64_t>() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", path, " has negative labels"));
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<int64_t> Dataset::sample_shape() const {
  auto sizes = train_x.sizes();
  return std::vector<int64_t>(sizes.begin() + 1, sizes.end());
}

absl::StatusOr<at::Tensor> ReadIdxFile(const std::string& path) {
  absl::StatusOr<std::string> raw = ReadGzip(path);
  if (!raw.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("dataset.path: ", raw.status().message()));
  }
  const auto* p = reinterpret_cast<const unsigned char*>(raw->data());
  // Magic: two zero bytes, the type (0x08 = uint8), the number of dimensions.
  if (raw->size() < 4 || p[0] != 0 || p[1] != 0 || p[2] != 0x08 || p[3] < 1 || p[3] > 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("dataset.path: ", path, " is not a uint8 idx file"));
  }
  const int dims = p[3];
  if (raw->size() < 4 + 4u * dims) {
    return absl::InvalidArgumentError(absl::StrCat("dataset.path: ", path, " is truncated"));
  }
  std::vector<int64_t> shape;
  int64_t count = 1;
  for (int i = 0; i < dims; ++i) {
    shape.push_back(BigEndian32(p + 4 + 4 * i));
    count *= shape.back();
  }
  const size_t header = 4 + 4 * dims;
  if (raw->size() != header + static_cast<size_t>(count)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dataset.path: ", path, " holds ", raw->size() - header, " bytes of data, not ", count,
        " for shape [", absl::StrJoin(shape, ", "), "]"));
  }
  at::Tensor t = torch::empty(shape, torch::kUInt8);
  std::memcpy(t.data_ptr(), p + header, count);
  return t;
}

absl::StatusOr<Dataset> LoadDataset(const v1::DatasetSpec& spec, uint64_t seed) {
  absl::StatusOr<Dataset> d;
  if (spec.kind() == "fashion-mnist") {
    d = LoadFashionMnist(spec);
  } else if (spec.kind() == "synthetic") {
    d = MakeSynthetic(spec, seed);
  } else if (spec.kind() == "tensors") {
    Dataset t;
    if (absl::Status s = LoadTensorPair("dataset.path", spec.path(), &t.train_x, &t.train_y);
        !s.ok()) {
      return s;
    }
    if (!spec.test_path().empty()) {
      if (absl::Status s =
              LoadTensorPair("dataset.test_path", spec.test_path(), &t.test_x, &t.test_y);
          !s.ok()) {
        return s;
      }
    }
    int64_t max_label = t.train_y.numel() ? t.train_y.max().item<int64_t>() : 0;
    if (t.test_y.defined() && t.test_y.numel()) {
      max_label = std::max(max_label, t.test_y.max().item<int64_t>());
    }
    t.num_classes = max_label + 1;
    d = std::move(t);
  } else {
    return absl::InvalidArgumentError(absl::StrCat("dataset.kind: unknown \"", spec.kind(), "\""));
  }
  if (!d.ok()) return d;
  if (spec.kind() != "synthetic" && spec.train_size() > 0 &&
      static_cast<int64_t>(spec.train_size()) < d->train_size()) {
    d->train_x = d->train_x.narrow(0, 0, spec.train_size()).contiguous();
    d->train_y = d->train_y.narrow(0, 0, spec.train_size()).contiguous();
  }
  if (d->train_size() == 0) {
    return absl::InvalidArgumentError("dataset: the training set is empty");
  }
  return d;
}

absl::StatusOr<std::shared_ptr<const Dataset>> LoadDatasetCached(const v1::DatasetSpec& spec,
                                                                 uint64_t seed) {
  static absl::Mutex mu(absl::kConstInit);
  static auto* cache ABSL_GUARDED_BY(mu) =
      new std::map<std::string, std::shared_ptr<const Dataset>>();
  const std::string key = absl::StrCat(spec.SerializeAsString(), "/", seed);
  absl::MutexLock lock(&mu);
  auto it = cache->find(key);
  if (it != cache->end()) return it->second;
  absl::StatusOr<Dataset> d = LoadDataset(spec, seed);
  if (!d.ok()) return d.status();
  // One dataset at a time: a new job's data replaces the last one's.
  cache->clear();
  auto shared = std::make_shared<const Dataset>(std::move(*d));
  (*cache)[key] = shared;
  return shared;
}

}  // namespace ddp
