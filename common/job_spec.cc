#include "common/job_spec.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/fnv1a.h"
#include "common/job_kinds.h"
#include "common/json_keys.h"
#include "common/labels.h"
#include "common/quote.h"
#include "common/torchvision_transforms.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/util/json_util.h"

namespace ddp {
namespace {

constexpr char kFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";

absl::Status FieldError(absl::string_view field, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat("job.", field, ": ", problem));
}

// "unknown <what> "<name>"; expected one of ...", the choices from the
// kind's table (common/job_kinds.h) less `except`.
template <typename Kind>
absl::Status UnknownKind(absl::string_view field, absl::string_view what, const std::string& name,
                         absl::Span<const KindName<Kind>> names, Kind except = Kind{}) {
  std::vector<KindName<Kind>> choices;
  for (const KindName<Kind>& entry : names) {
    if (except == Kind{} || entry.kind != except) choices.push_back(entry);
  }
  return FieldError(field, absl::StrCat("unknown ", what, " ", Quote(name), "; expected one of ",
                                        QuotedNames(absl::MakeConstSpan(choices))));
}

// `x` in [lo, hi]; false for NaN.
bool InRange(double x, double lo, double hi) { return x >= lo && x <= hi; }

absl::Status CheckPath(absl::string_view field, const std::string& path) {
  if (path.size() > kMaxPathBytes) {
    return FieldError(
        field, absl::StrCat("longer than ", kMaxPathBytes, " bytes (got ", path.size(), ")"));
  }
  if (path.find('\0') != std::string::npos) return FieldError(field, "holds a NUL byte");
  return absl::OkStatus();
}

// Train and test sizes of a synthetic dataset: counts and bytes bounded
// before anything multiplies them.
// An image-folder's transforms: torchvision's names and parameters, every
// size within bounds, and (`fixed`) ending with one size for every image.
absl::Status CheckImageTransforms(
    absl::string_view field, const google::protobuf::RepeatedPtrField<v1::ImageTransform>& steps) {
  if (steps.size() > 16) return FieldError(field, "at most 16 transforms");
  for (int i = 0; i < steps.size(); ++i) {
    const v1::ImageTransform& t = steps[i];
    const std::string at = absl::StrCat(field, "[", i, "]");
    const bool sized =
        t.kind() == "Resize" || t.kind() == "CenterCrop" || t.kind() == "RandomResizedCrop";
    if (t.kind() == "Normalize") {
      // What CanonicalTransforms could not move into dataset.normalize.
      return FieldError(at,
                        "Normalize must be the last transform (after ToTensor), and agree "
                        "with dataset.normalize if both are given");
    }
    if (!sized && t.kind() != "RandomHorizontalFlip") {
      return FieldError(absl::StrCat(at, ".kind"),
                        absl::StrCat("unknown transform ", Quote(t.kind()), "; expected one of ",
                                     kSupportedTransforms));
    }
    if (t.mean_size() > 0 || t.std_size() > 0) {
      return FieldError(at, absl::StrCat("mean and std are Normalize's, not ", t.kind(), "'s"));
    }
    if (sized != (t.size_size() == 1 || t.size_size() == 2)) {
      return FieldError(absl::StrCat(at, ".size"),
                        sized ? "one number (a square, or Resize's shorter side) or two "
                                "([height, width])"
                              : "RandomHorizontalFlip takes no size");
    }
    for (uint32_t v : t.size()) {
      if (v < 1 || v > 65536) {
        return FieldError(absl::StrCat(at, ".size"), "each size must be in [1, 65536]");
      }
    }
    const bool crop = t.kind() == "RandomResizedCrop";
    if ((!crop && (t.scale_size() > 0 || t.ratio_size() > 0)) ||
        (t.kind() != "RandomHorizontalFlip" && t.has_p())) {
      return FieldError(at, absl::StrCat("a parameter ", t.kind(), " does not take"));
    }
    if (crop && t.scale_size() > 0 &&
        !(t.scale_size() == 2 && t.scale(0) > 0 && t.scale(0) <= t.scale(1) && t.scale(1) <= 1)) {
      return FieldError(absl::StrCat(at, ".scale"), "[lo, hi] with 0 < lo <= hi <= 1");
    }
    if (crop && t.ratio_size() > 0 &&
        !(t.ratio_size() == 2 && t.ratio(0) > 0 && t.ratio(0) <= t.ratio(1) && t.ratio(1) < 1e6)) {
      return FieldError(absl::StrCat(at, ".ratio"), "[lo, hi] with 0 < lo <= hi");
    }
    if (t.has_p() && !(t.p() >= 0 && t.p() <= 1)) {
      return FieldError(absl::StrCat(at, ".p"), "must be in [0, 1]");
    }
  }
  // The last step that sets a size must set both: a batch is one tensor.
  for (int i = steps.size() - 1; i >= 0; --i) {
    const v1::ImageTransform& t = steps[i];
    if (t.kind() == "RandomHorizontalFlip") continue;
    if (t.kind() == "Resize" && t.size_size() == 1) {
      return FieldError(field,
                        "the transforms must end with one size for every image: after a Resize "
                        "of the shorter side, add a CenterCrop (or Resize to [height, width])");
    }
    break;
  }
  return absl::OkStatus();
}

// Data read from disk (an image folder, shards): their own fields, which
// no other kind takes.
absl::Status CheckDiskDataset(const v1::DatasetSpec& data) {
  const v1::DatasetKind kind = DatasetKindOf(data);
  const bool folder = kind == v1::DATASET_KIND_IMAGE_FOLDER;
  if (!folder && kind != v1::DATASET_KIND_SHARDS) {
    if (data.transforms_size() > 0 || data.test_transforms_size() > 0 || data.has_normalize() ||
        data.loader_threads() > 0 || data.prefetch_batches() > 0 || !data.manifest().empty() ||
        !data.test_manifest().empty() || data.skip_bad_samples()) {
      return FieldError("dataset.transforms",
                        "transforms, test_transforms, normalize, loader_threads, "
                        "prefetch_batches, manifest, test_manifest and skip_bad_samples are for "
                        "dataset.kind \"image-folder\" and \"shards\" only");
    }
    return absl::OkStatus();
  }
  if (data.path().empty()) {
    return FieldError("dataset.path",
                      folder ? "required for dataset.kind \"image-folder\": the folder of class "
                               "folders (ROOT/CLASS/IMAGE.jpg)"
                             : "required for dataset.kind \"shards\": the folder ddp-pack wrote "
                               "(its index.ddp-pack and shards)");
  }
  if (!folder && (!data.manifest().empty() || !data.test_manifest().empty())) {
    return FieldError("dataset.manifest",
                      "shards carry their own index (PATH/index.ddp-pack); manifest and "
                      "test_manifest are for dataset.kind \"image-folder\"");
  }
  if (!data.test_manifest().empty() && data.test_path().empty()) {
    return FieldError("dataset.test_manifest", "is the manifest of dataset.test_path: set both");
  }
  if (absl::Status s = CheckPath("dataset.manifest", data.manifest()); !s.ok()) return s;
  if (absl::Status s = CheckPath("dataset.test_manifest", data.test_manifest()); !s.ok()) return s;
  if (absl::Status s = CheckImageTransforms("dataset.transforms", data.transforms()); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckImageTransforms("dataset.test_transforms", data.test_transforms());
      !s.ok()) {
    return s;
  }
  if (data.has_normalize()) {
    const v1::ImageNormalize& n = data.normalize();
    if (n.mean_size() != 3 || n.std_size() != 3) {
      return FieldError("dataset.normalize", "three means and three stds (R, G, B)");
    }
    for (int c = 0; c < 3; ++c) {
      if (!(std::abs(n.mean(c)) < 1e6) || !(n.std(c) > 0 && n.std(c) < 1e6)) {
        return FieldError("dataset.normalize", "finite means, and stds > 0");
      }
    }
  }
  if (data.loader_threads() > 64 || data.prefetch_batches() > 64) {
    return FieldError("dataset.loader_threads",
                      "loader_threads and prefetch_batches are at most 64");
  }
  return absl::OkStatus();
}

absl::Status CheckSyntheticSizes(const v1::DatasetSpec& data) {
  if (data.train_size() > kMaxSyntheticTrainSize) {
    return FieldError("dataset.train_size", absl::StrCat("at most ", kMaxSyntheticTrainSize,
                                                         " samples for a synthetic dataset (got ",
                                                         data.train_size(), ")"));
  }
  if (data.test_size() > kMaxSyntheticTestSize) {
    return FieldError("dataset.test_size", absl::StrCat("at most ", kMaxSyntheticTestSize,
                                                        " samples for a synthetic dataset (got ",
                                                        data.test_size(), ")"));
  }
  // Both are bounded above, so neither the sum nor the product can wrap.
  const uint64_t bytes = (data.train_size() + data.test_size()) * kSyntheticSampleBytes;
  if (bytes > kMaxSyntheticBytes) {
    return FieldError(
        "dataset.train_size",
        absl::StrCat("train_size + test_size = ", data.train_size() + data.test_size(),
                     " samples of ", kSyntheticSampleBytes, " bytes make ", bytes,
                     " bytes; a synthetic dataset may take at most ", kMaxSyntheticBytes,
                     " bytes (", kMaxSyntheticBytes / kSyntheticSampleBytes, " samples)"));
  }
  return absl::OkStatus();
}

bool ValidName(const std::string& name) {
  if (name.empty() || name.size() > 63 || !absl::ascii_islower(name[0])) return false;
  for (char c : name) {
    if (!absl::ascii_islower(c) && !absl::ascii_isdigit(c) && c != '-') return false;
  }
  return true;
}

}  // namespace

