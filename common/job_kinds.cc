#include "common/job_kinds.h"

namespace ddp {
namespace {

constexpr KindName<v1::ModelKind> kModelKinds[] = {
    {v1::MODEL_KIND_MLP, "mlp"},           {v1::MODEL_KIND_CNN, "cnn"},
    {v1::MODEL_KIND_RESNET18, "resnet18"}, {v1::MODEL_KIND_TORCHSCRIPT, "torchscript"},
    {v1::MODEL_KIND_PROGRAM, "program"},
};
constexpr KindName<v1::DatasetKind> kDatasetKinds[] = {
    {v1::DATASET_KIND_FASHION_MNIST, "fashion-mnist"},
    {v1::DATASET_KIND_SYNTHETIC, "synthetic"},
    {v1::DATASET_KIND_TENSORS, "tensors"},
    {v1::DATASET_KIND_PROGRAM, "program"},
    {v1::DATASET_KIND_IMAGE_FOLDER, "image-folder"},
    {v1::DATASET_KIND_SHARDS, "shards"},
};
constexpr KindName<v1::OptimizerKind> kOptimizerKinds[] = {
    {v1::OPTIMIZER_KIND_SGD, "sgd"},
    {v1::OPTIMIZER_KIND_ADAM, "adam"},
};
constexpr KindName<v1::LossKind> kLossKinds[] = {
    {v1::LOSS_KIND_CROSS_ENTROPY, "cross_entropy"},
    {v1::LOSS_KIND_NLL, "nll"},
};
constexpr KindName<v1::LrScaling> kLrScalings[] = {
    {v1::LR_SCALING_KEEP, "keep"},
    {v1::LR_SCALING_LINEAR, "linear"},
};
constexpr KindName<v1::Backend> kBackends[] = {
    {v1::BACKEND_GLOO, "gloo"},
    {v1::BACKEND_SHM, "shm"},
    {v1::BACKEND_NCCL, "nccl"},
    {v1::BACKEND_AUTO, "auto"},
};
constexpr KindName<v1::Compression> kCompressions[] = {
    {v1::COMPRESSION_NONE, "none"},
    {v1::COMPRESSION_FP16, "fp16"},
    {v1::COMPRESSION_BF16, "bf16"},
    {v1::COMPRESSION_POWERSGD, "powersgd"},
};

}  // namespace

absl::Span<const KindName<v1::ModelKind>> ModelKindNames() { return kModelKinds; }
absl::Span<const KindName<v1::DatasetKind>> DatasetKindNames() { return kDatasetKinds; }
absl::Span<const KindName<v1::OptimizerKind>> OptimizerKindNames() { return kOptimizerKinds; }
absl::Span<const KindName<v1::LossKind>> LossKindNames() { return kLossKinds; }
absl::Span<const KindName<v1::LrScaling>> LrScalingNames() { return kLrScalings; }
absl::Span<const KindName<v1::Backend>> BackendNames() { return kBackends; }
absl::Span<const KindName<v1::Compression>> CompressionNames() { return kCompressions; }

v1::ModelKind ModelKindOf(const v1::ModelSpec& model) {
  return KindNamed(ModelKindNames(), model.kind());
}
v1::DatasetKind DatasetKindOf(const v1::DatasetSpec& dataset) {
  return KindNamed(DatasetKindNames(), dataset.kind());
}
v1::OptimizerKind OptimizerKindOf(const v1::OptimizerSpec& optimizer) {
  return KindNamed(OptimizerKindNames(), optimizer.kind());
}
v1::LossKind LossKindOf(const v1::JobSpec& spec) { return KindNamed(LossKindNames(), spec.loss()); }
v1::LrScaling LrScalingOf(const v1::JobSpec& spec) {
  return KindNamed(LrScalingNames(), spec.lr_scaling());
}
v1::Backend BackendOf(const v1::JobSpec& spec) { return KindNamed(BackendNames(), spec.backend()); }
v1::Compression CompressionOf(const v1::JobSpec& spec) {
  return KindNamed(CompressionNames(), spec.compression());
}

}  // namespace ddp
