#include "worker/in_process_jobs.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "common/logging.h"
#include "worker/training_state.h"

namespace ddp {

InProcessJobs::InProcessJobs(GenerationRun::Environment env, Outbox* outbox, ProgressBoard* board)
    : env_(std::move(env)),
      outbox_(outbox),
      board_(board),
      preparer_(&slot_, outbox_, env_.confinement, env_.device) {}

InProcessJobs::~InProcessJobs() {
  absl::MutexLock lock(&mu_);
  run_.reset();
}

void InProcessJobs::Claim(v1::RegisterRequest* r) {
  absl::MutexLock lock(&mu_);
  // A run that finished the job still claims its generation, so that a
  // coordinator that restarted meanwhile can count it done there.
  if (run_ && (!run_->finished() || run_->done())) {
    const v1::Assignment& a = run_->assignment();
    r->set_generation(a.generation());
    r->set_rank(a.rank());
    v1::HeldState* held = r->mutable_held();
    held->set_job_id(a.job_id());
    held->set_spec_digest(SpecDigest(a.spec()));
    held->set_step(board_->step);
    held->set_epoch(board_->epoch);
    held->set_cursor(board_->cursor);
    held->set_generation(a.generation());
    return;
  }
  absl::MutexLock slot_lock(&slot_.mu);
  if (slot_.state) *r->mutable_held() = slot_.state->Held();
}

void InProcessJobs::Assign(const v1::Assignment& assignment, const std::string& target,
                           std::shared_ptr<v1::Coordinator::StubInterface> stub) {
  std::unique_ptr<GenerationRun> old;
  {
    absl::MutexLock lock(&mu_);
    old = std::move(run_);
  }
  // Never in two generations at once: the old one ends first.
  if (old) {
    old->Abort(absl::StrCat("assigned to generation ", assignment.generation()));
    old.reset();
  }
  GenerationRun::Environment env = env_;
  env.stub = stub != nullptr ? std::move(stub) : env_.leader_stubs(target);
  absl::MutexLock lock(&mu_);
  if (stopping_) return;
  run_ = std::make_unique<GenerationRun>(assignment, std::move(env), outbox_, board_, &slot_);
}

void InProcessJobs::AbortGeneration(uint64_t generation, const std::string& reason) {
  absl::MutexLock lock(&mu_);
  if (run_ && (generation == 0 || run_->generation() == generation)) run_->Abort(reason);
}

void InProcessJobs::Abort(const v1::Abort& abort) {
  if (!abort.at_step_boundary()) {
    AbortGeneration(abort.generation(), abort.reason());
    return;
  }
  absl::MutexLock lock(&mu_);
  if (!run_ || run_->generation() != abort.generation()) return;
  if (abort.checkpoint()) {
    run_->LeaveAndCheckpoint(abort.reason());
  } else {
    run_->LeaveAtStepBoundary(abort.reason());
  }
}

void InProcessJobs::AbortAny(const std::string& reason) { AbortGeneration(0, reason); }

void InProcessJobs::Prepare(const v1::Prepare& prepare) { preparer_.Prepare(prepare); }

void InProcessJobs::Stop() {
  stopping_ = true;
  AbortGeneration(0, "the worker is stopping");
  absl::MutexLock lock(&mu_);
  run_.reset();
}

}  // namespace ddp