BuildCapabilities ThisBuild() {
  BuildCapabilities build;
#ifdef DDP_TORCH_CUDA
  build.cuda = true;
#endif
  return build;
}

bool IsProgramJob(const v1::JobSpec& spec) {
  return ModelKindOf(spec.model()) == v1::MODEL_KIND_PROGRAM;
}

int64_t EvaluationBatchSize(const v1::JobSpec& spec) {
  return std::max<int64_t>(1,
                           spec.eval_batch_size() > 0 ? spec.eval_batch_size() : spec.batch_size());
}

namespace {

// A program's job: the program owns model, data, optimizer, checkpoints and
// outputs; the coordinator only places its ranks and watches them.
absl::Status ValidateProgramJob(const v1::JobSpec& spec) {
  if (!spec.model().path().empty()) {
    return FieldError("model.path", "not used with model.kind \"program\"");
  }
  if (DatasetKindOf(spec.dataset()) != v1::DATASET_KIND_PROGRAM) {
    return FieldError("dataset.kind",
                      absl::StrCat(Quote(spec.dataset().kind()),
                                   " can't go with model.kind \"program\": the program reads "
                                   "its own data (leave dataset out, or say \"program\")"));
  }
  if (!spec.checkpoint().dir().empty()) {
    return FieldError("checkpoint.dir",
                      "not used with model.kind \"program\": the program saves its own state");
  }
  if (!spec.output_path().empty()) {
    return FieldError("output_path",
                      "not used with model.kind \"program\": the program saves its own model");
  }
  if (BackendOf(spec) == v1::BACKEND_NCCL) {
    return FieldError("backend", "a program's ranks train on the CPU: use auto, gloo or shm");
  }
  if (!spec.compression().empty() && CompressionOf(spec) != v1::COMPRESSION_NONE) {
    return FieldError("compression",
                      "not used with model.kind \"program\": the program chooses its own "
                      "(ddp::DistributedDataParallel::Options::compression)");
  }
  return absl::OkStatus();
}

}  // namespace

