#include "common/job_spec.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ddp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// A build whose LibTorch has no CUDA (a coordinator's, or a CPU worker's).
BuildCapabilities CpuBuild() { return BuildCapabilities{}; }

TEST(JobSpec, ParseJobSpecJson_Minimal_FillsDefaults) {
  auto spec = ParseJobSpecJson(R"({"name": "demo"})", CpuBuild());
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

TEST(JobSpec, ParseJobSpecJson_ProgramJob_DataIsTheProgramsToo) {
  auto spec = ParseJobSpecJson(R"({"name": "mine", "model": {"kind": "program"}})", CpuBuild());
  ASSERT_THAT(spec, IsOk());
  EXPECT_TRUE(IsProgramJob(*spec));
  EXPECT_EQ(spec->dataset().kind(), "program");
  EXPECT_TRUE(spec->dataset().path().empty());
}

TEST(JobSpec, ParseJobSpecJson_AdamDefaultsAndSnakeCase_Accepted) {
  auto spec = ParseJobSpecJson(
      R"({"name": "a", "optimizer": {"kind": "adam"}, "batch_size": 32, "min_workers": 2,
          "shuffle": false})",
      CpuBuild());
  ASSERT_THAT(spec, IsOk());
  EXPECT_DOUBLE_EQ(spec->optimizer().lr(), 0.001);
  EXPECT_DOUBLE_EQ(spec->optimizer().beta2(), 0.999);
  EXPECT_EQ(spec->batch_size(), 32u);
  EXPECT_EQ(spec->max_workers(), 2u);
  EXPECT_FALSE(spec->shuffle());
}

TEST(JobSpec, ParseJobSpecJson_UnknownField_NamesIt) {
  EXPECT_THAT(ParseJobSpecJson(R"({"name": "a", "batch_sise": 3})", CpuBuild()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("batch_sise")));
}

TEST(JobSpec, ParseJobSpecJson_WorkerSelector_CheckedAsLabels) {
  auto spec = ParseJobSpecJson(R"({"name": "a", "workerSelector": {"zone": "a", "gpu": "h200"}})",
                               CpuBuild());
  ASSERT_THAT(spec, IsOk());
  EXPECT_EQ(spec->worker_selector().at("zone"), "a");
  EXPECT_EQ(spec->worker_selector().size(), 2u);
  EXPECT_THAT(ParseJobSpecJson(R"({"name": "a", "workerSelector": {"zone": "a b"}})", CpuBuild()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("job.worker_selector: the value of zone")));
}

TEST(JobSpec, ImageFolder_DefaultsAndEvaluationTransformsDerived) {
  auto spec = ParseJobSpecJson(R"({"name": "imgs", "dataset": {"kind": "image-folder",
      "path": "/data/train", "transforms": [{"kind": "RandomResizedCrop", "size": [224]},
      {"kind": "RandomHorizontalFlip", "p": 0.25}]}})",
                               CpuBuild());
  ASSERT_THAT(spec, IsOk());
  const v1::DatasetSpec& d = spec->dataset();
  EXPECT_EQ(d.loader_threads(), 2u);
  EXPECT_EQ(d.prefetch_batches(), 4u);
  // Evaluation: no randomness; the random crop becomes Resize then CenterCrop.
  ASSERT_EQ(d.test_transforms_size(), 2);
  EXPECT_EQ(d.test_transforms(0).kind(), "Resize");
  EXPECT_EQ(d.test_transforms(0).size(0), 224u);
  EXPECT_EQ(d.test_transforms(1).kind(), "CenterCrop");
  EXPECT_EQ(WithDefaults(*spec).SerializeAsString(), spec->SerializeAsString());
}

TEST(JobSpec, ImageFolder_BadTransforms_NameTheStep) {
  const auto bad = [](const std::string& data) {
    return ParseJobSpecJson(absl::StrCat(R"({"name": "i", "dataset": )", data, "}"), CpuBuild())
        .status();
  };
  EXPECT_THAT(bad(R"({"kind": "image-folder"})"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dataset.path")));
  EXPECT_THAT(bad(R"({"kind": "image-folder", "path": "/d", "transforms": [{"kind": "Blur"}]})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("dataset.transforms[0].kind: \"Blur\" is not supported")));
  EXPECT_THAT(bad(R"({"kind": "image-folder", "path": "/d",
                      "transforms": [{"kind": "Resize", "size": [256]}]})"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("one size for every image")));
  EXPECT_THAT(
      bad(R"({"kind": "image-folder", "path": "/d", "transforms":
                      [{"kind": "RandomResizedCrop", "size": [8], "scale": [0.9, 0.1]}]})"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dataset.transforms[0].scale")));
  EXPECT_THAT(bad(R"({"kind": "image-folder", "path": "/d", "normalize": {"mean": [0.5]}})"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dataset.normalize")));
  EXPECT_THAT(bad(R"({"kind": "synthetic", "transforms": [{"kind": "RandomHorizontalFlip"}]})"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"shards\" only")));
}

