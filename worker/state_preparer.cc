#include "worker/state_preparer.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/job_spec.h"
#include "common/logging.h"
#include "worker/training_state.h"

namespace ddp {

StatePreparer::StatePreparer(StateSlot* slot, Outbox* outbox, JobConfinementOptions confinement,
                             Device device)
    : slot_(slot), outbox_(outbox), confinement_(std::move(confinement)), device_(device) {
  thread_ = std::thread([this] { Loop(); });
}

StatePreparer::~StatePreparer() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void StatePreparer::Prepare(const v1::Prepare& prepare) {
  absl::MutexLock lock(&mu_);
  pending_ = prepare;
}

void StatePreparer::Loop() {
  while (true) {
    v1::Prepare prepare;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](StatePreparer* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) {
            return p->stopping_ || p->pending_.has_value();
          },
          this));
      if (stopping_) return;
      prepare = std::move(*pending_);
      pending_.reset();
    }
    Build(prepare);
  }
}

void StatePreparer::Build(const v1::Prepare& prepare) {
  const std::string digest = SpecDigest(prepare.spec());
  {
    absl::MutexLock lock(&slot_->mu);
    if (slot_->state && slot_->state->identity().job_id == prepare.job_id() &&
        slot_->state->identity().spec_digest == digest) {
      const v1::HeldState held = slot_->state->Held();
      Push(v1::WORKER_STATE_IDLE, absl::StrCat("holds job ", prepare.job_id(), "'s state"), &held,
           absl::StatusCode::kOk);
      return;
    }
    // A run assigned meanwhile waits for this state instead of building its
    // own.
    slot_->preparing = true;
  }
  const absl::Time start = absl::Now();
  // Loading runs the job's code (a TorchScript module's __setstate__): on a
  // thread of its own, confined to the job, as its generations will be.
  absl::StatusOr<std::unique_ptr<TrainingState>> created =
      absl::InternalError("the preparing thread didn't run");
  std::thread([&] {
    absl::Status confined = ConfineJobThread(prepare.spec(), confinement_);
    created = confined.ok() ? TrainingState::Create(prepare.spec(), device_)
                            : absl::StatusOr<std::unique_ptr<TrainingState>>(confined);
  }).join();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  std::shared_ptr<TrainingState> state;
  {
    absl::MutexLock lock(&slot_->mu);
    slot_->preparing = false;
    if (created.ok()) {
      state = std::move(*created);
      slot_->state = state;  // another job's state, if any, is dropped
    }
  }
  if (!created.ok()) {
    const std::string why = ExplainRefusal(std::string(created.status().message()));
    DDP_LOG(Error) << "can't prepare job " << prepare.job_id() << ": " << why;
    Push(v1::WORKER_STATE_FAILED, absl::StrCat("can't prepare job ", prepare.job_id(), ": ", why),
         nullptr, created.status().code());
    Push(v1::WORKER_STATE_IDLE, "after a failed preparation", nullptr, absl::StatusCode::kOk);
    return;
  }
  DDP_LOG(Info) << absl::StrFormat("prepared job %s in %.2fs: data, model and optimizer built",
                                   prepare.job_id(), seconds);
  const v1::HeldState held = state->Held();
  Push(v1::WORKER_STATE_IDLE,
       absl::StrFormat("prepared job %s in %.2fs", prepare.job_id(), seconds), &held,
       absl::StatusCode::kOk);
}

void StatePreparer::Push(v1::WorkerState state, const std::string& detail,
                         const v1::HeldState* held, absl::StatusCode code) {
  v1::WorkerMessage message;
  v1::StateChange* change = message.mutable_state();
  change->set_state(state);
  change->set_detail(detail);
  // An IDLE without a held state says the worker holds none.
  *change->mutable_held() = held ? *held : v1::HeldState();
  change->set_code(static_cast<int>(code));
  outbox_->Push(std::move(message));
}

}  // namespace ddp