v1::JobSpec WithDefaults(v1::JobSpec spec) {
  if (spec.name().empty()) spec.set_name("job");
  auto* model = spec.mutable_model();
  if (model->kind().empty()) model->set_kind("cnn");
  auto* data = spec.mutable_dataset();
  if (data->kind().empty()) {
    data->set_kind(IsProgramJob(spec) ? "program" : "fashion-mnist");
  }
  const v1::DatasetKind data_kind = DatasetKindOf(*data);
  if (data_kind == v1::DATASET_KIND_FASHION_MNIST && data->path().empty()) {
    data->set_path(kFashionMnistDir);
  }
  if (data_kind == v1::DATASET_KIND_SYNTHETIC) {
    if (data->train_size() == 0) data->set_train_size(4096);
    if (data->test_size() == 0) data->set_test_size(1024);
  }
  if (data_kind == v1::DATASET_KIND_IMAGE_FOLDER || data_kind == v1::DATASET_KIND_SHARDS) {
    // A torchvision list's ToTensor and ending Normalize, as the pipeline
    // has them.
    CanonicalTransforms(data);
    if (data->loader_threads() == 0) data->set_loader_threads(2);
    if (data->prefetch_batches() == 0) data->set_prefetch_batches(4);
    if (data->test_transforms_size() == 0) {
      // Evaluation sees the training transforms without their randomness:
      // a random crop becomes the central crop of the image resized.
      for (const v1::ImageTransform& t : data->transforms()) {
        if (t.kind() == "RandomHorizontalFlip") continue;
        if (t.kind() != "RandomResizedCrop") {
          *data->add_test_transforms() = t;
          continue;
        }
        v1::ImageTransform* resize = data->add_test_transforms();
        resize->set_kind("Resize");
        resize->add_size(*std::max_element(t.size().begin(), t.size().end()));
        v1::ImageTransform* center = data->add_test_transforms();
        center->set_kind("CenterCrop");
        *center->mutable_size() = t.size();
      }
    }
  }
  auto* opt = spec.mutable_optimizer();
  if (opt->kind().empty()) opt->set_kind("sgd");
  if (opt->lr() == 0) opt->set_lr(OptimizerKindOf(*opt) == v1::OPTIMIZER_KIND_ADAM ? 0.001 : 0.01);
  if (!opt->has_beta1()) opt->set_beta1(0.9);
  if (!opt->has_beta2()) opt->set_beta2(0.999);
  if (!opt->has_eps()) opt->set_eps(1e-8);
  if (spec.loss().empty()) spec.set_loss("cross_entropy");
  if (spec.batch_size() == 0) spec.set_batch_size(64);
  if (spec.eval_batch_size() == 0) spec.set_eval_batch_size(spec.batch_size());
  if (spec.epochs() == 0) spec.set_epochs(1);
  if (!spec.has_shuffle()) spec.set_shuffle(true);
  if (!spec.has_bucket_cap_mb()) spec.set_bucket_cap_mb(25);
  if (spec.gradient_accumulation_steps() == 0) spec.set_gradient_accumulation_steps(1);
  if (spec.backend().empty()) spec.set_backend("auto");
  if (spec.compression().empty()) spec.set_compression("none");
  if (CompressionOf(spec) == v1::COMPRESSION_POWERSGD) {
    if (!spec.has_powersgd_rank()) spec.set_powersgd_rank(1);
    if (!spec.has_powersgd_start_step()) spec.set_powersgd_start_step(1000);
  }
  if (spec.min_workers() == 0) spec.set_min_workers(1);
  if (spec.max_workers() == 0) spec.set_max_workers(spec.min_workers());
  if (!spec.has_settle_seconds()) spec.set_settle_seconds(2);
  if (!spec.has_evaluate()) spec.set_evaluate(true);
  if (!spec.has_collective_timeout_seconds()) spec.set_collective_timeout_seconds(300);
  if (!spec.has_rejoin_timeout_seconds()) spec.set_rejoin_timeout_seconds(300);
  if (spec.lr_scaling().empty()) spec.set_lr_scaling("keep");
  if (!spec.has_reform_min_interval_seconds()) spec.set_reform_min_interval_seconds(10);
  if (!spec.has_hang_timeout_seconds()) spec.set_hang_timeout_seconds(60);
  if (!spec.has_fault_budget()) spec.set_fault_budget(100);
  auto* checkpoint = spec.mutable_checkpoint();
  if (!checkpoint->dir().empty()) {
    if (checkpoint->keep() == 0) checkpoint->set_keep(3);
    if (checkpoint->every_steps() == 0 && checkpoint->every_seconds() == 0) {
      checkpoint->set_every_steps(1000);
    }
  }
  return spec;
}