// The list torchvision users write, as they write it.
TEST(JobSpec, ImageFolder_TorchvisionList_ToTensorTakenAndNormalizeMoved) {
  auto spec = ParseJobSpecJson(R"({"name": "imgs", "dataset": {"kind": "image-folder",
      "path": "/data/train", "transforms": [{"kind": "RandomResizedCrop", "size": [224]},
      {"kind": "RandomHorizontalFlip"}, {"kind": "ToTensor"},
      {"kind": "Normalize", "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}]}})",
                               CpuBuild());
  ASSERT_THAT(spec, IsOk());
  const v1::DatasetSpec& d = spec->dataset();
  ASSERT_EQ(d.transforms_size(), 2);
  EXPECT_EQ(d.transforms(1).kind(), "RandomHorizontalFlip");
  ASSERT_EQ(d.normalize().mean_size(), 3);
  EXPECT_FLOAT_EQ(d.normalize().std(2), 0.225f);
  EXPECT_EQ(d.test_transforms_size(), 2);  // Resize, CenterCrop: no ToTensor, no Normalize
  EXPECT_EQ(WithDefaults(*spec).SerializeAsString(), spec->SerializeAsString());
}

TEST(JobSpec, ImageFolder_TorchvisionTransformsItLacks_NamedWithWhatToWrite) {
  const auto bad = [](const std::string& transforms) {
    return ParseJobSpecJson(absl::StrCat(R"({"name": "i", "dataset": {"kind": "image-folder",
        "path": "/d", "transforms": )",
                                         transforms, "}}"),
                            CpuBuild())
        .status();
  };
  EXPECT_THAT(bad(R"([{"kind": "ColorJitter", "brightness": 0.4}])"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("dataset.transforms[0].kind: \"ColorJitter\" is not "
                                       "supported"),
                             HasSubstr("Normalize"))));
  EXPECT_THAT(bad(R"([{"kind": "Resize", "size": [32], "interpolation": 2}])"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("Resize takes no \"interpolation\" (it takes size)")));
  EXPECT_THAT(bad(R"([{"kind": "Normalize", "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]},
                      {"kind": "CenterCrop", "size": [8]}])"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("Normalize must be the last transform")));
}

TEST(JobSpec, Shards_PathRequiredAndTheirOwnIndex) {
  const auto bad = [](const std::string& data) {
    return ParseJobSpecJson(absl::StrCat(R"({"name": "s", "dataset": )", data, "}"), CpuBuild())
        .status();
  };
  EXPECT_THAT(bad(R"({"kind": "shards"})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("dataset.path: required for dataset.kind \"shards\"")));
  EXPECT_THAT(
      bad(R"({"kind": "shards", "path": "/d", "manifest": "/m"})"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("shards carry their own index")));
  EXPECT_THAT(bad(R"({"kind": "image-folder", "path": "/d", "testManifest": "/m"})"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("set both")));
  EXPECT_THAT(bad(R"({"kind": "tensors", "path": "/t.pt", "skipBadSamples": true})"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("skip_bad_samples")));
  auto spec = ParseJobSpecJson(R"({"name": "s", "dataset": {"kind": "shards", "path": "/d",
      "skipBadSamples": true}})",
                               CpuBuild());
  ASSERT_THAT(spec, IsOk());
  EXPECT_EQ(spec->dataset().loader_threads(), 2u);
  EXPECT_TRUE(spec->dataset().skip_bad_samples());
}

TEST(JobSpec, ParseJobSpecJson_Malformed_InvalidArgument) {
  EXPECT_THAT(ParseJobSpecJson(R"({"name": )", CpuBuild()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("JobSpec")));
  EXPECT_THAT(ParseJobSpecJson(R"({"epochs": "many"})", CpuBuild()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("epochs")));
}

struct BadSpecCase {
  const char* json;
  const char* field;
};

