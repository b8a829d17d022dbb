#include "common/job_spec.h"

#include "absl/strings/str_cat.h"

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ddp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

BuildCapabilities NoNccl() { return BuildCapabilities{}; }

TEST(JobSpec, ParseJobSpecJson_Minimal_FillsDefaults) {
  auto spec = ParseJobSpecJson(R"({"name": "demo"})", NoNccl());
  ASSERT_THAT(spec, IsOk());
  EXPECT_EQ(spec->model().kind(), "cnn");
  EXPECT_EQ(spec->dataset().kind(), "fashion-mnist");
  EXPECT_EQ(spec->dataset().path(), "/usr/share/datasets/fashion-mnist");
  EXPECT_EQ(spec->optimizer().kind(), "sgd");
  EXPECT_DOUBLE_EQ(spec->optimizer().lr(), 0.01);
  EXPECT_EQ(spec->batch_size(), 64u);
  EXPECT_TRUE(spec->shuffle());
  EXPECT_DOUBLE_EQ(spec->bucket_cap_mb(), 25);
  EXPECT_EQ(spec->gradient_accumulation_steps(), 1u);
  EXPECT_EQ(spec->backend(), "auto");
  EXPECT_EQ(spec->min_workers(), 1u);
  EXPECT_EQ(spec->max_workers(), 1u);
}

TEST(JobSpec, ParseJobSpecJson_AdamDefaultsAndSnakeCase_Accepted) {
  auto spec = ParseJobSpecJson(
      R"({"name": "a", "optimizer": {"kind": "adam"}, "batch_size": 32, "min_workers": 2,
          "shuffle": false})",
      NoNccl());
  ASSERT_THAT(spec, IsOk());
  EXPECT_DOUBLE_EQ(spec->optimizer().lr(), 0.001);
  EXPECT_DOUBLE_EQ(spec->optimizer().beta2(), 0.999);
  EXPECT_EQ(spec->batch_size(), 32u);
  EXPECT_EQ(spec->max_workers(), 2u);
  EXPECT_FALSE(spec->shuffle());
}

TEST(JobSpec, ParseJobSpecJson_UnknownField_NamesIt) {
  EXPECT_THAT(ParseJobSpecJson(R"({"name": "a", "batch_sise": 3})", NoNccl()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("batch_sise")));
}

TEST(JobSpec, ParseJobSpecJson_Malformed_InvalidArgument) {
  EXPECT_THAT(ParseJobSpecJson(R"({"name": )", NoNccl()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("JobSpec")));
  EXPECT_THAT(ParseJobSpecJson(R"({"epochs": "many"})", NoNccl()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("epochs")));
}

struct BadSpecCase {
  const char* json;
  const char* field;
};

class JobSpecBadField : public testing::TestWithParam<BadSpecCase> {};

TEST_P(JobSpecBadField, Validate_NamesTheField) {
  EXPECT_THAT(ParseJobSpecJson(GetParam().json, NoNccl()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(GetParam().field)));
}

INSTANTIATE_TEST_SUITE_P(
    Table, JobSpecBadField,
    testing::Values(
        BadSpecCase{R"({"name": "Bad_Name"})", "job.name"},
        BadSpecCase{R"({"model": {"kind": "resnet"}})", "job.model.kind"},
        BadSpecCase{R"({"model": {"kind": "torchscript"}})", "job.model.path"},
        BadSpecCase{R"({"model": {"kind": "mlp", "path": "x.pt"}})", "job.model.path"},
        BadSpecCase{R"({"dataset": {"kind": "imagenet"}})", "job.dataset.kind"},
        BadSpecCase{R"({"dataset": {"kind": "tensors"}})", "job.dataset.path"},
        BadSpecCase{R"({"optimizer": {"kind": "lamb"}})", "job.optimizer.kind"},
        BadSpecCase{R"({"optimizer": {"lr": -1}})", "job.optimizer.lr"},
        BadSpecCase{R"({"optimizer": {"momentum": 1.5}})", "job.optimizer.momentum"},
        BadSpecCase{R"({"optimizer": {"nesterov": true}})", "job.optimizer.nesterov"},
        BadSpecCase{R"({"optimizer": {"weightDecay": -0.1}})", "job.optimizer.weight_decay"},
        BadSpecCase{R"({"loss": "hinge"})", "job.loss"},
        BadSpecCase{R"({"batchSize": 100000})", "job.batch_size"},
        BadSpecCase{R"({"bucketCapMb": 0})", "job.bucket_cap_mb"},
        BadSpecCase{R"({"backend": "mpi"})", "job.backend"},
        BadSpecCase{R"({"minWorkers": 4, "maxWorkers": 2})", "job.max_workers"},
        BadSpecCase{R"({"settleSeconds": -1})", "job.settle_seconds"},
        BadSpecCase{R"({"collectiveTimeoutSeconds": 0})", "job.collective_timeout_seconds"}));

TEST(JobSpec, Validate_NcclWithoutNcclBuild_SaysWhatToDo) {
  EXPECT_THAT(ParseJobSpecJson(R"({"backend": "nccl"})", NoNccl()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("job.backend"), HasSubstr("NCCL"), HasSubstr("gloo"))));
  BuildCapabilities with_nccl;
  with_nccl.nccl = true;
  EXPECT_THAT(ParseJobSpecJson(R"({"backend": "nccl"})", with_nccl), IsOk());
}

TEST(JobSpec, Backends_AllFourAccepted) {
  BuildCapabilities with_nccl;
  with_nccl.nccl = true;
  for (const char* backend : {"gloo", "shm", "nccl", "auto"}) {
    EXPECT_THAT(ParseJobSpecJson(absl::StrCat(R"({"backend": ")", backend, R"("})"), with_nccl),
                IsOk())
        << backend;
  }
}

TEST(JobSpec, WithDefaults_Idempotent) {
  v1::JobSpec once = WithDefaults(v1::JobSpec());
  v1::JobSpec twice = WithDefaults(once);
  EXPECT_EQ(once.SerializeAsString(), twice.SerializeAsString());
}

TEST(JobSpec, DefaultJobSpec_IsValidCnnOnFashionMnist) {
  v1::JobSpec spec = DefaultJobSpec(3);
  EXPECT_THAT(ValidateJobSpec(spec, NoNccl()), IsOk());
  EXPECT_EQ(spec.model().kind(), "cnn");
  EXPECT_EQ(spec.dataset().kind(), "fashion-mnist");
  EXPECT_EQ(spec.min_workers(), 3u);
  EXPECT_EQ(spec.max_workers(), 3u);
}

TEST(JobSpec, LoadJobSpecFile_Missing_NotFoundNamingThePath) {
  EXPECT_THAT(LoadJobSpecFile("/nonexistent/job.json", NoNccl()),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("/nonexistent/job.json")));
}

}  // namespace
}  // namespace ddp
