#include "worker/link/coordinator_link.h"

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
#include "worker/link/refusal.h"

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

// Cancels a call unless disarmed within `timeout` on `clock`.
class Watchdog {
 public:
  Watchdog(const Clock* clock, grpc::ClientContext* context, absl::Duration timeout)
      : thread_([this, clock, context, deadline = clock->Now() + timeout] {
          absl::MutexLock lock(&mu_);
          if (!clock->AwaitWithDeadline(mu_, absl::Condition(&disarmed_), deadline)) {
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

bool IsSet(std::atomic<bool>* flag) { return flag->load(); }

}  // namespace

std::shared_ptr<v1::Coordinator::StubInterface> NewCoordinatorStub(const std::string& target,
                                                                   ClientSecurity security,
                                                                   bool find_local_token) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Reconnect quickly once the coordinator is back; our own backoff paces us.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  security.token = WorkerTokenFor(target, security, find_local_token);
  return v1::Coordinator::NewStub(MakeChannel(target, security, args));
}

std::string WorkerTokenFor(const std::string& target, const ClientSecurity& security,
                           bool find_local_token) {
  if (!security.token.empty() || !find_local_token) return security.token;
  // Each coordinator of this user's on this machine has its own token file.
  const std::string file = FindLocalTokenFile(target, Role::kWorker);
  if (file.empty()) return "";
  absl::StatusOr<std::string> token = LoadTokenFile("the coordinator's worker token", file);
  return token.ok() ? *token : "";
}

CoordinatorLink::CoordinatorLink(const Clock* clock, Options options, Handler* handler,
                                 Outbox* outbox, const ProgressBoard* board)
    : clock_(clock),
      options_(std::move(options)),
      handler_(handler),
      outbox_(outbox),
      board_(board) {}

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
  absl::Time next_heartbeat = clock_->Now();
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
    if (clock_->Now() >= next_heartbeat) {
      v1::WorkerMessage hb;
      hb.mutable_heartbeat()->set_generation(board_->generation);
      hb.mutable_heartbeat()->set_step(board_->step);
      hb.mutable_heartbeat()->set_phase(static_cast<v1::StepPhase>(board_->phase.load()));
      hb.mutable_heartbeat()->set_phase_bound_seconds(board_->phase_bound_seconds.load());
      if (!stream->Write(hb)) return;
      next_heartbeat = clock_->Now() + heartbeat_interval;
    }
  }
}

StoreClient::StubFactory CoordinatorLink::stub_factory() const {
  return [security = options_.security,
          find_local_token = options_.find_local_token](const std::string& target) {
    return NewCoordinatorStub(target, security, find_local_token);
  };
}

CoordinatorLink::SessionEnd CoordinatorLink::RunSession() {
  const std::string target = targets_.current();
  session_target_ = target;
  std::shared_ptr<v1::Coordinator::StubInterface> stub =
      NewCoordinatorStub(target, options_.security, options_.find_local_token);
  grpc::ClientContext context;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return SessionEnd::kStopped;
    context_ = &context;
  }
  attached_ = false;
  next_ = CoordinatorTargets::Next{target, CoordinatorTargets::Move::kStay};
  const SessionEnd end = Attach(target, stub, context);
  absl::MutexLock lock(&mu_);
  context_ = nullptr;
  return end;
}

