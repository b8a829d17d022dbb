#include "worker/agent.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "common/logging.h"
#include "worker/link/worker_metrics.h"
#include "worker/training_state.h"

namespace ddp {

WorkerAgent::WorkerAgent(Options options)
    : options_(std::move(options)),
      outbox_(RealClock::Get(), Outbox::Options{}),
      preparer_(&slot_, &outbox_, Confinement(), options_.device),
      link_(RealClock::Get(), options_.link, this, &outbox_, &board_) {
  if (options_.metrics != nullptr) options_.metrics->WatchReports(&outbox_);
}

JobConfinementOptions WorkerAgent::Confinement() const {
  JobConfinementOptions c;
  c.gpu = options_.device.is_cuda();
  c.allow_unconfined = options_.allow_unconfined;
  c.files = {options_.metrics_file, options_.index_log};
  return c;
}

WorkerAgent::~WorkerAgent() {
  {
    absl::MutexLock lock(&mu_);
    run_.reset();
  }
  // A scrape may still come; the outbox goes with the agent.
  if (options_.metrics != nullptr) options_.metrics->WatchReports(nullptr);
}

void WorkerAgent::Shutdown() {
  stopping_ = true;
  link_.Shutdown();
  absl::MutexLock lock(&mu_);
  if (run_) run_->Abort("the worker is shutting down");
}

int WorkerAgent::Run() { return link_.Run(); }

v1::RegisterRequest WorkerAgent::MakeRegister() {
  v1::RegisterRequest r;
  r.set_host(options_.host);
  r.set_device(options_.device.ToString());
  r.set_name(options_.name);
  r.mutable_labels()->insert(options_.labels.begin(), options_.labels.end());
  auto* caps = r.mutable_capabilities();
  caps->add_backends("gloo");
  // Every build binds NCCL at run time; one that can't load it fails the
  // generation with NCCL's own FAILED_PRECONDITION when it connects.
  caps->add_backends("nccl");
  caps->set_cuda(ThisBuild().cuda);
  caps->set_cpu_threads(options_.threads);
  // What it trains in and holds, so that a restarted coordinator can adopt
  // its generation, or re-form from its state.
  absl::MutexLock lock(&mu_);
  // A run that finished the job still claims its generation, so that a
  // coordinator that restarted meanwhile can count it done there.
  if (run_ && (!run_->finished() || run_->done())) {
    const v1::Assignment& a = run_->assignment();
    r.set_generation(a.generation());
    r.set_rank(a.rank());
    v1::HeldState* held = r.mutable_held();
    held->set_job_id(a.job_id());
    held->set_spec_digest(SpecDigest(a.spec()));
    held->set_step(board_.step);
    held->set_epoch(board_.epoch);
    held->set_cursor(board_.cursor);
    held->set_generation(a.generation());
    return r;
  }
  absl::MutexLock slot_lock(&slot_.mu);
  if (slot_.state) *r.mutable_held() = slot_.state->Held();
  return r;
}

void WorkerAgent::OnAssignment(const v1::Assignment& assignment,
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
  GenerationRun::Environment env;
  env.stub = std::move(stub);
  env.leader_stubs = link_.stub_factory();
  env.host = options_.host;
  env.device = options_.device;
  env.metrics_file = options_.metrics_file;
  env.metrics = options_.metrics;
  env.index_log = options_.index_log;
  env.send_reports = options_.send_reports;
  env.debug_hang_file = options_.debug_hang_file;
  env.confinement = Confinement();
  absl::MutexLock lock(&mu_);
  if (stopping_) return;
  run_ = std::make_unique<GenerationRun>(assignment, std::move(env), &outbox_, &board_, &slot_);
}

void WorkerAgent::AbortGeneration(uint64_t generation, const std::string& reason) {
  absl::MutexLock lock(&mu_);
  if (run_ && (generation == 0 || run_->generation() == generation)) run_->Abort(reason);
}

void WorkerAgent::OnAbort(const v1::Abort& abort) {
  if (!abort.at_step_boundary()) {
    DDP_LOG(Warning) << "abort generation " << abort.generation() << ": " << abort.reason();
    AbortGeneration(abort.generation(), abort.reason());
    return;
  }
  DDP_LOG(Info) << "leaving generation " << abort.generation()
                << " at the next step boundary: " << abort.reason();
  absl::MutexLock lock(&mu_);
  if (!run_ || run_->generation() != abort.generation()) return;
  if (abort.checkpoint()) {
    run_->LeaveAndCheckpoint(abort.reason());
  } else {
    run_->LeaveAtStepBoundary(abort.reason());
  }
}

void WorkerAgent::OnPrepare(const v1::Prepare& prepare) {
  DDP_LOG(Info) << "preparing job " << prepare.job_id() << " (data, model, optimizer)";
  preparer_.Prepare(prepare);
}

void WorkerAgent::OnDropped(const std::string& why) {
  // Its generation goes on without it: leave (keeping the state) and attach
  // anew.
  AbortGeneration(0, absl::StrCat("dropped by the coordinator: ", why));
}

void WorkerAgent::OnStopping(const std::string& /*reason*/) {
  stopping_ = true;
  AbortGeneration(0, "the worker is stopping");
  absl::MutexLock lock(&mu_);
  run_.reset();
}

}  // namespace ddp