namespace {

// The built-in model and data, the optimizer and the loss.
absl::Status ValidateBuiltInTraining(const v1::JobSpec& spec) {
  const auto& model = spec.model();
  const bool torchscript = ModelKindOf(model) == v1::MODEL_KIND_TORCHSCRIPT;
  if (torchscript && model.path().empty()) {
    return FieldError("model.path",
                      "required for model.kind \"torchscript\": the file "
                      "saved with torch.jit.save");
  }
  if (!torchscript && !model.path().empty()) {
    return FieldError("model.path", "only used with model.kind \"torchscript\"");
  }
  if (absl::Status s = CheckPath("model.path", model.path()); !s.ok()) return s;
  const auto& data = spec.dataset();
  const v1::DatasetKind data_kind = DatasetKindOf(data);
  if (data_kind == v1::DATASET_KIND_PROGRAM) {
    return FieldError("dataset.kind",
                      "\"program\" goes with model.kind \"program\" only: a program on the ddp "
                      "library brings its own model and data");
  }
  if (data_kind == v1::DATASET_KIND_UNKNOWN) {
    return UnknownKind("dataset.kind", "dataset", data.kind(), DatasetKindNames(),
                       v1::DATASET_KIND_PROGRAM);
  }
  if (data_kind == v1::DATASET_KIND_TENSORS && data.path().empty()) {
    return FieldError("dataset.path",
                      "required for dataset.kind \"tensors\": an (x, y) "
                      "tuple saved with torch.save");
  }
  if (absl::Status s = CheckPath("dataset.path", data.path()); !s.ok()) return s;
  if (absl::Status s = CheckPath("dataset.test_path", data.test_path()); !s.ok()) return s;
  if (absl::Status s = CheckDiskDataset(data); !s.ok()) return s;
  if (data_kind == v1::DATASET_KIND_SYNTHETIC) {
    if (absl::Status s = CheckSyntheticSizes(data); !s.ok()) return s;
  } else if (data.train_size() > kMaxTrainSize) {
    return FieldError("dataset.train_size",
                      absl::StrCat("at most ", kMaxTrainSize, " (got ", data.train_size(), ")"));
  }
  const auto& opt = spec.optimizer();
  if (OptimizerKindOf(opt) == v1::OPTIMIZER_KIND_UNKNOWN) {
    return UnknownKind("optimizer.kind", "optimizer", opt.kind(), OptimizerKindNames());
  }
  // Every check is written `!(in range)`, so NaN is refused too; the
  // bounds are finite, so infinities are.
  if (!(opt.lr() > 0 && opt.lr() < 1e3)) {
    return FieldError("optimizer.lr", absl::StrCat("must be in (0, 1000) (got ", opt.lr(), ")"));
  }
  if (!(opt.momentum() >= 0 && opt.momentum() < 1)) {
    return FieldError("optimizer.momentum",
                      absl::StrCat("must be in [0, 1) (got ", opt.momentum(), ")"));
  }
  if (opt.nesterov() && opt.momentum() == 0) {
    return FieldError("optimizer.nesterov", "needs a non-zero optimizer.momentum");
  }
  if (!InRange(opt.weight_decay(), 0, 1e3)) {
    return FieldError("optimizer.weight_decay",
                      absl::StrCat("must be in [0, 1000] (got ", opt.weight_decay(), ")"));
  }
  if (!(opt.beta1() >= 0 && opt.beta1() < 1)) {
    return FieldError("optimizer.beta1", absl::StrCat("must be in [0, 1) (got ", opt.beta1(), ")"));
  }
  if (!(opt.beta2() >= 0 && opt.beta2() < 1)) {
    return FieldError("optimizer.beta2", absl::StrCat("must be in [0, 1) (got ", opt.beta2(), ")"));
  }
  if (!(opt.eps() > 0 && opt.eps() <= 1)) {
    return FieldError("optimizer.eps", absl::StrCat("must be in (0, 1] (got ", opt.eps(), ")"));
  }
  if (LossKindOf(spec) == v1::LOSS_KIND_UNKNOWN) {
    return UnknownKind("loss", "loss", spec.loss(), LossKindNames());
  }
  return absl::OkStatus();
}

// Batch sizes, epochs, buckets and accumulation: the shape of a step.
absl::Status ValidateBatching(const v1::JobSpec& spec) {
  if (spec.batch_size() > 65536) {
    return FieldError("batch_size",
                      absl::StrCat("must be at most 65536 (got ", spec.batch_size(), ")"));
  }
  if (spec.eval_batch_size() > 65536) {
    return FieldError("eval_batch_size",
                      absl::StrCat("must be at most 65536 (got ", spec.eval_batch_size(), ")"));
  }
  if (spec.epochs() > 100000) {
    return FieldError("epochs", absl::StrCat("must be at most 100000 (got ", spec.epochs(), ")"));
  }
  if (!(spec.bucket_cap_mb() > 0 && spec.bucket_cap_mb() <= 4096)) {
    return FieldError("bucket_cap_mb",
                      absl::StrCat("must be in (0, 4096] MiB (got ", spec.bucket_cap_mb(), ")"));
  }
  if (spec.gradient_accumulation_steps() > 1024) {
    return FieldError("gradient_accumulation_steps", "must be at most 1024");
  }
  return absl::OkStatus();
}

// How gradients travel: the backend and their compression.
absl::Status ValidateCommunication(const v1::JobSpec& spec) {
  const v1::Backend backend = BackendOf(spec);
  if (backend == v1::BACKEND_UNKNOWN) {
    return UnknownKind("backend", "backend", spec.backend(), BackendNames());
  }
  const v1::Compression compression = CompressionOf(spec);
  if (compression == v1::COMPRESSION_UNKNOWN) {
    return UnknownKind("compression", "compression", spec.compression(), CompressionNames());
  }
  if (compression != v1::COMPRESSION_POWERSGD) {
    if (spec.has_powersgd_rank()) {
      return FieldError("powersgd_rank", "only used with compression \"powersgd\"");
    }
    if (spec.has_powersgd_start_step()) {
      return FieldError("powersgd_start_step", "only used with compression \"powersgd\"");
    }
  } else {
    if (spec.powersgd_rank() < 1 || spec.powersgd_rank() > 1024) {
      return FieldError("powersgd_rank",
                        absl::StrCat("must be in [1, 1024] (got ", spec.powersgd_rank(), ")"));
    }
    if (spec.powersgd_start_step() < 2 || spec.powersgd_start_step() > (uint64_t{1} << 53)) {
      return FieldError("powersgd_start_step",
                        absl::StrCat("must be in [2, 2^53]: at least 2, as PyTorch's "
                                     "start_powerSGD_iter with error feedback (got ",
                                     spec.powersgd_start_step(), ")"));
    }
  }
  return absl::OkStatus();
}

// How the job lives through joins and faults: its world size, its
// timeouts, its lr rule and its fault budget.
absl::Status ValidateElasticity(const v1::JobSpec& spec) {
  if (spec.min_workers() > 65536) {
    return FieldError("min_workers", "must be at most 65536");
  }
  if (spec.max_workers() > 65536) {
    return FieldError("max_workers", "must be at most 65536");
  }
  if (spec.max_workers() < spec.min_workers()) {
    return FieldError("max_workers",
                      absl::StrCat("must be >= min_workers (got ", spec.max_workers(), " < ",
                                   spec.min_workers(), ")"));
  }
  if (absl::Status s = CheckLabels("job.worker_selector",
                                   {spec.worker_selector().begin(), spec.worker_selector().end()});
      !s.ok()) {
    return s;
  }
  if (!(spec.settle_seconds() >= 0 && spec.settle_seconds() <= 3600)) {
    return FieldError("settle_seconds", "must be in [0, 3600]");
  }
  if (spec.threads_per_worker() > 1024) {
    return FieldError("threads_per_worker", "must be at most 1024");
  }
  if (!(spec.collective_timeout_seconds() > 0 && spec.collective_timeout_seconds() <= 86400)) {
    return FieldError("collective_timeout_seconds", "must be in (0, 86400]");
  }
  // `!(x >= lo && x <= hi)` also refuses NaN.
  if (!(spec.rejoin_timeout_seconds() >= 0 && spec.rejoin_timeout_seconds() <= 86400)) {
    return FieldError("rejoin_timeout_seconds", "must be in [0, 86400]");
  }
  if (LrScalingOf(spec) == v1::LR_SCALING_UNKNOWN) {
    return UnknownKind("lr_scaling", "rule", spec.lr_scaling(), LrScalingNames());
  }
  if (!(spec.reform_min_interval_seconds() >= 0 && spec.reform_min_interval_seconds() <= 86400)) {
    return FieldError("reform_min_interval_seconds", "must be in [0, 86400]");
  }
  if (!(spec.hang_timeout_seconds() > 0 && spec.hang_timeout_seconds() <= 86400)) {
    return FieldError("hang_timeout_seconds", "must be in (0, 86400]");
  }
  if (spec.has_eval_timeout_seconds() &&
      !(spec.eval_timeout_seconds() > 0 && spec.eval_timeout_seconds() <= 86400)) {
    return FieldError("eval_timeout_seconds", "must be in (0, 86400]");
  }
  if (spec.fault_budget() > 1000000) return FieldError("fault_budget", "must be at most 1000000");
  return absl::OkStatus();
}

// Where the job writes: its output and its checkpoints.
absl::Status ValidateOutputs(const v1::JobSpec& spec) {
  if (absl::Status s = CheckPath("output_path", spec.output_path()); !s.ok()) return s;
  const auto& checkpoint = spec.checkpoint();
  if (absl::Status s = CheckPath("checkpoint.dir", checkpoint.dir()); !s.ok()) return s;
  if (checkpoint.dir().empty()) {
    if (checkpoint.every_steps() != 0 || checkpoint.every_seconds() != 0 ||
        checkpoint.keep() != 0) {
      return FieldError("checkpoint.dir", "required when any other checkpoint field is set");
    }
  } else {
    if (checkpoint.dir()[0] != '/') {
      return FieldError("checkpoint.dir", absl::StrCat("must be an absolute path (got ",
                                                       Quote(checkpoint.dir()), ")"));
    }
    if (!(checkpoint.every_seconds() >= 0 && checkpoint.every_seconds() <= 86400 * 30)) {
      return FieldError("checkpoint.every_seconds", "must be in [0, 2592000]");
    }
    if (checkpoint.keep() > 1000) return FieldError("checkpoint.keep", "must be at most 1000");
  }
  return absl::OkStatus();
}

}  // namespace

