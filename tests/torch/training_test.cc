// Data, models, the loader, and the trainer on in-process ranks.
#include <torch/torch.h>

#include <fstream>

#include "gtest/gtest.h"
#include "tests/test_util.h"
#include "tests/torch/ranks.h"
#include "worker/dataset.h"
#include "worker/loader.h"
#include "worker/model.h"
#include "worker/trainer.h"

namespace ddp {
namespace {

using ::testing::HasSubstr;

constexpr char kFashion[] = "/usr/share/datasets/fashion-mnist";

TEST(Dataset, ReadIdxFile_FashionMnist_ShapesOfTheRealData) {
  auto images = ReadIdxFile(std::string(kFashion) + "/t10k-images-idx3-ubyte.gz");
  ASSERT_THAT(images, IsOk());
  EXPECT_EQ(images->sizes().vec(), (std::vector<int64_t>{10000, 28, 28}));
  auto labels = ReadIdxFile(std::string(kFashion) + "/t10k-labels-idx1-ubyte.gz");
  ASSERT_THAT(labels, IsOk());
  EXPECT_EQ(labels->max().item<int>(), 9);
}

TEST(Dataset, ReadIdxFile_NotIdx_InvalidArgumentNamingTheFile) {
  const std::string path = "/tmp/ddp-not-idx.gz";
  std::ofstream(path) << "hello";
  EXPECT_THAT(ReadIdxFile(path),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ddp-not-idx")));
}

TEST(Dataset, LoadDataset_FashionMnist_NormalizedImagesAndLabels) {
  v1::DatasetSpec spec;
  spec.set_kind("fashion-mnist");
  spec.set_path(kFashion);
  spec.set_train_size(1000);
  auto d = LoadDataset(spec, 0);
  ASSERT_THAT(d, IsOk());
  EXPECT_EQ(d->train_x.sizes().vec(), (std::vector<int64_t>{1000, 1, 28, 28}));
  EXPECT_EQ(d->test_x.size(0), 10000);
  EXPECT_EQ(d->num_classes, 10);
  // Normalized with the training set's statistics: mean near 0.
  EXPECT_NEAR(d->train_x.mean().item<double>(), 0.0, 0.05);
}

TEST(Dataset, LoadDataset_Synthetic_SameSeedSameData) {
  v1::DatasetSpec spec;
  spec.set_kind("synthetic");
  spec.set_train_size(64);
  spec.set_test_size(16);
  auto a = LoadDataset(spec, 5);
  auto b = LoadDataset(spec, 5);
  auto c = LoadDataset(spec, 6);
  EXPECT_TRUE(torch::equal(a->train_x, b->train_x));
  EXPECT_TRUE(torch::equal(a->train_y, b->train_y));
  EXPECT_FALSE(torch::equal(a->train_x, c->train_x));
}

TEST(Model, MakeModel_TorchScriptMissingOrCorrupt_InvalidArgumentNamingModelPath) {
  v1::ModelSpec spec;
  spec.set_kind("torchscript");
  spec.set_path("/nonexistent/model.pt");
  EXPECT_THAT(MakeModel(spec, {1, 28, 28}, 10, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("model.path")));
  spec.set_path("/tmp/ddp-corrupt-model.pt");
  std::ofstream(spec.path()) << "not a zip archive";
  EXPECT_THAT(MakeModel(spec, {1, 28, 28}, 10, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("TorchScript")));
}

TEST(Model, CheckModelFits_TooFewOutputs_SaysWhatItReturns) {
  v1::ModelSpec spec;
  spec.set_kind("mlp");
  auto model = MakeModel(spec, {1, 28, 28}, 5, 0);
  ASSERT_THAT(model, IsOk());
  EXPECT_THAT(CheckModelFits(**model, spec, {1, 28, 28}, 10),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("[2, 5]")));
  EXPECT_THAT(CheckModelFits(**model, spec, {1, 28, 28}, 5), IsOk());
}

TEST(Model, MakeModel_CnnOnOtherShapes_Refused) {
  v1::ModelSpec spec;
  spec.set_kind("cnn");
  EXPECT_THAT(MakeModel(spec, {3, 32, 32}, 10, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("1x28x28")));
}

TEST(Loader, Next_BatchesFollowTheIndicesLastOnePartial) {
  at::Tensor x = torch::arange(10).to(torch::kFloat32).unsqueeze(1);
  at::Tensor y = torch::arange(10);
  BatchLoader loader(x, y, {9, 8, 7, 6, 5}, 2, /*drop_last=*/false, /*skip=*/0);
  EXPECT_EQ(loader.num_batches(), 3);
  std::vector<int64_t> seen;
  while (auto b = loader.Next()) {
    for (int64_t i = 0; i < b->y.size(0); ++i) seen.push_back(b->y[i].item<int64_t>());
  }
  EXPECT_EQ(seen, (std::vector<int64_t>{9, 8, 7, 6, 5}));
  BatchLoader dropping(x, y, {9, 8, 7, 6, 5}, 2, /*drop_last=*/true, /*skip=*/1);
  auto b = dropping.Next();
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->y[0].item<int64_t>(), 7);
  EXPECT_FALSE(dropping.Next().has_value());
}

// Collects what the trainer reports.
class Recorder final : public TrainingObserver {
 public:
  void OnPhase(v1::StepPhase, uint64_t) override {}
  void OnStep(const v1::StepReport& r) override { steps.push_back(r); }
  void OnEpoch(const v1::EpochResult& r) override { epochs.push_back(r); }
  std::vector<v1::StepReport> steps;
  std::vector<v1::EpochResult> epochs;
};

v1::Assignment SyntheticJob(int rank, int world) {
  v1::Assignment a;
  a.set_job_id("t");
  a.set_generation(1);
  a.set_rank(rank);
  a.set_world_size(world);
  a.set_sampler_seed(3);
  v1::JobSpec* spec = a.mutable_spec();
  spec->mutable_model()->set_kind("mlp");
  spec->mutable_dataset()->set_kind("synthetic");
  spec->mutable_dataset()->set_train_size(512);
  spec->mutable_dataset()->set_test_size(256);
  spec->mutable_optimizer()->set_kind("sgd");
  spec->mutable_optimizer()->set_lr(0.05);
  spec->mutable_optimizer()->set_momentum(0.9);
  spec->set_batch_size(32);
  spec->set_epochs(2);
  spec->set_seed(3);
  spec->set_shuffle(true);
  spec->set_bucket_cap_mb(0.05);
  spec->set_gradient_accumulation_steps(1);
  spec->set_loss("cross_entropy");
  spec->set_evaluate(true);
  return a;
}

TEST(Trainer, Train_TwoRanks_IdenticalParametersAfterEveryEpochAndLossFalls) {
  std::vector<Recorder> recorders(2);
  std::atomic<bool> abort{false};
  RunRanks(2, [&](int rank, Communicator* comm) {
    ASSERT_THAT(Train(SyntheticJob(rank, 2), comm, &recorders[rank], abort), IsOk());
  });
  // 512 samples / 2 ranks / 32 per batch = 8 steps per epoch.
  ASSERT_EQ(recorders[0].steps.size(), 16u);
  ASSERT_EQ(recorders[1].steps.size(), 16u);
  for (size_t i = 0; i < 16; ++i) {
    const auto& a = recorders[0].steps[i];
    const auto& b = recorders[1].steps[i];
    EXPECT_EQ(a.step(), i + 1);
    EXPECT_EQ(a.steps_per_epoch(), 8u);
    // The last step of each epoch carries the parameters' digest.
    EXPECT_EQ(a.parameter_digest().empty(), a.step_in_epoch() != 8);
    EXPECT_EQ(a.parameter_digest(), b.parameter_digest());
    EXPECT_EQ(a.reduction().buckets_total(), 2u);  // 0.05 MiB buckets
  }
  EXPECT_LT(recorders[0].steps.back().loss(), recorders[0].steps.front().loss());
  ASSERT_EQ(recorders[0].epochs.size(), 2u);  // rank 0 evaluates
  EXPECT_TRUE(recorders[1].epochs.empty());
  EXPECT_GT(recorders[0].epochs.back().test_accuracy(), 0.3);  // 10 classes: chance is 0.1
}

TEST(Trainer, Train_MaxSteps_StopsThere) {
  Recorder recorder;
  std::atomic<bool> abort{false};
  v1::Assignment a = SyntheticJob(0, 1);
  a.mutable_spec()->set_max_steps(5);
  RunRanks(1,
           [&](int, Communicator* comm) { ASSERT_THAT(Train(a, comm, &recorder, abort), IsOk()); });
  ASSERT_EQ(recorder.steps.size(), 5u);
  EXPECT_FALSE(recorder.steps.back().parameter_digest().empty());
}

TEST(Trainer, Train_Aborted_ReturnsAborted) {
  Recorder recorder;
  std::atomic<bool> abort{true};
  RunRanks(1, [&](int, Communicator* comm) {
    EXPECT_THAT(Train(SyntheticJob(0, 1), comm, &recorder, abort),
                StatusIs(absl::StatusCode::kAborted));
  });
  EXPECT_TRUE(recorder.steps.empty());
}

}  // namespace
}  // namespace ddp