class JobSpecBadField : public testing::TestWithParam<BadSpecCase> {};

TEST_P(JobSpecBadField, Validate_NamesTheField) {
  EXPECT_THAT(ParseJobSpecJson(GetParam().json, CpuBuild()),
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
        BadSpecCase{R"({"collectiveTimeoutSeconds": 0})", "job.collective_timeout_seconds"},
        BadSpecCase{R"({"rejoinTimeoutSeconds": -1})", "job.rejoin_timeout_seconds"},
        BadSpecCase{R"({"rejoinTimeoutSeconds": "NaN"})", "job.rejoin_timeout_seconds"},
        BadSpecCase{R"({"lrScaling": "sqrt"})", "job.lr_scaling"},
        BadSpecCase{R"({"reformMinIntervalSeconds": -0.5})", "job.reform_min_interval_seconds"},
        BadSpecCase{R"({"reformMinIntervalSeconds": "NaN"})", "job.reform_min_interval_seconds"},
        BadSpecCase{R"({"hangTimeoutSeconds": 0})", "job.hang_timeout_seconds"},
        BadSpecCase{R"({"hangTimeoutSeconds": -5})", "job.hang_timeout_seconds"},
        BadSpecCase{R"({"hangTimeoutSeconds": "NaN"})", "job.hang_timeout_seconds"},
        BadSpecCase{R"({"hangTimeoutSeconds": "Infinity"})", "job.hang_timeout_seconds"},
        BadSpecCase{R"({"evalTimeoutSeconds": 0})", "job.eval_timeout_seconds"},
        BadSpecCase{R"({"evalBatchSize": 65537})", "job.eval_batch_size"},
        BadSpecCase{R"({"evalTimeoutSeconds": 86401})", "job.eval_timeout_seconds"},
        BadSpecCase{R"({"evalTimeoutSeconds": "NaN"})", "job.eval_timeout_seconds"},
        BadSpecCase{R"({"faultBudget": 2000000})", "job.fault_budget"},
        // A program's job: the program brings model, data and checkpoints.
        BadSpecCase{R"({"model": {"kind": "program", "path": "m.pt"}})", "job.model.path"},
        BadSpecCase{R"({"model": {"kind": "program"}, "dataset": {"kind": "synthetic"}})",
                    "job.dataset.kind"},
        BadSpecCase{R"({"dataset": {"kind": "program"}})", "job.dataset.kind"},
        BadSpecCase{R"({"model": {"kind": "program"}, "checkpoint": {"dir": "/c"}})",
                    "job.checkpoint.dir"},
        BadSpecCase{R"({"model": {"kind": "program"}, "outputPath": "/o.pt"})", "job.output_path"},
        BadSpecCase{R"({"model": {"kind": "program"}, "minWorkers": 3, "maxWorkers": 2})",
                    "job.max_workers"},
        BadSpecCase{R"({"checkpoint": {"dir": "ckpt"}})", "job.checkpoint.dir"},
        BadSpecCase{R"({"checkpoint": {"everySteps": 10}})", "job.checkpoint.dir"},
        BadSpecCase{R"({"checkpoint": {"everySeconds": 60}})", "job.checkpoint.dir"},
        BadSpecCase{R"({"checkpoint": {"keep": 2}})", "job.checkpoint.dir"},
        BadSpecCase{R"({"checkpoint": {"dir": "/c", "everySeconds": -1}})",
                    "job.checkpoint.every_seconds"},
        BadSpecCase{R"({"checkpoint": {"dir": "/c", "everySeconds": "NaN"}})",
                    "job.checkpoint.every_seconds"},
        BadSpecCase{R"({"checkpoint": {"dir": "/c", "keep": 5000}})", "job.checkpoint.keep"},
        // Non-finite optimizer values, each naming its field.
        BadSpecCase{R"({"optimizer": {"lr": "NaN"}})", "job.optimizer.lr"},
        BadSpecCase{R"({"optimizer": {"lr": "Infinity"}})", "job.optimizer.lr"},
        BadSpecCase{R"({"optimizer": {"momentum": "NaN"}})", "job.optimizer.momentum"},
        BadSpecCase{R"({"optimizer": {"weightDecay": "NaN"}})", "job.optimizer.weight_decay"},
        BadSpecCase{R"({"optimizer": {"weightDecay": "Infinity"}})", "job.optimizer.weight_decay"},
        BadSpecCase{R"({"optimizer": {"beta1": "NaN"}})", "job.optimizer.beta1"},
        BadSpecCase{R"({"optimizer": {"beta2": "-Infinity"}})", "job.optimizer.beta2"},
        BadSpecCase{R"({"optimizer": {"beta2": 1}})", "job.optimizer.beta2"},
        BadSpecCase{R"({"optimizer": {"kind": "adam", "eps": "Infinity"}})", "job.optimizer.eps"},
        BadSpecCase{R"({"optimizer": {"kind": "adam", "eps": "NaN"}})", "job.optimizer.eps"},
        BadSpecCase{R"({"optimizer": {"kind": "adam", "eps": 0}})", "job.optimizer.eps"},
        // Sizes: counts, bytes, and values that would wrap.
        BadSpecCase{R"({"dataset": {"kind": "synthetic", "trainSize": "10000001"}})",
                    "job.dataset.train_size"},
        BadSpecCase{R"({"dataset": {"kind": "synthetic", "trainSize": "18446744073709551615"}})",
                    "job.dataset.train_size"},
        BadSpecCase{R"({"dataset": {"kind": "synthetic", "testSize": "1000001"}})",
                    "job.dataset.test_size"},
        BadSpecCase{R"({"dataset": {"kind": "synthetic", "trainSize": 1000000,
                                    "testSize": 1000000}})",
                    "job.dataset.train_size"},
        BadSpecCase{R"({"dataset": {"kind": "fashion-mnist", "trainSize": "2147483649"}})",
                    "job.dataset.train_size"},
        BadSpecCase{R"({"minWorkers": 2, "maxWorkers": 100000})", "job.max_workers"}));