// `build` asks nothing today (see BuildCapabilities); kept for the kinds a
// build may lack again.
absl::Status ValidateJobSpec(const v1::JobSpec& spec, const BuildCapabilities& /*build*/) {
  if (!ValidName(spec.name())) {
    return FieldError("name", absl::StrCat(Quote(spec.name()),
                                           " must be 1-63 characters of a-z, 0-9 and '-', "
                                           "starting with a letter"));
  }
  const auto& model = spec.model();
  if (ModelKindOf(model) == v1::MODEL_KIND_UNKNOWN) {
    return UnknownKind("model.kind", "model", model.kind(), ModelKindNames());
  }
  absl::Status parts =
      IsProgramJob(spec) ? ValidateProgramJob(spec) : ValidateBuiltInTraining(spec);
  if (!parts.ok()) return parts;
  if (absl::Status s = ValidateBatching(spec); !s.ok()) return s;
  if (absl::Status s = ValidateCommunication(spec); !s.ok()) return s;
  if (absl::Status s = ValidateElasticity(spec); !s.ok()) return s;
  return ValidateOutputs(spec);
}

absl::StatusOr<v1::JobSpec> ParseJobSpecJson(absl::string_view json,
                                             const BuildCapabilities& build) {
  if (absl::Status s = CheckNoDuplicateKeys(json); !s.ok()) return s;
  // torchvision's transforms that the pipeline lacks, named, before the
  // parser's "Cannot find field".
  if (absl::Status s = CheckTransformsJson(json); !s.ok()) return s;
  v1::JobSpec spec;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  auto parsed = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(json.data(), json.size()), &spec, options);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("job spec is not a valid ddp.v1.JobSpec in JSON: ",
                     Truncated(parsed.message().as_string(), 4 * kMaxQuotedBytes)));
  }
  spec = WithDefaults(std::move(spec));
  if (absl::Status s = ValidateJobSpec(spec, build); !s.ok()) return s;
  return spec;
}

