#include "worker/coordinator_link.h"

#include <unistd.h>

#include <fstream>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/local_tokens.h"
#include "common/logging.h"
#include "common/tokens.h"
#include "common/version.h"
#include "grpcpp/grpcpp.h"
#include "worker/refusal.h"

namespace ddp {
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

// Cancels a call unless disarmed within `timeout`.
class Watchdog {
 public:
  Watchdog(grpc::ClientContext* context, absl::Duration timeout)
      : thread_([this, context, timeout] {
          absl::MutexLock lock(&mu_);
          if (!mu_.AwaitWithTimeout(absl::Condition(&disarmed_), timeout)) {
            fired_ = true;
            context->TryCancel();
          }
        }) {}
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;
  ~Watchdog() { Disarm(); }

  // Stops the clock; returns whether it had fired (and cancelled the call).
  bool Disarm() {
    {
      absl::MutexLock lock(&mu_);
      disarmed_ = true;
    }
    if (thread_.joinable()) thread_.join();
    absl::MutexLock lock(&mu_);
    return fired_;
  }

 private:
  absl::Mutex mu_;
  bool disarmed_ ABSL_GUARDED_BY(mu_) = false;
  bool fired_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: it starts once the fields above exist
};

}  // namespace

CoordinatorLink::CoordinatorLink(Options options, Handler* handler, Outbox* outbox,
                                 const ProgressBoard* board)
    : options_(std::move(options)), handler_(handler), outbox_(outbox), board_(board) {}

void CoordinatorLink::Shutdown() {
  stopping_ = true;
  outbox_->Interrupt();
  absl::MutexLock lock(&mu_);
  if (context_) context_->TryCancel();
}

std::string CoordinatorLink::last_error() const {
  absl::MutexLock lock(&mu_);
  return last_error_;
}

v1::RegisterRequest CoordinatorLink::MakeRegister() {
  v1::RegisterRequest r = handler_->MakeRegister();
  r.set_machine_id(MachineId());
  r.set_pid(::getpid());
  r.set_version(kVersion);
  return r;
}

void CoordinatorLink::SendLoop(
    grpc::ClientReaderWriterInterface<v1::WorkerMessage, v1::CoordinatorMessage>* stream,
    absl::Duration heartbeat_interval, std::atomic<bool>* done) {
  absl::Time next_heartbeat = absl::Now();
  while (!*done) {
    std::vector<v1::WorkerMessage> due = outbox_->Take(next_heartbeat);
    for (size_t i = 0; i < due.size(); ++i) {
      if (!stream->Write(due[i])) {
        // The reader sees the broken stream; what was not sent waits for the
        // next session.
        outbox_->Requeue(std::vector<v1::WorkerMessage>(std::make_move_iterator(due.begin() + i),
                                                        std::make_move_iterator(due.end())));
        return;
      }
    }
    if (absl::Now() >= next_heartbeat) {
      v1::WorkerMessage hb;
      hb.mutable_heartbeat()->set_generation(board_->generation);
      hb.mutable_heartbeat()->set_step(board_->step);
      hb.mutable_heartbeat()->set_phase(static_cast<v1::StepPhase>(board_->phase.load()));
      hb.mutable_heartbeat()->set_phase_bound_seconds(board_->phase_bound_seconds.load());
      if (!stream->Write(hb)) return;
      next_heartbeat = absl::Now() + heartbeat_interval;
    }
  }
}