CoordinatorLink::SessionEnd CoordinatorLink::Attach(
    const std::string& target, const std::shared_ptr<v1::Coordinator::StubInterface>& stub,
    grpc::ClientContext& context) {
  // The stream lives for days, so it has no deadline of its own; only the
  // handshake has one. Armed before the call starts: opening it already
  // waits for the transport.
  Watchdog handshake(clock_, &context, options_.register_timeout);
  auto stream = stub->Attach(&context);
  v1::WorkerMessage hello;
  *hello.mutable_register_() = MakeRegister();
  v1::CoordinatorMessage reply;
  if (!stream->Write(hello) || !stream->Read(&reply) || !reply.has_registered()) {
    // Read the coordinator's own word on why (cancelling first would hide it).
    stream->WritesDone();
    const grpc::Status status = stream->Finish();
    const bool timed_out = handshake.Disarm();
    if (stopping_) return SessionEnd::kStopped;
    next_ =
        timed_out ? targets_.OnUnreachable(target) : targets_.OnFailure(target, status, context);
    return OnRegisterFailed(target, status, timed_out, next_);
  }
  handshake.Disarm();
  OnAttached(target, reply.registered());
  // What queued while the coordinator was away goes first.
  std::atomic<bool> send_done{false};
  std::thread sender([&] {
    SendLoop(stream.get(), absl::Milliseconds(reply.registered().heartbeat_interval_ms()),
             &send_done);
  });
  v1::Stop stop;
  stop.set_reason("the worker is shutting down");
  SessionEnd end = Serve(*stream, stub, &stop);
  send_done = true;
  outbox_->Interrupt();
  if (end == SessionEnd::kStopped || stopping_) context.TryCancel();
  sender.join();
  const grpc::Status status = stream->Finish();
  if (end == SessionEnd::kStopped || stopping_) {
    handler_->OnStop(stop);
    return SessionEnd::kStopped;
  }
  next_ = targets_.OnFailure(target, status, context);
  OnStreamClosed(target, status);
  return SessionEnd::kRetry;
}

void CoordinatorLink::OnAttached(const std::string& target, const v1::Registered& registered) {
  attached_ = true;
  targets_.OnSuccess();
  complaints_.Reset();
  unreachable_since_ = absl::InfiniteFuture();
  {
    absl::MutexLock lock(&mu_);
    last_error_.clear();
  }
  ever_attached_ = true;
  SetLogIdentity(absl::StrCat("worker ", registered.worker_id()));
  DDP_LOG(Info) << "attached to coordinator " << target << " as " << registered.worker_id();
}

CoordinatorLink::SessionEnd CoordinatorLink::Serve(
    grpc::ClientReaderWriterInterface<v1::WorkerMessage, v1::CoordinatorMessage>& stream,
    const std::shared_ptr<v1::Coordinator::StubInterface>& stub, v1::Stop* stop) {
  v1::CoordinatorMessage message;
  while (stream.Read(&message)) {
    if (message.has_assignment()) {
      handler_->OnAssignment(message.assignment(), stub);
    } else if (message.has_abort()) {
      handler_->OnAbort(message.abort());
    } else if (message.has_prepare()) {
      handler_->OnPrepare(message.prepare());
    } else if (message.has_stop()) {
      DDP_LOG(Info) << "stop: " << message.stop().reason();
      *stop = message.stop();
      stopping_ = true;
      return SessionEnd::kStopped;
    } else if (message.has_rejected()) {
      DDP_LOG(Warning) << "the coordinator refused a message: " << message.rejected().message();
    }
  }
  return SessionEnd::kRetry;
}

void CoordinatorLink::OnStreamClosed(const std::string& target, const grpc::Status& status) {
  if (next_.move == CoordinatorTargets::Move::kLeader) {
    // The leader stepped down (or was deposed) and named its successor.
    DDP_LOG(Warning) << "the coordinator at " << target << " is no longer the leader ("
                     << status.error_message() << "); training goes on, attaching to the leader at "
                     << next_.target;
  } else if (status.error_code() == grpc::StatusCode::ABORTED) {
    // The coordinator marked this worker lost or evicted it: its generation
    // goes on without it.
    DDP_LOG(Warning) << "the coordinator dropped this worker: " << status.error_message();
    handler_->OnDropped(status.error_message());
  } else {
    // The coordinator is gone or unreachable: train on, and reconnect.
    // With one address, said as it always was.
    const std::string at = target == options_.coordinator ? "" : absl::StrCat(" at ", target);
    const std::string to = next_.target == target ? "" : absl::StrCat(" to ", next_.target);
    DDP_LOG(Warning) << "lost the coordinator" << at << " (" << StatusCodeName(status.error_code())
                     << ": " << status.error_message() << "); training goes on, reconnecting" << to;
  }
}

