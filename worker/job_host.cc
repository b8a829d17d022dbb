#include "worker/job_host.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "common/credentials.h"
#include "common/device.h"
#include "common/logging.h"
#include "ddp/v1/job_process.pb.h"
#include "worker/confinement.h"
#include "worker/device_placement.h"
#include "worker/generation_run.h"
#include "worker/in_process_jobs.h"
#include "worker/link/coordinator_link.h"
#include "worker/link/outbox.h"
#include "worker/process/job_process.h"
#include "worker/process/message_channel.h"
#include "worker/process/shared_board.h"
#include "worker/threads.h"

namespace ddp {
namespace {

// Whatever else the daemon had open (its sockets, its files) is not the
// job's: only stdio, the channel and the board stay.
void CloseInherited() {
  if (::syscall(SYS_close_range, kJobProcessBoardFd + 1, ~0U, 0) == 0) return;
  for (int fd = kJobProcessBoardFd + 1; fd < 4096; ++fd) ::close(fd);
}

// Test-only: DDP_TEST_JOB_PROCESS_CRASH=R:K makes rank R's job process die
// of SIGSEGV once it has committed step K in generation 1, as a model's
// native op that crashes would (once: a re-formed generation that trains
// step K again, the survivors not having committed it, goes on).
struct InjectedCrash {
  uint32_t rank = 0;
  uint64_t step = 0;
  bool set = false;
};

InjectedCrash ReadInjectedCrash() {
  InjectedCrash crash;
  const char* text = std::getenv("DDP_TEST_JOB_PROCESS_CRASH");
  if (text == nullptr) return crash;
  std::vector<std::string> parts = absl::StrSplit(text, ':');
  crash.set = parts.size() == 2 && absl::SimpleAtoi(parts[0], &crash.rank) &&
              absl::SimpleAtoi(parts[1], &crash.step);
  return crash;
}

JobConfinementOptions ConfinementFor(const v1::JobProcessStart& start, const Device& device) {
  JobConfinementOptions c;
  c.gpu = device.is_cuda();
  c.allow_unconfined = start.allow_unconfined();
  c.files = {start.metrics_file(), start.index_log()};
  return c;
}

class JobHost {
 public:
  JobHost(MessageChannel* channel, v1::JobProcessStart start, Device device, ProgressBoard* board)
      : channel_(channel),
        start_(std::move(start)),
        device_(device),
        board_(board),
        crash_(ReadInjectedCrash()) {}

  int Run() {
    Outbox::Options outbox_options;
    // The daemon batches again: reports wait here only briefly. Batched,
    // not sent one a step: each message wakes the daemon, which shares the
    // cores with training.
    outbox_options.batch_delay = absl::Milliseconds(50);
    Outbox outbox(RealClock::Get(), outbox_options);
    InProcessJobs jobs(Environment(), &outbox, board_);
    std::thread pump([&] { Pump(&outbox, &jobs); });
    while (true) {
      v1::ToJobProcess message;
      absl::StatusOr<bool> got = channel_->Receive(&message);
      if (!got.ok()) DDP_LOG(Error) << "from the daemon: " << got.status().message();
      if (!got.ok() || !*got) break;
      switch (message.kind_case()) {
        case v1::ToJobProcess::kAssignment:
          jobs.Assign(message.assignment(), message.target(), nullptr);
          break;
        case v1::ToJobProcess::kAbort:
          jobs.Abort(message.abort());
          break;
        case v1::ToJobProcess::kPrepare:
          jobs.Prepare(message.prepare());
          break;
        case v1::ToJobProcess::kAbortAny:
          jobs.AbortAny(message.abort_any());
          break;
        default:
          break;
      }
    }
    jobs.AbortAny("the worker ended this job's process");
    jobs.Stop();
    finishing_ = true;
    outbox.Interrupt();
    pump.join();
    return 0;
  }

 private:
  GenerationRun::Environment Environment() {
    GenerationRun::Environment env;
    ClientSecurity security;
    security.tls = start_.tls();
    security.ca_pem = start_.ca_pem();
    security.cert_pem = start_.cert_pem();
    security.key_pem = start_.key_pem();
    std::map<std::string, std::string> tokens(start_.tokens().begin(), start_.tokens().end());
    env.leader_stubs = [security, tokens](const std::string& target) {
      ClientSecurity s = security;
      if (auto it = tokens.find(target); it != tokens.end()) s.token = it->second;
      return NewCoordinatorStub(target, s, /*find_local_token=*/false);
    };
    env.host = start_.host();
    env.device = device_;
    env.metrics_file = start_.metrics_file();
    env.index_log = start_.index_log();
    // Every report goes to the daemon (its metrics read them), whole; the
    // daemon decides what goes up.
    env.send_reports = true;
    env.report_buckets = true;
    env.debug_hang_file = start_.debug_hang_file();
    env.confinement = ConfinementFor(start_, device_);
    if (crash_.set) {
      env.on_step = [this](const v1::StepReport& report, uint32_t rank) { OnStep(report, rank); };
    }
    return env;
  }