CoordinatorLink::SessionEnd CoordinatorLink::RunSession() {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Reconnect quickly once the coordinator is back; our own backoff paces us.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  ClientSecurity security = options_.security;
  if (security.token.empty() && options_.find_local_token) {
    if (const std::string file = FindLocalTokenFile(options_.coordinator, Role::kWorker);
        !file.empty()) {
      absl::StatusOr<std::string> token = LoadTokenFile("the coordinator's worker token", file);
      if (token.ok()) security.token = *token;
    }
  }
  std::shared_ptr<v1::Coordinator::StubInterface> stub =
      v1::Coordinator::NewStub(MakeChannel(options_.coordinator, security, args));
  grpc::ClientContext context;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return SessionEnd::kStopped;
    context_ = &context;
  }
  auto clear_context = [&] {
    absl::MutexLock lock(&mu_);
    context_ = nullptr;
  };
  // The stream lives for days, so it has no deadline of its own; only the
  // handshake has one. Armed before the call starts: opening it already
  // waits for the transport.
  Watchdog handshake(&context, options_.register_timeout);
  auto stream = stub->Attach(&context);
  v1::WorkerMessage hello;
  *hello.mutable_register_() = MakeRegister();
  v1::CoordinatorMessage reply;
  if (!stream->Write(hello) || !stream->Read(&reply) || !reply.has_registered()) {
    // Read the coordinator's own word on why (cancelling first would hide it).
    stream->WritesDone();
    const grpc::Status status = stream->Finish();
    const bool timed_out = handshake.Disarm();
    clear_context();
    if (stopping_) return SessionEnd::kStopped;
    return OnRegisterFailed(status, timed_out);
  }
  handshake.Disarm();
  complaints_.Reset();
  unreachable_since_ = absl::InfiniteFuture();
  {
    absl::MutexLock lock(&mu_);
    last_error_.clear();
  }
  ever_attached_ = true;
  const v1::Registered& registered = reply.registered();
  SetLogIdentity(absl::StrCat("worker ", registered.worker_id()));
  DDP_LOG(Info) << "attached to coordinator " << options_.coordinator << " as "
                << registered.worker_id();
  // What queued while the coordinator was away goes first.
  std::atomic<bool> send_done{false};
  std::thread sender([&] {
    SendLoop(stream.get(), absl::Milliseconds(registered.heartbeat_interval_ms()), &send_done);
  });

  SessionEnd end = SessionEnd::kRetry;
  v1::Stop stop;
  stop.set_reason("the worker is shutting down");
  v1::CoordinatorMessage message;
  while (stream->Read(&message)) {
    if (message.has_assignment()) {
      handler_->OnAssignment(message.assignment(), stub);
    } else if (message.has_abort()) {
      handler_->OnAbort(message.abort());
    } else if (message.has_prepare()) {
      handler_->OnPrepare(message.prepare());
    } else if (message.has_stop()) {
      DDP_LOG(Info) << "stop: " << message.stop().reason();
      stop = message.stop();
      end = SessionEnd::kStopped;
      stopping_ = true;
      break;
    } else if (message.has_rejected()) {
      DDP_LOG(Warning) << "the coordinator refused a message: " << message.rejected().message();
    }
  }
  send_done = true;
  outbox_->Interrupt();
  if (end == SessionEnd::kStopped || stopping_) context.TryCancel();
  sender.join();
  const grpc::Status status = stream->Finish();
  clear_context();
  if (end == SessionEnd::kStopped || stopping_) {
    handler_->OnStop(stop);
    return SessionEnd::kStopped;
  }
  if (status.error_code() == grpc::StatusCode::ABORTED) {
    // The coordinator marked this worker lost or evicted it: its generation
    // goes on without it.
    DDP_LOG(Warning) << "the coordinator dropped this worker: " << status.error_message();
    handler_->OnDropped(status.error_message());
  } else {
    // The coordinator is gone or unreachable: train on, and reconnect.
    DDP_LOG(Warning) << "lost the coordinator (" << StatusCodeName(status.error_code()) << ": "
                     << status.error_message() << "); training goes on, reconnecting";
  }
  return SessionEnd::kRetry;
}

CoordinatorLink::SessionEnd CoordinatorLink::OnRegisterFailed(const grpc::Status& status,
                                                              bool timed_out) {
  const grpc::StatusCode code = status.error_code();
  const RegisterFailure kind =
      timed_out ? RegisterFailure::kUnreachable : ClassifyRegisterFailure(code);
  const std::string hint = timed_out ? "" : RegisterFailureHint(code);
  const std::string reason = timed_out
                                 ? absl::StrCat("no answer to register within ",
                                                absl::FormatDuration(options_.register_timeout))
                                 : absl::StrCat(StatusCodeName(code), ": ", status.error_message(),
                                                hint.empty() ? "" : absl::StrCat(" (", hint, ")"));
  {
    absl::MutexLock lock(&mu_);
    last_error_ = reason;
  }
  if (kind == RegisterFailure::kFatal) {
    DDP_LOG(Error) << "the coordinator at " << options_.coordinator
                   << " refused this worker, and retrying can't change that: " << reason
                   << "; exiting";
    return SessionEnd::kFatal;
  }
  const absl::Time now = absl::Now();
  if (kind == RegisterFailure::kUnreachable && unreachable_since_ == absl::InfiniteFuture()) {
    unreachable_since_ = now;
  }
  // A timeout is its own kind of complaint: it says something else.
  uint64_t held_back = 0;
  if (!complaints_.ShouldLog(timed_out ? -1 : static_cast<int>(code), now, &held_back)) {
    return SessionEnd::kRetry;
  }
  const std::string repeats =
      held_back ? absl::StrCat(" [", held_back, " more like it since the last report]") : "";
  if (kind == RegisterFailure::kRefusedForNow) {
    DDP_LOG(Warning) << "the coordinator at " << options_.coordinator
                     << " refused this worker for now: " << reason << "; retrying" << repeats;
  } else if (timed_out) {
    DDP_LOG(Warning) << "no answer to register from " << options_.coordinator << " within "
                     << absl::FormatDuration(options_.register_timeout)
                     << " (a silent listener, a server that is not a ddp-coordinator, or a "
                        "TLS/plaintext mismatch?); retrying"
                     << repeats;
  } else {
    DDP_LOG(Warning) << "can't reach the coordinator at " << options_.coordinator << ": " << reason
                     << "; retrying"
                     << (now - unreachable_since_ > absl::Seconds(1)
                             ? absl::StrCat(" (for ",
                                            absl::FormatDuration(absl::Trunc(
                                                now - unreachable_since_, absl::Seconds(1))),
                                            " now)")
                             : "")
                     << repeats;
  }
  return SessionEnd::kRetry;
}

int CoordinatorLink::Run() {
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
