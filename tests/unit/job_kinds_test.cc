// Every kind has exactly one readable name and back: a kind added to
// ddp/v1/kinds.proto without a name in common/job_kinds.cc (which job files
// could then never name) fails here.
#include "common/job_kinds.h"

#include <set>
#include <string>

#include "gtest/gtest.h"

namespace ddp {
namespace {

template <typename Kind>
void ExpectEveryKindNamedOnce(absl::Span<const KindName<Kind>> names, bool (*is_valid)(int),
                              int min, int max) {
  std::set<int> kinds;
  std::set<std::string> seen;
  for (const KindName<Kind>& entry : names) {
    EXPECT_TRUE(kinds.insert(entry.kind).second) << "kind " << entry.kind << " named twice";
    EXPECT_TRUE(seen.insert(entry.name).second) << entry.name << " names two kinds";
    EXPECT_EQ(KindNamed(names, entry.name), entry.kind) << entry.name;
  }
  for (int value = min; value <= max; ++value) {
    if (!is_valid(value) || value == 0) continue;  // 0: UNKNOWN
    EXPECT_EQ(kinds.count(value), 1u) << "kind " << value << " has no name";
  }
  EXPECT_EQ(KindNamed(names, "no-such-kind"), static_cast<Kind>(0));
  EXPECT_EQ(KindNamed(names, ""), static_cast<Kind>(0));
}

TEST(JobKinds, EveryKindHasOneNameAndEveryNameOneKind) {
  ExpectEveryKindNamedOnce(ModelKindNames(), v1::ModelKind_IsValid, v1::ModelKind_MIN,
                           v1::ModelKind_MAX);
  ExpectEveryKindNamedOnce(DatasetKindNames(), v1::DatasetKind_IsValid, v1::DatasetKind_MIN,
                           v1::DatasetKind_MAX);
  ExpectEveryKindNamedOnce(OptimizerKindNames(), v1::OptimizerKind_IsValid, v1::OptimizerKind_MIN,
                           v1::OptimizerKind_MAX);
  ExpectEveryKindNamedOnce(LossKindNames(), v1::LossKind_IsValid, v1::LossKind_MIN,
                           v1::LossKind_MAX);
  ExpectEveryKindNamedOnce(LrScalingNames(), v1::LrScaling_IsValid, v1::LrScaling_MIN,
                           v1::LrScaling_MAX);
  ExpectEveryKindNamedOnce(BackendNames(), v1::Backend_IsValid, v1::Backend_MIN, v1::Backend_MAX);
  ExpectEveryKindNamedOnce(CompressionNames(), v1::Compression_IsValid, v1::Compression_MIN,
                           v1::Compression_MAX);
}

TEST(JobKinds, ReadFromTheSpecsReadableNames) {
  v1::JobSpec spec;
  spec.mutable_model()->set_kind("resnet18");
  spec.mutable_dataset()->set_kind("fashion-mnist");
  spec.mutable_optimizer()->set_kind("adam");
  spec.set_loss("nll");
  spec.set_lr_scaling("linear");
  spec.set_backend("shm");
  spec.set_compression("bf16");
  EXPECT_EQ(ModelKindOf(spec.model()), v1::MODEL_KIND_RESNET18);
  EXPECT_EQ(DatasetKindOf(spec.dataset()), v1::DATASET_KIND_FASHION_MNIST);
  EXPECT_EQ(OptimizerKindOf(spec.optimizer()), v1::OPTIMIZER_KIND_ADAM);
  EXPECT_EQ(LossKindOf(spec), v1::LOSS_KIND_NLL);
  EXPECT_EQ(LrScalingOf(spec), v1::LR_SCALING_LINEAR);
  EXPECT_EQ(BackendOf(spec), v1::BACKEND_SHM);
  EXPECT_EQ(CompressionOf(spec), v1::COMPRESSION_BF16);
  // Names are exact, as job files have always been read.
  spec.set_backend("Gloo");
  EXPECT_EQ(BackendOf(spec), v1::BACKEND_UNKNOWN);
}

}  // namespace
}  // namespace ddp
