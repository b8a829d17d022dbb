#include "worker/agent.h"

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/coordinator_targets.h"
#include "common/job_spec.h"
#include "common/logging.h"
#include "worker/confinement.h"
#include "worker/generation_run.h"
#include "worker/in_process_jobs.h"
#include "worker/link/worker_metrics.h"
#include "worker/process/isolated_jobs.h"

namespace ddp {
namespace {

std::unique_ptr<SharedBoard> BoardFor(const WorkerAgent::Options& options) {
  if (options.job_process_binary.empty()) return nullptr;
  absl::StatusOr<std::unique_ptr<SharedBoard>> board = SharedBoard::Create();
  if (board.ok()) return std::move(*board);
  DDP_LOG(Warning) << "jobs will run in the daemon's own process: " << board.status().message();
  return nullptr;
}

// Each coordinator address's worker token: the one given, or the one a
// local coordinator made (looked up now: the job's process can't read it).
std::map<std::string, std::string> TokensFor(const CoordinatorLink::Options& link) {
  std::map<std::string, std::string> tokens;
  absl::StatusOr<std::vector<std::string>> addresses = ParseCoordinatorList(link.coordinator);
  if (!addresses.ok()) return tokens;
  for (const std::string& address : *addresses) {
    std::string token = WorkerTokenFor(address, link.security, link.find_local_token);
    if (!token.empty()) tokens[address] = std::move(token);
  }
  return tokens;
}

}  // namespace

WorkerAgent::WorkerAgent(Options options)
    : options_(std::move(options)),
      outbox_(RealClock::Get(), Outbox::Options{}),
      shared_board_(BoardFor(options_)),
      board_(shared_board_ ? shared_board_->board() : &own_board_),
      link_(RealClock::Get(), options_.link, this, &outbox_, board_) {
  if (options_.metrics != nullptr) options_.metrics->WatchReports(&outbox_);
  jobs_ = MakeJobs();
}

std::unique_ptr<JobRunner> WorkerAgent::MakeJobs() {
  JobConfinementOptions confinement;
  confinement.gpu = options_.device.is_cuda();
  confinement.allow_unconfined = options_.allow_unconfined;
  confinement.files = {options_.metrics_file, options_.index_log};
  if (shared_board_ == nullptr) {
    GenerationRun::Environment env;
    env.leader_stubs = link_.stub_factory();
    env.host = options_.host;
    env.device = options_.device;
    env.metrics_file = options_.metrics_file;
    if (options_.metrics != nullptr) {
      env.on_step = [metrics = options_.metrics](const v1::StepReport& report, uint32_t rank) {
        metrics->OnStep(report, rank);
      };
    }
    env.index_log = options_.index_log;
    env.send_reports = options_.send_reports;
    env.debug_hang_file = options_.debug_hang_file;
    env.confinement = confinement;
    return std::make_unique<InProcessJobs>(std::move(env), &outbox_, board_);
  }
  IsolatedJobs::Options o;
  o.binary = options_.job_process_binary;
  v1::JobProcessStart& s = o.settings;
  s.set_host(options_.host);
  s.set_device(options_.device.ToString());
  s.set_threads(options_.threads);
  s.set_deterministic(options_.deterministic);
  s.set_metrics_file(options_.metrics_file);
  s.set_index_log(options_.index_log);
  s.set_debug_hang_file(options_.debug_hang_file);
  s.set_send_reports(options_.send_reports);
  s.set_allow_unconfined(options_.allow_unconfined);
  s.set_log_identity(options_.name.empty() ? "worker" : "worker " + options_.name);
  const ClientSecurity& security = options_.link.security;
  s.set_tls(security.tls);
  s.set_ca_pem(security.ca_pem);
  s.set_cert_pem(security.cert_pem);
  s.set_key_pem(security.key_pem);
  o.tokens = [link = options_.link] { return TokensFor(link); };
  o.send_reports = options_.send_reports;
  o.metrics = options_.metrics;
  return std::make_unique<IsolatedJobs>(std::move(o), &outbox_, shared_board_.get());
}

WorkerAgent::~WorkerAgent() {
  jobs_.reset();
  // A scrape may still come; the outbox goes with the agent.
  if (options_.metrics != nullptr) options_.metrics->WatchReports(nullptr);
}

void WorkerAgent::Shutdown() {
  stopping_ = true;
  link_.Shutdown();
  jobs_->AbortAny("the worker is shutting down");
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
  jobs_->Claim(&r);
  return r;
}

void WorkerAgent::OnAssignment(const v1::Assignment& assignment,
                               std::shared_ptr<v1::Coordinator::StubInterface> stub) {
  if (stopping_) return;
  jobs_->Assign(assignment, link_.session_target(), std::move(stub));
}

void WorkerAgent::OnAbort(const v1::Abort& abort) {
  if (!abort.at_step_boundary()) {
    DDP_LOG(Warning) << "abort generation " << abort.generation() << ": " << abort.reason();
  } else {
    DDP_LOG(Info) << "leaving generation " << abort.generation()
                  << " at the next step boundary: " << abort.reason();
  }
  jobs_->Abort(abort);
}

void WorkerAgent::OnPrepare(const v1::Prepare& prepare) {
  DDP_LOG(Info) << "preparing job " << prepare.job_id() << " (data, model, optimizer)";
  jobs_->Prepare(prepare);
}

void WorkerAgent::OnDropped(const std::string& why) {
  // Its generation goes on without it: leave (keeping the state) and attach
  // anew.
  jobs_->AbortAny(absl::StrCat("dropped by the coordinator: ", why));
}

void WorkerAgent::OnStopping(const std::string& /*reason*/) {
  stopping_ = true;
  jobs_->AbortAny("the worker is stopping");
  jobs_->Stop();
}

}  // namespace ddp
