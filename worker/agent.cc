#include "worker/agent.h"

#include <unistd.h>

#include <fstream>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/job_spec.h"
#include "common/logging.h"
#include "common/version.h"
#include "grpcpp/grpcpp.h"

namespace ddp {

WorkerAgent::WorkerAgent(Options options)
    : options_(std::move(options)), outbox_(RealClock::Get(), Outbox::Options{}) {}

WorkerAgent::~WorkerAgent() {
  absl::MutexLock lock(&mu_);
  run_.reset();
}

void WorkerAgent::Shutdown() {
  stopping_ = true;
  outbox_.Interrupt();
  absl::MutexLock lock(&mu_);
  if (session_context_) session_context_->TryCancel();
  if (run_) run_->Abort("the worker is shutting down");
}

namespace {

// Host name and kernel boot id: equal for processes that can share memory
// (two containers on one kernel have different host names, and usually
// separate /dev/shm, so they differ too).
std::string MachineId() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  std::string boot_id;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot_id;
  return absl::StrCat(host, "/", boot_id);
}

}  // namespace

v1::RegisterRequest WorkerAgent::MakeRegister() const {
  v1::RegisterRequest r;
  r.set_machine_id(MachineId());
  r.set_host(options_.host);
  r.set_device(options_.device.ToString());
  r.set_pid(::getpid());
  r.set_version(kVersion);
  r.set_name(options_.name);
  auto* caps = r.mutable_capabilities();
  caps->add_backends("gloo");
  if (ThisBuild().nccl) caps->add_backends("nccl");
  caps->set_cuda(ThisBuild().nccl);
  caps->set_cpu_threads(options_.threads);
  return r;
}

void WorkerAgent::StartGeneration(const v1::Assignment& assignment,
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
  GenerationRun::Environment env{std::move(stub), options_.host, options_.device,
                                 options_.metrics_file, options_.send_reports};
  absl::MutexLock lock(&mu_);
  if (stopping_) return;
  run_ = std::make_unique<GenerationRun>(assignment, std::move(env), &outbox_, &board_);
}

void WorkerAgent::AbortGeneration(uint64_t generation, const std::string& reason) {
  absl::MutexLock lock(&mu_);
  if (run_ && (generation == 0 || run_->generation() == generation)) run_->Abort(reason);
}

void WorkerAgent::SendLoop(
    grpc::ClientReaderWriterInterface<v1::WorkerMessage, v1::CoordinatorMessage>* stream,
    absl::Duration heartbeat_interval, std::atomic<bool>* done) {
  absl::Time next_heartbeat = absl::Now();
  while (!*done) {
    for (v1::WorkerMessage& message : outbox_.Take(next_heartbeat)) {
      if (!stream->Write(message)) return;  // the reader sees the broken stream
    }
    if (absl::Now() >= next_heartbeat) {
      v1::WorkerMessage hb;
      hb.mutable_heartbeat()->set_generation(board_.generation);
      hb.mutable_heartbeat()->set_step(board_.step);
      hb.mutable_heartbeat()->set_phase(static_cast<v1::StepPhase>(board_.phase.load()));
      if (!stream->Write(hb)) return;
      next_heartbeat = absl::Now() + heartbeat_interval;
    }
  }
}

WorkerAgent::SessionEnd WorkerAgent::RunSession() {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Reconnect quickly once the coordinator is back; our own backoff paces us.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  std::shared_ptr<v1::Coordinator::StubInterface> stub = v1::Coordinator::NewStub(
      grpc::CreateCustomChannel(options_.coordinator, grpc::InsecureChannelCredentials(), args));
  grpc::ClientContext context;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return SessionEnd::kStopped;
    session_context_ = &context;
  }
  auto clear_context = [&] {
    absl::MutexLock lock(&mu_);
    session_context_ = nullptr;
  };
  auto stream = stub->Attach(&context);
  v1::WorkerMessage hello;
  *hello.mutable_register_() = MakeRegister();
  v1::CoordinatorMessage reply;
  if (!stream->Write(hello) || !stream->Read(&reply) || !reply.has_registered()) {
    context.TryCancel();
    const grpc::Status status = stream->Finish();
    clear_context();
    if (status.error_code() == grpc::StatusCode::INVALID_ARGUMENT ||
        status.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
      DDP_LOG(Error) << "the coordinator refused this worker: " << status.error_message();
      return SessionEnd::kFatal;
    }
    if (status.error_code() == grpc::StatusCode::ALREADY_EXISTS) {
      DDP_LOG(Warning) << status.error_message() << "; retrying";
    }
    return stopping_ ? SessionEnd::kStopped : SessionEnd::kRetry;
  }
  const v1::Registered& registered = reply.registered();
  SetLogIdentity(absl::StrCat("worker ", registered.worker_id()));
  DDP_LOG(Info) << "attached to coordinator " << options_.coordinator << " as "
                << registered.worker_id();
  outbox_.Clear();
  std::atomic<bool> send_done{false};
  std::thread sender([&] {
    SendLoop(stream.get(), absl::Milliseconds(registered.heartbeat_interval_ms()), &send_done);
  });

  SessionEnd end = SessionEnd::kRetry;
  v1::CoordinatorMessage message;
  while (stream->Read(&message)) {
    if (message.has_assignment()) {
      StartGeneration(message.assignment(), stub);
    } else if (message.has_abort()) {
      DDP_LOG(Warning) << "abort generation " << message.abort().generation() << ": "
                       << message.abort().reason();
      AbortGeneration(message.abort().generation(), message.abort().reason());
    } else if (message.has_stop()) {
      DDP_LOG(Info) << "stop: " << message.stop().reason();
      end = SessionEnd::kStopped;
      stopping_ = true;
      break;
    } else if (message.has_rejected()) {
      DDP_LOG(Warning) << "the coordinator refused a message: " << message.rejected().message();
    }
  }
  if (end != SessionEnd::kStopped && !stopping_) {
    DDP_LOG(Warning) << "lost the coordinator; leaving any generation and reconnecting";
  }
  // The coordinator has marked this worker lost (or is gone): a generation
  // in flight can't finish, so leave it.
  AbortGeneration(0, "lost the coordinator");
  {
    absl::MutexLock lock(&mu_);
    run_.reset();
  }
  send_done = true;
  outbox_.Interrupt();
  context.TryCancel();
  sender.join();
  stream->Finish();
  clear_context();
  return stopping_ ? SessionEnd::kStopped : end;
}

int WorkerAgent::Run() {
  std::mt19937 rng(::getpid());
  absl::Duration backoff = options_.min_backoff;
  bool announced = false;
  while (!stopping_) {
    const absl::Time start = absl::Now();
    const SessionEnd end = RunSession();
    if (end == SessionEnd::kFatal) return 2;
    if (end == SessionEnd::kStopped || stopping_) break;
    // A session that lasted was healthy: start the backoff over.
    if (absl::Now() - start > absl::Seconds(10)) backoff = options_.min_backoff;
    if (!announced) {
      DDP_LOG(Info) << "waiting for the coordinator at " << options_.coordinator;
      announced = true;
    }
    std::uniform_real_distribution<double> jitter(0.5, 1.0);
    const absl::Time wake = absl::Now() + backoff * jitter(rng);
    while (!stopping_ && absl::Now() < wake) absl::SleepFor(absl::Milliseconds(20));
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
  return 0;
}

}  // namespace ddp