absl::StatusOr<v1::JobSpec> LoadJobSpecFile(const std::string& path,
                                            const BuildCapabilities& build) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("can't read job file ", path));
  std::stringstream text;
  text << in.rdbuf();
  auto spec = ParseJobSpecJson(text.str(), build);
  if (!spec.ok()) {
    return absl::Status(spec.status().code(), absl::StrCat(path, ": ", spec.status().message()));
  }
  return spec;
}

namespace {

// FNV-1a of the spec's deterministic serialization, in hex.
std::string DigestOf(const v1::JobSpec& spec) {
  std::string bytes;
  google::protobuf::io::StringOutputStream stream(&bytes);
  google::protobuf::io::CodedOutputStream coded(&stream);
  coded.SetSerializationDeterministic(true);
  spec.SerializeToCodedStream(&coded);
  coded.Trim();
  return absl::StrFormat("%016x", Fnv1a(kFnv1aOffset, bytes.data(), bytes.size()));
}

}  // namespace

std::string SpecDigest(const v1::JobSpec& spec) {
  // Only what shapes the training state: two specs that differ in worker
  // counts or timeouts can continue each other's state.
  v1::JobSpec shaping;
  *shaping.mutable_model() = spec.model();
  *shaping.mutable_dataset() = spec.dataset();
  shaping.mutable_optimizer()->set_kind(spec.optimizer().kind());
  shaping.set_seed(spec.seed());
  shaping.set_batch_size(spec.batch_size());
  shaping.set_shuffle(spec.shuffle());
  shaping.set_drop_last(spec.drop_last());
  shaping.set_gradient_accumulation_steps(spec.gradient_accumulation_steps());
  return DigestOf(shaping);
}

std::string SubmissionDigest(const v1::JobSpec& spec) {
  v1::JobSpec submitted = WithDefaults(spec);
  submitted.clear_input_files();
  submitted.clear_write_folders();
  return DigestOf(submitted);
}

v1::JobSpec DefaultJobSpec(uint32_t workers) {
  v1::JobSpec spec;
  spec.set_name("fashion-mnist-cnn");
  spec.mutable_model()->set_kind("cnn");
  spec.mutable_dataset()->set_kind("fashion-mnist");
  // Reaches about 0.89 test accuracy in three epochs of 64 samples per
  // worker, and does so on every run: the seed fixes data order and init.
  spec.mutable_optimizer()->set_kind("adam");
  spec.mutable_optimizer()->set_lr(0.001);
  spec.set_batch_size(64);
  spec.set_epochs(3);
  spec.set_backend("auto");
  spec.set_min_workers(workers);
  spec.set_max_workers(workers);
  return WithDefaults(std::move(spec));
}

}  // namespace ddp