TEST(JobSpec, ParseJobSpecJson_SyntheticAtItsLimits_Accepted) {
  // 1,369,568 samples of 3136 bytes fit in 4 GiB; one more does not.
  EXPECT_THAT(ParseJobSpecJson(
                  R"({"dataset": {"kind": "synthetic", "trainSize": 1000000, "testSize": 369568}})",
                  CpuBuild()),
              IsOk());
  EXPECT_THAT(ParseJobSpecJson(
                  R"({"dataset": {"kind": "synthetic", "trainSize": 1000000, "testSize": 369569}})",
                  CpuBuild()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("4294967296 bytes")));
  EXPECT_THAT(ParseJobSpecJson(R"({"dataset": {"kind": "tensors", "path": "/d/x.pt",
                                               "trainSize": "2147483648"}})",
                               CpuBuild()),
              IsOk());
}

TEST(JobSpec, ParseJobSpecJson_DuplicateKey_InvalidArgumentNamingIt) {
  EXPECT_THAT(ParseJobSpecJson(R"({"name": "a", "optimizer": {"lr": 0.1, "lr": 0.2}})", CpuBuild()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("job.optimizer.lr"), HasSubstr("twice"))));
  EXPECT_THAT(ParseJobSpecJson(R"({"epochs": 1, "name": "a", "epochs": 2})", CpuBuild()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("job.epochs")));
}

TEST(JobSpec, ParseJobSpecJson_BothJsonNamesOfAField_InvalidArgument) {
  EXPECT_THAT(ParseJobSpecJson(R"({"batchSize": 8, "batch_size": 16})", CpuBuild()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("job.batch_size"), HasSubstr("\"batchSize\""))));
}

TEST(JobSpec, ParseJobSpecJson_SameKeyInDifferentObjects_Accepted) {
  EXPECT_THAT(ParseJobSpecJson(R"({"model": {"kind": "mlp"}, "dataset": {"kind": "synthetic"}})",
                               CpuBuild()),
              IsOk());
}

TEST(JobSpec, Validate_HugeStrings_EchoedShort) {
  v1::JobSpec spec = WithDefaults(v1::JobSpec());
  spec.set_name(std::string(3 << 20, 'x'));
  absl::Status s = ValidateJobSpec(spec, CpuBuild());
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("(3145728 bytes)")));
  EXPECT_LT(s.message().size(), 300u);
  spec = WithDefaults(v1::JobSpec());
  spec.mutable_model()->set_kind(std::string(1 << 20, 'm') + "\n2026-01-01 I coordinator] x");
  s = ValidateJobSpec(spec, CpuBuild());
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("job.model.kind")));
  EXPECT_LT(s.message().size(), 300u);
  spec = WithDefaults(v1::JobSpec());
  spec.set_output_path("/" + std::string(5000, 'p'));
  EXPECT_THAT(ValidateJobSpec(spec, CpuBuild()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("job.output_path"), HasSubstr("4096"))));
}

