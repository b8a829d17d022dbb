// Evaluation after an epoch: every rank evaluates its share, the result is
// the whole test set's, it has a bound of its own, and one lost with a rank
// is evaluated again by the next generation from the committed weights.
#include <map>

#include <torch/torch.h>

#include "gtest/gtest.h"
#include "tests/test_util.h"
#include "tests/torch/ranks.h"
#include "tests/torch/trainer_harness.h"
#include "worker/dataset.h"
#include "worker/evaluation.h"

namespace ddp {
namespace {

TEST(Evaluation, EpochToEvaluateFirst_Table) {
  struct Row {
    const char* name;
    uint64_t epoch, cursor;
    bool finished;
    uint64_t evaluated;
    std::optional<uint64_t> want;
  } rows[] = {
      {"the job's start", 0, 0, false, 0, std::nullopt},
      {"mid-epoch", 1, 640, false, 1, std::nullopt},
      {"an epoch's end, evaluated", 2, 0, false, 2, std::nullopt},
      {"an epoch's end, its result lost", 2, 0, false, 1, 1},
      {"the last step, its result lost", 3, 0, true, 2, 2},
      {"the last step, evaluated", 3, 0, true, 3, std::nullopt},
      {"max_steps part-way through an epoch, lost", 1, 640, true, 1, 1},
      {"an older gap is not re-run (its weights are gone)", 4, 0, false, 1, 3},
  };
  for (const Row& r : rows) {
    EXPECT_EQ(EpochToEvaluateFirst(r.epoch, r.cursor, r.finished, r.evaluated), r.want) << r.name;
  }
}

TEST(Evaluation, EvaluationBound_SpecOrTenTimesTheMeasuredForward) {
  v1::JobSpec spec;
  spec.set_collective_timeout_seconds(300);
  EXPECT_EQ(EvaluationBound(spec, 5000, 0), absl::Seconds(300)) << "nothing measured yet";
  EXPECT_EQ(EvaluationBound(spec, 5000, 0.002), absl::Seconds(100));
  spec.set_eval_timeout_seconds(7);
  EXPECT_EQ(EvaluationBound(spec, 5000, 0.002), absl::Seconds(7));
}

TEST(Evaluation, EvaluationShare_ContiguousCoveringOnce) {
  for (int world : {1, 2, 3, 7}) {
    int64_t next = 0;
    for (int r = 0; r < world; ++r) {
      const auto [begin, end] = EvaluationShare(1001, r, world);
      EXPECT_EQ(begin, next);
      EXPECT_LE(end - begin, 1001 / world + 1);
      next = end;
    }
    EXPECT_EQ(next, 1001);
  }
}

// `state`'s weights evaluated by one rank alone.
absl::StatusOr<EvaluationTotals> EvaluateAlone(TrainingState& state,
                                               std::function<bool()> aborted = nullptr) {
  absl::StatusOr<EvaluationTotals> totals = absl::UnknownError("not run");
  const v1::JobSpec spec = SyntheticJob(0, 1).spec();
  RunRanks(1, [&](int, Communicator* comm) {
    EvaluationInput in;
    in.spec = &spec;
    in.model = &state.model();
    in.test_x = state.data().test_x;
    in.test_y = state.data().test_y;
    in.aborted = std::move(aborted);
    totals = EvaluateTogether(in, comm);
  });
  return totals;
}

// A model that records the batch of every forward, the rest from `inner`.
class BatchRecorder : public Model {
 public:
  explicit BatchRecorder(Model& inner) : inner_(inner) {}
  at::Tensor Forward(const at::Tensor& x) override {
    batches.push_back(x.size(0));
    return inner_.Forward(x);
  }
  std::vector<NamedTensor> Parameters() override { return inner_.Parameters(); }
  std::vector<NamedTensor> Buffers() override { return inner_.Buffers(); }
  void SetTraining(bool training) override { inner_.SetTraining(training); }
  void To(const at::Device& device) override { inner_.To(device); }
  absl::Status Save(const std::string& path) override { return inner_.Save(path); }
  std::vector<int64_t> batches;