  void OnStep(const v1::StepReport& report, uint32_t rank) {
    if (report.generation() == 1 && rank == crash_.rank && report.step() == crash_.step) {
      DDP_LOG(Warning) << "DDP_TEST_JOB_PROCESS_CRASH: dying of SIGSEGV after step "
                       << report.step();
      ::raise(SIGSEGV);
    }
  }

  // Sends what the outbox holds, and the claim whenever it changes, until
  // the run loop is done and the outbox empty.
  void Pump(Outbox* outbox, InProcessJobs* jobs) {
    std::string last_claim;
    while (true) {
      const bool finishing = finishing_;
      std::vector<v1::WorkerMessage> messages =
          outbox->Take(finishing ? absl::InfinitePast() : absl::Now() + absl::Milliseconds(50));
      v1::RegisterRequest r;
      jobs->Claim(&r);
      v1::FromJobProcess claim;
      v1::JobProcessClaim* c = claim.mutable_claim();
      c->set_generation(r.generation());
      c->set_rank(r.rank());
      if (r.has_held()) *c->mutable_held() = r.held();
      std::string serialized = c->SerializeAsString();
      if (serialized != last_claim) {
        if (!channel_->Send(claim).ok()) return;
        last_claim = std::move(serialized);
      }
      for (v1::WorkerMessage& m : messages) {
        v1::FromJobProcess out;
        *out.mutable_message() = std::move(m);
        if (!channel_->Send(out).ok()) return;
      }
      if (finishing && messages.empty()) return;
    }
  }

  MessageChannel* const channel_;
  const v1::JobProcessStart start_;
  const Device device_;
  ProgressBoard* const board_;
  const InjectedCrash crash_;
  std::atomic<bool> finishing_{false};
};

}  // namespace

int RunJobProcess(int argc, char** argv) {
  pid_t parent = 0;
  if (argc < 3 || !absl::SimpleAtoi(argv[2], &parent)) return 2;
  // It dies with the daemon, and a daemon already gone starts no job.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) return 1;
  // The daemon's group's ^C or SIGTERM is the daemon's to act on: it ends
  // this process once the generation is left.
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::signal(sig, SIG_IGN);
  CloseInherited();
  const struct rlimit no_core = {0, 0};
  ::setrlimit(RLIMIT_CORE, &no_core);
  MessageChannel channel(kJobProcessChannelFd, kMaxToJobProcessBytes);
  v1::JobProcessStart start;
  absl::StatusOr<bool> got = channel.Receive(&start);
  // A process kept ready that the daemon ended before any job: nothing to do.
  if (got.ok() && !*got) return 0;
  if (!got.ok()) {
    DDP_LOG(Error) << "job process: no start from the daemon: " << got.status().message();
    return 2;
  }
  SetLogIdentity(absl::StrCat(start.log_identity(), " (job ", start.job_id(), ")"));
  absl::StatusOr<Device> device = ParseDevice(start.device());
  if (!device.ok()) {
    DDP_LOG(Error) << "job process: " << device.status().message();
    return 2;
  }
  // Confined before any other thread exists and before anything of the
  // job's is opened: every thread started from here on inherits it. Where
  // it can't be, each generation fails saying why (or, with
  // --allow_unconfined, runs with a warning), as it would in process.
  if (absl::Status s = ConfineJobProcess(start.spec(), ConfinementFor(start, *device)); !s.ok()) {
    DDP_LOG(Warning) << "job process: " << s.message();
  }
  SetComputeThreads(start.threads());
  if (start.deterministic()) UseDeterministicAlgorithms();
  absl::StatusOr<std::unique_ptr<SharedBoard>> board = SharedBoard::Map(kJobProcessBoardFd);
  if (!board.ok()) {
    DDP_LOG(Error) << "job process: " << board.status().message();
    return 2;
  }
  JobHost host(&channel, std::move(start), *device, (*board)->board());
  return host.Run();
}

}  // namespace ddp