TEST(JobSpec, ParseJobSpecJson_Minimal_ElasticDefaults) {
  auto spec = ParseJobSpecJson(R"({"name": "demo"})", CpuBuild());
  ASSERT_THAT(spec, IsOk());
  EXPECT_DOUBLE_EQ(spec->rejoin_timeout_seconds(), 300);
  EXPECT_EQ(spec->lr_scaling(), "keep");
  EXPECT_DOUBLE_EQ(spec->reform_min_interval_seconds(), 10);
  EXPECT_DOUBLE_EQ(spec->hang_timeout_seconds(), 60);
  EXPECT_EQ(spec->fault_budget(), 100u);
  EXPECT_TRUE(spec->checkpoint().dir().empty());  // no checkpoints unless asked for
  EXPECT_EQ(spec->checkpoint().every_steps(), 0u);
  EXPECT_EQ(spec->checkpoint().keep(), 0u);
}

TEST(JobSpec, ParseJobSpecJson_ZeroesSetOnPurpose_Kept) {
  auto spec = ParseJobSpecJson(
      R"({"faultBudget": 0, "rejoinTimeoutSeconds": 0, "reformMinIntervalSeconds": 0,
          "lrScaling": "linear"})",
      CpuBuild());
  ASSERT_THAT(spec, IsOk());
  EXPECT_EQ(spec->fault_budget(), 0u);
  EXPECT_DOUBLE_EQ(spec->rejoin_timeout_seconds(), 0);
  EXPECT_DOUBLE_EQ(spec->reform_min_interval_seconds(), 0);
  EXPECT_EQ(spec->lr_scaling(), "linear");
}

TEST(JobSpec, ParseJobSpecJson_CheckpointDir_KeepAndEveryStepsDefaulted) {
  struct Row {
    const char* json;
    uint64_t every_steps;
    double every_seconds;
    uint32_t keep;
  } rows[] = {
      {R"({"checkpoint": {"dir": "/c"}})", 1000, 0, 3},
      {R"({"checkpoint": {"dir": "/c", "everySteps": 50}})", 50, 0, 3},
      {R"({"checkpoint": {"dir": "/c", "everySeconds": 60}})", 0, 60, 3},
      {R"({"checkpoint": {"dir": "/c", "keep": 1}})", 1000, 0, 1},
  };
  for (const Row& row : rows) {
    auto spec = ParseJobSpecJson(row.json, CpuBuild());
    ASSERT_THAT(spec, IsOk()) << row.json;
    EXPECT_EQ(spec->checkpoint().dir(), "/c");
    EXPECT_EQ(spec->checkpoint().every_steps(), row.every_steps) << row.json;
    EXPECT_DOUBLE_EQ(spec->checkpoint().every_seconds(), row.every_seconds) << row.json;
    EXPECT_EQ(spec->checkpoint().keep(), row.keep) << row.json;
  }
}

TEST(JobSpec, SpecDigest_WorkerCountsAndTimeoutsDiffer_Equal) {
  const v1::JobSpec base = WithDefaults(v1::JobSpec());
  const std::string digest = SpecDigest(base);
  EXPECT_EQ(digest.size(), 16u);
  std::vector<v1::JobSpec> same(9, base);
  same[0].set_min_workers(4);
  same[1].set_max_workers(8);
  same[2].set_settle_seconds(30);
  same[3].set_rejoin_timeout_seconds(5);
  same[4].set_hang_timeout_seconds(600);
  same[5].set_fault_budget(0);
  same[6].set_reform_min_interval_seconds(1);
  same[7].set_collective_timeout_seconds(10);
  same[8].mutable_checkpoint()->set_dir("/c");
  for (size_t i = 0; i < same.size(); ++i) EXPECT_EQ(SpecDigest(same[i]), digest) << i;
}

TEST(JobSpec, SpecDigest_StateShapingFieldsDiffer_Different) {
  const v1::JobSpec base = WithDefaults(v1::JobSpec());
  const std::string digest = SpecDigest(base);
  std::vector<v1::JobSpec> other(9, base);
  other[0].mutable_model()->set_kind("mlp");
  other[1].mutable_dataset()->set_kind("synthetic");
  other[2].mutable_dataset()->set_train_size(100);
  other[3].set_seed(1);
  other[4].set_batch_size(32);
  other[5].mutable_optimizer()->set_kind("adam");
  other[6].set_gradient_accumulation_steps(2);
  other[7].set_shuffle(false);
  other[8].set_drop_last(true);
  for (size_t i = 0; i < other.size(); ++i) EXPECT_NE(SpecDigest(other[i]), digest) << i;
}

