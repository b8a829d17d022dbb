// The trainer on in-process ranks: a synthetic job, an observer that
// records what it reports, and one generation run on N threads.
#ifndef DDP_TESTS_TORCH_TRAINER_HARNESS_H_
#define DDP_TESTS_TORCH_TRAINER_HARNESS_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tests/test_util.h"
#include "tests/torch/ranks.h"
#include "worker/model.h"
#include "worker/trainer.h"
#include "worker/training_state.h"

namespace ddp {

// Collects what the trainer reports; can ask to leave after a given step.
class Recorder final : public TrainingObserver {
 public:
  void OnPhase(v1::StepPhase, uint64_t) override {}
  void OnBoundedPhase(v1::StepPhase phase, uint64_t, absl::Duration bound) override {
    bounded.emplace_back(phase, bound);
  }
  void OnStarted(const v1::HeldState& held, const std::string& detail) override {
    started.push_back(held);
    details.push_back(detail);
  }
  void OnStepIndices(uint64_t, uint64_t, absl::Span<const int64_t> i) override {
    indices.emplace_back(i.begin(), i.end());
  }
  void OnStep(const v1::StepReport& r, uint64_t, uint64_t) override {
    steps.push_back(r);
    if (r.step() == leave_after) leave = true;
  }
  void OnEpoch(const v1::EpochResult& r) override { epochs.push_back(r); }
  std::vector<v1::HeldState> started;
  std::vector<std::string> details;
  std::vector<std::vector<int64_t>> indices;
  std::vector<v1::StepReport> steps;
  std::vector<v1::EpochResult> epochs;
  std::vector<std::pair<v1::StepPhase, absl::Duration>> bounded;
  uint64_t leave_after = 0;
  std::atomic<bool> leave{false};
};

inline v1::Assignment SyntheticJob(int rank, int world, uint64_t generation = 1) {
  v1::Assignment a;
  a.set_job_id("t");
  a.set_generation(generation);
  a.set_rank(rank);
  a.set_world_size(world);
  a.set_sampler_seed(3);
  a.set_state_source(v1::STATE_SOURCE_FRESH);
  v1::JobSpec* spec = a.mutable_spec();
  spec->set_name("t");
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
  a.set_lr(0.05);
  return a;
}

inline std::unique_ptr<TrainingState> NewState(const v1::Assignment& a) {
  auto state = TrainingState::Create(a.spec());
  EXPECT_THAT(state, IsOk());
  return std::move(*state);
}

// Runs one generation on `states` (one per rank, made fresh when null).
inline std::vector<absl::StatusOr<GenerationEnd>> RunGeneration(
    std::vector<std::unique_ptr<TrainingState>>& states, std::vector<Recorder>& recorders,
    const std::function<v1::Assignment(int)>& assignment, const std::atomic<bool>& abort) {
  const int world = static_cast<int>(states.size());
  std::vector<absl::StatusOr<GenerationEnd>> ends(world, absl::UnknownError("not run"));
  // Made one after another: built-in models draw their initial weights from
  // LibTorch's process-wide generator (one process per rank in real life).
  for (int rank = 0; rank < world; ++rank) {
    if (!states[rank]) states[rank] = NewState(assignment(rank));
  }
  RunRanks(world, [&](int rank, Communicator* comm) {
    const v1::Assignment a = assignment(rank);
    GenerationControl control;
    control.abort = &abort;
    control.leave = &recorders[rank].leave;
    ends[rank] = TrainGeneration(a, states[rank].get(), comm, &recorders[rank], control);
  });
  return ends;
}

inline std::vector<float> Flat(TrainingState& state) {
  std::vector<float> out;
  for (auto& [name, t] : state.model().Parameters()) {
    at::Tensor c = t.contiguous();
    out.insert(out.end(), c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
  }
  return out;
}

}  // namespace ddp

#endif  // DDP_TESTS_TORCH_TRAINER_HARNESS_H_
