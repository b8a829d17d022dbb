// Data, models, the loader, and the trainer on in-process ranks.
#include <torch/torch.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "common/job_spec.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"
#include "tests/torch/ranks.h"
#include "tests/torch/trainer_harness.h"
#include "worker/dataset.h"
#include "worker/elastic/replica_check.h"
#include "worker/loader.h"
#include "worker/model.h"
#include "worker/trainer.h"
#include "worker/training_state.h"

namespace ddp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr char kFashion[] = "/usr/share/datasets/fashion-mnist";

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
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("fewer logits per sample")));
  EXPECT_THAT(CheckModelFits(**model, spec, {1, 28, 28}, 5), IsOk());
}

TEST(Model, MakeModel_CnnOnGreyOrColour28x28_OtherShapesRefused) {
  v1::ModelSpec spec;
  spec.set_kind("cnn");
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{1, 28, 28}, std::vector<int64_t>{3, 28, 28}}) {
    auto model = MakeModel(spec, shape, 10, 0);
    ASSERT_THAT(model, IsOk());
    EXPECT_THAT(CheckModelFits(**model, spec, shape, 4), IsOk());
  }
  EXPECT_THAT(MakeModel(spec, {3, 32, 32}, 10, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("1x28x28 or 3x28x28")));
}

TEST(Model, MakeModel_ResNet18_SmallOrFlatSamplesRefusedSmallestAllowedRuns) {
  v1::ModelSpec spec;
  spec.set_kind("resnet18");
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{1, 28, 28}, std::vector<int64_t>{3, 32, 32}}) {
    EXPECT_THAT(MakeModel(spec, shape, 10, 0), IsOk());
  }
  // Three stride-2 stages: below 8x8 a stage's output would be empty.
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{3, 7, 32}, std::vector<int64_t>{3, 32, 4}, std::vector<int64_t>{784},
        std::vector<int64_t>{3, 32}}) {
    EXPECT_THAT(MakeModel(spec, shape, 10, 0),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at least 8x8")))
        << shape.size();
  }
  auto model = MakeModel(spec, {3, 8, 8}, 10, 0);
  ASSERT_THAT(model, IsOk());
  EXPECT_THAT(CheckModelFits(**model, spec, {3, 8, 8}, 10), IsOk());
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

TEST(Trainer, TwoRanks_IdenticalParametersAfterEveryEpochAndLossFalls) {
  std::vector<std::unique_ptr<TrainingState>> states(2);
  std::vector<Recorder> recorders(2);
  std::atomic<bool> abort{false};
  auto ends = RunGeneration(
      states, recorders, [](int rank) { return SyntheticJob(rank, 2); }, abort);
  for (auto& end : ends) ASSERT_THAT(end, IsOk());
  EXPECT_EQ(*ends[0], GenerationEnd::kFinished);
  // 512 samples / 2 ranks / 32 per batch = 8 steps per epoch.
  ASSERT_EQ(recorders[0].steps.size(), 16u);
  ASSERT_EQ(recorders[1].steps.size(), 16u);
  for (size_t i = 0; i < 16; ++i) {
    const auto& a = recorders[0].steps[i];
    const auto& b = recorders[1].steps[i];
    EXPECT_EQ(a.step(), i + 1);
    EXPECT_EQ(a.steps_per_epoch(), 8u);
    // The first step of the generation and the last of each epoch carry the
    // parameters' digest.
    EXPECT_EQ(a.parameter_digest().empty(), a.step_in_epoch() != 8 && a.step() != 1);
    EXPECT_EQ(a.parameter_digest(), b.parameter_digest());
    EXPECT_EQ(a.reduction().buckets_total(), 2u);  // 0.05 MiB buckets
  }
  EXPECT_EQ(recorders[0].steps.back().total_steps(), 16u);
  EXPECT_LT(recorders[0].steps.back().loss(), recorders[0].steps.front().loss());
  ASSERT_EQ(recorders[0].epochs.size(), 2u);  // rank 0 evaluates
  EXPECT_TRUE(recorders[1].epochs.empty());
  EXPECT_GT(recorders[0].epochs.back().test_accuracy(), 0.3);  // 10 classes: chance is 0.1
  EXPECT_EQ(states[0]->progress().step, 16u);
  EXPECT_EQ(states[0]->progress().epoch, 2u);
  EXPECT_TRUE(states[0]->finished());
}

TEST(Trainer, MaxSteps_StopsThere) {
  std::vector<std::unique_ptr<TrainingState>> states(1);
  std::vector<Recorder> recorders(1);
  std::atomic<bool> abort{false};
  auto ends = RunGeneration(
      states, recorders,
      [](int) {
        v1::Assignment a = SyntheticJob(0, 1);
        a.mutable_spec()->set_max_steps(5);
        return a;
      },
      abort);
  ASSERT_THAT(ends[0], IsOk());
  ASSERT_EQ(recorders[0].steps.size(), 5u);
  EXPECT_FALSE(recorders[0].steps.back().parameter_digest().empty());
}

TEST(Trainer, Aborted_ReturnsAbortedAndStateStaysAtStepZero) {
  std::vector<std::unique_ptr<TrainingState>> states(1);
  std::vector<Recorder> recorders(1);
  std::atomic<bool> abort{true};
  auto ends = RunGeneration(
      states, recorders, [](int) { return SyntheticJob(0, 1); }, abort);
  EXPECT_THAT(ends[0], StatusIs(absl::StatusCode::kAborted));
  EXPECT_TRUE(recorders[0].steps.empty());
  EXPECT_EQ(states[0]->progress().step, 0u);
}

// A peer's word is not believed (issue 20, item 4): rank 0, the source,
// lies about the size of the state it will send; the receiver refuses it
// before allocating anything, naming the rank, and its own state is intact.
TEST(Trainer, SourceAnnouncesMoreStateThanTheModelHolds_RefusedBeforeAllocating) {
  const v1::Assignment receiver = SyntheticJob(1, 2);
  std::unique_ptr<TrainingState> liar = NewState(SyntheticJob(0, 2));
  std::unique_ptr<TrainingState> state = NewState(receiver);
  const std::vector<float> before = Flat(*state);
  Recorder recorder;
  std::atomic<bool> abort{false};
  absl::StatusOr<GenerationEnd> end = absl::UnknownError("not run");
  RunRanks(2, [&](int rank, Communicator* comm) {
    if (rank == 0) {
      // What SyncState's source does first: the replica check (the same
      // model), then it announces the state's length: 2^60 bytes.
      ASSERT_THAT(CheckSameModel(*comm, liar->model().Parameters(), liar->model().Buffers(), 0),
                  IsOk());
      uint64_t size = uint64_t{1} << 60;
      ASSERT_THAT(comm->Broadcast(&size, sizeof(size), 0), IsOk());
      return;
    }
    GenerationControl control;
    control.abort = &abort;
    control.leave = &recorder.leave;
    end = TrainGeneration(receiver, state.get(), comm, &recorder, control);
  });
  EXPECT_THAT(end, StatusIs(absl::StatusCode::kDataLoss,
                            AllOf(HasSubstr("rank 0 announced a state of 1152921504606846976"),
                                  HasSubstr("refused before allocating"))));
  EXPECT_LT(state->MaxStateBytes(), uint64_t{1} << 30);
  EXPECT_EQ(Flat(*state), before);
  EXPECT_TRUE(recorder.started.empty());
}

TEST(Trainer, LeaveAskedByOneRank_EveryRankLeavesAtTheSameStep) {
  std::vector<std::unique_ptr<TrainingState>> states(3);
  std::vector<Recorder> recorders(3);
  recorders[1].leave_after = 5;  // its vote rides in step 6's last bucket
  std::atomic<bool> abort{false};
  auto ends = RunGeneration(
      states, recorders, [](int rank) { return SyntheticJob(rank, 3); }, abort);
  for (int r = 0; r < 3; ++r) {
    ASSERT_THAT(ends[r], IsOk());
    EXPECT_EQ(*ends[r], GenerationEnd::kLeft);
    EXPECT_EQ(states[r]->progress().step, 6u) << "rank " << r;
  }
  EXPECT_EQ(Flat(*states[0]), Flat(*states[2]));
}

// The pattern of a fault: a generation of 3 ends at a step boundary; the
// survivors (ranks 1 and 2 of it) and a fresh joiner form a generation of 3
// again from one survivor's memory. Every epoch still trains each index
// once, and after the first new step every replica agrees.
TEST(Trainer, ReformedWithJoiner_StartsFromSourceStateAndCoversTheEpochOnce) {
  std::vector<std::unique_ptr<TrainingState>> g1(3);
  std::vector<Recorder> r1(3);
  r1[0].leave_after = 2;
  std::atomic<bool> abort{false};
  for (auto& end : RunGeneration(
           g1, r1, [](int rank) { return SyntheticJob(rank, 3); }, abort)) {
    ASSERT_THAT(end, IsOk());
  }
  const uint64_t left_at = g1[0]->progress().step;
  ASSERT_EQ(left_at, 3u);
  // New generation: a fresh joiner as rank 0, the survivors as ranks 1, 2;
  // rank 2 (old rank 2) is the source; the world shrinks to... stays 3.
  std::vector<std::unique_ptr<TrainingState>> g2(3);
  g2[1] = std::move(g1[1]);
  g2[2] = std::move(g1[2]);
  std::vector<Recorder> r2(3);
  auto ends = RunGeneration(
      g2, r2,
      [left_at](int rank) {
        v1::Assignment a = SyntheticJob(rank, 3, 2);
        a.set_source_rank(2);
        a.set_state_source(v1::STATE_SOURCE_MEMORY);
        a.set_start_step(left_at);
        return a;
      },
      abort);
  for (auto& end : ends) ASSERT_THAT(end, IsOk());
  for (int r = 0; r < 3; ++r) {
    ASSERT_FALSE(r2[r].started.empty());
    EXPECT_EQ(r2[r].started[0].step(), left_at);
    EXPECT_EQ(r2[r].steps.front().step(), left_at + 1);
    EXPECT_EQ(r2[r].steps.front().parameter_digest(), r2[0].steps.front().parameter_digest());
  }
  EXPECT_THAT(r2[0].details[0], HasSubstr("received from rank 2"));
  // Epoch 0: every index of 512 trained once in committed steps (3 steps
  // of 3 x 32 in generation 1, the rest in generation 2, padding aside).
  std::map<int64_t, int> seen;
  for (const auto* rs : {&r1, &r2}) {
    for (const Recorder& r : *rs) {
      for (size_t i = 0; i < r.indices.size() && i < r.steps.size(); ++i) {
        if (r.steps[i].epoch() != 0) continue;
        for (int64_t index : r.indices[i]) ++seen[index];
      }
    }
  }
  ASSERT_EQ(seen.size(), 512u);
  int repeats = 0;
  for (const auto& [index, n] : seen) repeats += n - 1;
  EXPECT_LT(repeats, 3);  // the last generation's padding only
}

// Leaving and coming back with the same world size changes nothing: the
// losses after the break and the final weights equal an unbroken run's,
// bit for bit, whether the state comes from a survivor's memory or a
// checkpoint file.
class ResumeTest : public testing::TestWithParam<v1::StateSource> {};

TEST_P(ResumeTest, SameWorldSize_SameLossesAndFinalWeightsAsUnbroken) {
  std::atomic<bool> abort{false};
  const std::string dir = testing::TempDir() + "/ddp-resume-" +
                          std::to_string(static_cast<int>(GetParam())) + "-" +
                          std::to_string(::getpid());
  auto job = [&dir](int rank, uint64_t generation) {
    v1::Assignment a = SyntheticJob(rank, 2, generation);
    a.mutable_spec()->mutable_optimizer()->set_kind("adam");
    a.mutable_spec()->mutable_optimizer()->set_lr(0.001);
    a.set_lr(0.001);
    a.mutable_spec()->mutable_checkpoint()->set_dir(dir);
    a.mutable_spec()->mutable_checkpoint()->set_every_steps(5);
    a.mutable_spec()->mutable_checkpoint()->set_keep(2);
    *a.mutable_spec() = WithDefaults(a.spec());  // Adam's betas and eps
    return a;
  };
  std::vector<std::unique_ptr<TrainingState>> whole(2);
  std::vector<Recorder> rw(2);
  for (auto& end : RunGeneration(
           whole, rw, [&](int r) { return job(r, 1); }, abort)) {
    ASSERT_THAT(end, IsOk());
  }
  const std::vector<float> whole0 = Flat(*whole[0]), whole1 = Flat(*whole[1]);
  whole.clear();  // finishes its checkpoint writes
  std::filesystem::remove_all(dir);

  std::vector<std::unique_ptr<TrainingState>> first(2);
  std::vector<Recorder> r1(2);
  r1[0].leave_after = 9;  // leaves after step 10, a checkpoint's step
  for (auto& end : RunGeneration(
           first, r1, [&](int r) { return job(r, 1); }, abort)) {
    ASSERT_THAT(end, IsOk());
  }
  ASSERT_EQ(first[0]->progress().step, 10u);
  std::vector<std::unique_ptr<TrainingState>> second(2);
  if (GetParam() == v1::STATE_SOURCE_MEMORY) second[1] = std::move(first[1]);
  first.clear();  // its checkpoint writer finishes
  std::vector<Recorder> r2(2);
  for (auto& end : RunGeneration(
           second, r2,
           [&](int r) {
             v1::Assignment a = job(r, 2);
             a.set_state_source(GetParam());
             a.set_source_rank(GetParam() == v1::STATE_SOURCE_MEMORY ? 1 : 0);
             a.set_start_step(10);
             return a;
           },
           abort)) {
    ASSERT_THAT(end, IsOk());
  }
  ASSERT_EQ(r2[0].steps.size() + 10, rw[0].steps.size());
  for (size_t i = 0; i < r2[0].steps.size(); ++i) {
    EXPECT_EQ(r2[0].steps[i].loss(), rw[0].steps[i + 10].loss()) << "step " << i + 11;
  }
  EXPECT_EQ(Flat(*second[0]), whole0);
  EXPECT_EQ(Flat(*second[1]), whole1);
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Sources, ResumeTest,
                         testing::Values(v1::STATE_SOURCE_MEMORY, v1::STATE_SOURCE_CHECKPOINT),
                         [](const testing::TestParamInfo<v1::StateSource>& info) {
                           return info.param == v1::STATE_SOURCE_MEMORY ? "Memory" : "Checkpoint";
                         });

}  // namespace
}  // namespace ddp