// NCCL is bound at run time: the coordinator, which runs none, accepts the
// backend in any build, and a worker without NCCL says so when it connects.
TEST(JobSpec, Backends_AllFourAccepted_EvenByACpuBuild) {
  for (const char* backend : {"gloo", "shm", "nccl", "auto"}) {
    EXPECT_THAT(ParseJobSpecJson(absl::StrCat(R"({"backend": ")", backend, R"("})"), CpuBuild()),
                IsOk())
        << backend;
    EXPECT_THAT(ParseJobSpecJson(absl::StrCat(R"({"backend": ")", backend, R"("})"), ThisBuild()),
                IsOk())
        << backend;
  }
}

TEST(JobSpec, Compression_NoneByDefault_Fp16Bf16Accepted_OthersNamed) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecJson("{}", CpuBuild());
  ASSERT_THAT(spec, IsOk());
  EXPECT_EQ(spec->compression(), "none");
  for (const char* kind : {"none", "fp16", "bf16"}) {
    EXPECT_THAT(ParseJobSpecJson(absl::StrCat(R"({"compression": ")", kind, R"("})"), CpuBuild()),
                IsOk())
        << kind;
  }
  EXPECT_THAT(ParseJobSpecJson(R"({"compression": "int8"})", CpuBuild()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("job.compression"), HasSubstr("int8"), HasSubstr("bf16"))));
  // A program compresses in its own DistributedDataParallel.
  EXPECT_THAT(
      ParseJobSpecJson(R"({"model": {"kind": "program"}, "compression": "fp16"})", CpuBuild()),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr("job.compression"), HasSubstr("Options::compression"))));
}

TEST(JobSpec, PowerSgd_DefaultsAsPyTorchsState_BoundsAndStrayFieldsNamed) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecJson(R"({"compression": "powersgd"})", CpuBuild());
  ASSERT_THAT(spec, IsOk());
  EXPECT_EQ(spec->powersgd_rank(), 1u);
  EXPECT_EQ(spec->powersgd_start_step(), 1000u);
  EXPECT_THAT(
      ParseJobSpecJson(R"({"compression": "powersgd", "powersgdRank": 4, "powersgdStartStep": 2})",
                       CpuBuild()),
      IsOk());
  for (const auto& [json, field] : std::vector<std::pair<std::string, std::string>>{
           {R"({"compression": "powersgd", "powersgdRank": 0})", "job.powersgd_rank"},
           {R"({"compression": "powersgd", "powersgdStartStep": 1})", "job.powersgd_start_step"},
           {R"({"compression": "powersgd", "powersgdStartStep": "18446744073709551615"})",
            "job.powersgd_start_step"},
           {R"({"compression": "fp16", "powersgdRank": 2})", "job.powersgd_rank"},
           {R"({"powersgdStartStep": 10})", "job.powersgd_start_step"}}) {
    EXPECT_THAT(ParseJobSpecJson(json, CpuBuild()),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(field)))
        << json;
  }
}

TEST(JobSpec, WithDefaults_Idempotent) {
  v1::JobSpec once = WithDefaults(v1::JobSpec());
  v1::JobSpec twice = WithDefaults(once);
  EXPECT_EQ(once.SerializeAsString(), twice.SerializeAsString());
}

TEST(JobSpec, DefaultJobSpec_IsValidCnnOnFashionMnist) {
  v1::JobSpec spec = DefaultJobSpec(3);
  EXPECT_THAT(ValidateJobSpec(spec, CpuBuild()), IsOk());
  EXPECT_EQ(spec.model().kind(), "cnn");
  EXPECT_EQ(spec.dataset().kind(), "fashion-mnist");
  EXPECT_EQ(spec.min_workers(), 3u);
  EXPECT_EQ(spec.max_workers(), 3u);
}

TEST(JobSpec, LoadJobSpecFile_Missing_NotFoundNamingThePath) {
  EXPECT_THAT(LoadJobSpecFile("/nonexistent/job.json", CpuBuild()),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("/nonexistent/job.json")));
}

}  // namespace
}  // namespace ddp