CoordinatorLink::SessionEnd CoordinatorLink::OnRegisterFailed(
    const std::string& target, const grpc::Status& status, bool timed_out,
    const CoordinatorTargets::Next& next) {
  const grpc::StatusCode code = status.error_code();
  const bool standby = next.move == CoordinatorTargets::Move::kLeader;
  const RegisterFailure kind =
      timed_out ? RegisterFailure::kUnreachable : ClassifyRegisterFailure(code);
  const std::string hint = timed_out || standby ? "" : RegisterFailureHint(code);
  const std::string reason = timed_out
                                 ? absl::StrCat("no answer to register within ",
                                                absl::FormatDuration(options_.register_timeout))
                                 : absl::StrCat(StatusCodeName(code), ": ", status.error_message(),
                                                hint.empty() ? "" : absl::StrCat(" (", hint, ")"));
  {
    absl::MutexLock lock(&mu_);
    // Which of several coordinators said so.
    last_error_ = target == options_.coordinator ? reason : absl::StrCat(target, ": ", reason);
  }
  if (kind == RegisterFailure::kFatal) {
    DDP_LOG(Error) << "the coordinator at " << target
                   << " refused this worker, and retrying can't change that: " << reason
                   << "; exiting";
    return SessionEnd::kFatal;
  }
  const absl::Time now = clock_->Now();
  // A standby answered: the coordinators are there, and one leads.
  if (kind == RegisterFailure::kUnreachable && !standby &&
      unreachable_since_ == absl::InfiniteFuture()) {
    unreachable_since_ = now;
  }
  // A timeout is its own kind of complaint: it says something else; so is
  // a standby's answer.
  const int complaint = timed_out ? -1 : (standby ? -2 : static_cast<int>(code));
  uint64_t held_back = 0;
  if (!complaints_.ShouldLog(complaint, now, &held_back)) {
    return SessionEnd::kRetry;
  }
  const std::string repeats =
      held_back ? absl::StrCat(" [", held_back, " more like it since the last report]") : "";
  const std::string retrying =
      next.target == target ? "retrying" : absl::StrCat("trying ", next.target, " next");
  if (standby) {
    DDP_LOG(Info) << "the coordinator at " << target << " is not the leader ("
                  << status.error_message() << "); attaching to the leader at " << next.target
                  << repeats;
  } else if (kind == RegisterFailure::kRefusedForNow) {
    DDP_LOG(Warning) << "the coordinator at " << target
                     << " refused this worker for now: " << reason << "; " << retrying << repeats;
  } else if (timed_out) {
    DDP_LOG(Warning) << "no answer to register from " << target << " within "
                     << absl::FormatDuration(options_.register_timeout)
                     << " (a silent listener, a server that is not a ddp-coordinator, or a "
                        "TLS/plaintext mismatch?); "
                     << retrying << repeats;
  } else {
    DDP_LOG(Warning) << "can't reach the coordinator at " << target << ": " << reason << "; "
                     << retrying
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
  int leader_hops = 0;
  while (!stopping_) {
    const absl::Time start = clock_->Now();
    const SessionEnd end = RunSession();
    if (end == SessionEnd::kFatal) return 2;
    if (end == SessionEnd::kStopped || stopping_) break;
    // A session that lasted was healthy: start the backoff over.
    if (clock_->Now() - start > absl::Seconds(10)) backoff = options_.min_backoff;
    if (attached_) leader_hops = 0;
    // A standby named the leader: go there now, not after a backoff (a few
    // hops in a row at most).
    if (next_.move == CoordinatorTargets::Move::kLeader && leader_hops < kMaxLeaderHops) {
      ++leader_hops;
      continue;
    }
    leader_hops = 0;
    if (!announced) {
      DDP_LOG(Info) << "waiting for the coordinator at " << options_.coordinator;
      announced = true;
    }
    std::uniform_real_distribution<double> jitter(0.5, 1.0);
    const absl::Time wake = clock_->Now() + backoff * jitter(rng);
    {
      absl::MutexLock lock(&mu_);
      clock_->AwaitWithDeadline(mu_, absl::Condition(&IsSet, &stopping_), wake);
    }
    // The backoff grows once per round through the list, not per address
    // (with one address every try is a round).
    if (next_.move != CoordinatorTargets::Move::kNextAddress) {
      backoff = std::min(backoff * 2, options_.max_backoff);
    }
  }
  return 0;
}

}  // namespace ddp