 private:
  Model& inner_;
};

// The job's check runs the model at eval_batch_size: evaluation forwards no
// more at once, and the result does not depend on it.
TEST(Evaluation, ForwardsInEvalBatchSizeChunks_SameResultAsOneChunk) {
  v1::JobSpec spec = SyntheticJob(0, 1).spec();
  absl::StatusOr<std::unique_ptr<TrainingState>> state = TrainingState::Create(spec);
  ASSERT_THAT(state, IsOk());
  const int64_t n = (*state)->data().test_x.size(0);
  ASSERT_GT(n, 100);
  std::map<int64_t, EvaluationTotals> by_chunk;
  for (const int64_t chunk : {int64_t{48}, n}) {
    spec.set_eval_batch_size(static_cast<uint32_t>(chunk));
    BatchRecorder recorder((*state)->model());
    RunRanks(1, [&](int, Communicator* comm) {
      EvaluationInput in;
      in.spec = &spec;
      in.model = &recorder;
      in.test_x = (*state)->data().test_x;
      in.test_y = (*state)->data().test_y;
      absl::StatusOr<EvaluationTotals> totals = EvaluateTogether(in, comm);
      ASSERT_THAT(totals, IsOk());
      by_chunk[chunk] = *totals;
    });
    ASSERT_FALSE(recorder.batches.empty());
    EXPECT_EQ(recorder.batches.front(), chunk);
    EXPECT_EQ(recorder.batches.size(), static_cast<size_t>((n + chunk - 1) / chunk));
    for (const int64_t b : recorder.batches) EXPECT_LE(b, chunk);
  }
  EXPECT_DOUBLE_EQ(by_chunk[48].test_accuracy, by_chunk[n].test_accuracy);
  EXPECT_NEAR(by_chunk[48].test_loss, by_chunk[n].test_loss, 1e-5);
}

TEST(Evaluation, SharedByThreeRanks_SameResultAsOneRankAlone) {
  std::vector<std::unique_ptr<TrainingState>> states(3);
  std::vector<Recorder> recorders(3);
  std::atomic<bool> abort{false};
  for (auto& end : RunGeneration(
           states, recorders, [](int rank) { return SyntheticJob(rank, 3); }, abort)) {
    ASSERT_THAT(end, IsOk());
  }
  ASSERT_EQ(recorders[0].epochs.size(), 2u);  // rank 0 reports
  EXPECT_TRUE(recorders[1].epochs.empty());
  // Every rank evaluated its share under a bound, then waited for the rest.
  for (const Recorder& r : recorders) {
    ASSERT_EQ(r.bounded.size(), 4u);
    EXPECT_EQ(r.bounded[0].first, v1::STEP_PHASE_EVALUATE);
    EXPECT_EQ(r.bounded[1].first, v1::STEP_PHASE_EVALUATE_WAIT);
    EXPECT_GT(r.bounded[0].second, absl::ZeroDuration());
  }
  const v1::EpochResult& last = recorders[0].epochs.back();
  absl::StatusOr<EvaluationTotals> alone = EvaluateAlone(*states[0]);
  ASSERT_THAT(alone, IsOk());
  EXPECT_DOUBLE_EQ(last.test_accuracy(), alone->test_accuracy);
  EXPECT_NEAR(last.test_loss(), alone->test_loss, 1e-5);
  EXPECT_GT(last.train_loss(), 0);
}

// The coordinator never got epoch 0's result (rank 0 died with it): the
// next generation, starting at epoch 0's end, evaluates it first, on the
// same weights, and gets the same numbers.
TEST(Evaluation, LostAtAnEpochsEnd_NextGenerationEvaluatesItFirst) {
  std::vector<std::unique_ptr<TrainingState>> g1(2);
  std::vector<Recorder> r1(2);
  r1[0].leave_after = 7;  // the vote rides in step 8, epoch 0's last
  std::atomic<bool> abort{false};
  for (auto& end : RunGeneration(
           g1, r1, [](int rank) { return SyntheticJob(rank, 2); }, abort)) {
    ASSERT_THAT(end, IsOk());
  }
  ASSERT_EQ(g1[0]->progress().epoch, 1u);
  ASSERT_EQ(g1[0]->progress().cursor, 0u);
  ASSERT_EQ(r1[0].epochs.size(), 1u);
  std::vector<Recorder> r2(2);
  for (auto& end : RunGeneration(
           g1, r2,
           [](int rank) {
             v1::Assignment a = SyntheticJob(rank, 2, 2);
             a.set_state_source(v1::STATE_SOURCE_MEMORY);
             a.set_start_step(8);
             a.set_start_epoch(1);
             a.set_evaluated_epochs(0);  // epoch 0's result never arrived
             return a;
           },
           abort)) {
    ASSERT_THAT(end, IsOk());
  }
  ASSERT_EQ(r2[0].epochs.size(), 2u);
  EXPECT_EQ(r2[0].epochs[0].epoch(), 0u);
  EXPECT_EQ(r2[0].epochs[0].generation(), 2u);
  EXPECT_DOUBLE_EQ(r2[0].epochs[0].test_accuracy(), r1[0].epochs[0].test_accuracy());
  EXPECT_EQ(r2[0].epochs[1].epoch(), 1u);
}

// Rank 0 died after the job's last step, before its evaluation: the next
// generation trains nothing, but evaluates the final weights.
TEST(Evaluation, LostAfterTheLastStep_NextGenerationEvaluatesTheFinalModel) {
  std::vector<std::unique_ptr<TrainingState>> g1(2);
  std::vector<Recorder> r1(2);
  std::atomic<bool> abort{false};
  for (auto& end : RunGeneration(
           g1, r1, [](int rank) { return SyntheticJob(rank, 2); }, abort)) {
    ASSERT_THAT(end, IsOk());
  }
  ASSERT_TRUE(g1[0]->finished());
  std::vector<Recorder> r2(2);
  auto ends = RunGeneration(
      g1, r2,
      [](int rank) {
        v1::Assignment a = SyntheticJob(rank, 2, 2);
        a.set_state_source(v1::STATE_SOURCE_MEMORY);
        a.set_start_step(16);
        a.set_evaluated_epochs(1);  // epoch 1's, the last, never arrived
        return a;
      },
      abort);
  for (auto& end : ends) ASSERT_THAT(end, IsOk());
  EXPECT_EQ(*ends[0], GenerationEnd::kFinished);
  EXPECT_TRUE(r2[0].steps.empty());
  ASSERT_EQ(r2[0].epochs.size(), 1u);
  EXPECT_EQ(r2[0].epochs[0].epoch(), 1u);
  EXPECT_DOUBLE_EQ(r2[0].epochs[0].test_accuracy(), r1[0].epochs[1].test_accuracy());
}

TEST(Evaluation, AbortedDuringTheShare_ReturnsAborted) {
  std::unique_ptr<TrainingState> state = NewState(SyntheticJob(0, 1));
  EXPECT_THAT(EvaluateAlone(*state, [] { return true; }), StatusIs(absl::StatusCode::kAborted));
}

}  // namespace
}  // namespace ddp
