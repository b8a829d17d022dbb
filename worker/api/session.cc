#include "ddp/session.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>

#include <torch/cuda.h>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/coordinator_targets.h"
#include "common/credentials.h"
#include "common/local_tokens.h"
#include "common/logging.h"
#include "common/net_address.h"
#include "common/store_client.h"
#include "common/tokens.h"
#include "ddp/error.h"
#include "grpcpp/grpcpp.h"
#include "worker/api/coordinator_session.h"
#include "worker/api/session_impl.h"
#include "worker/api/store_server.h"
#include "worker/collective/gloo_communicator.h"
#include "worker/collective/gloo_store.h"
#include "worker/collective/shm_communicator.h"

namespace ddp {
namespace {

constexpr char kEnvHelp[] =
    "ddp::Session needs to know its place in the job: start the program with "
    "ddp-run --nproc N -- PROGRAM, or set DDP_COORDINATOR=HOST:PORT (a coordinator running a "
    "job with model.kind \"program\"), or set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT "
    "as torchrun does";

// Steps between the parameter digests in step reports.
constexpr uint64_t kDigestEvery = 100;

std::string EnvString(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}

int EnvInt(const char* name, bool required, int fallback) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') {
    if (!required) return fallback;
    throw Error(absl::StrCat(name, " is not set. ", kEnvHelp));
  }
  int parsed = 0;
  if (!absl::SimpleAtoi(value, &parsed) || parsed < 0) {
    throw Error(absl::StrCat(name, "=", value, " is not a non-negative integer. ", kEnvHelp));
  }
  return parsed;
}

// The address of this host that reaches `peer` (no packet is sent).
std::string LocalAddressTowards(const std::string& peer, int port) {
  if (IsLoopbackHost(peer)) return "127.0.0.1";
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(peer.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) {
    throw Error(absl::StrCat("MASTER_ADDR=", peer, " does not resolve"));
  }
  std::string local = "127.0.0.1";
  const int fd = ::socket(found->ai_family, SOCK_DGRAM, 0);
  sockaddr_storage mine{};
  socklen_t len = sizeof(mine);
  if (fd >= 0 && ::connect(fd, found->ai_addr, found->ai_addrlen) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&mine), &len) == 0) {
    char text[INET6_ADDRSTRLEN] = {};
    const void* addr =
        mine.ss_family == AF_INET
            ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&mine)->sin_addr)
            : &reinterpret_cast<sockaddr_in6*>(&mine)->sin6_addr;
    if (::inet_ntop(mine.ss_family, addr, text, sizeof(text)) != nullptr) local = text;
  }
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(found);
  return local;
}

void Check(const absl::Status& s, const std::string& what) {
  if (!s.ok()) throw Error(absl::StrCat(what, ": ", s.message()));
}

// Before any communicator: every rank arrives once. A second arrival at a
// rank means another job's ranks found this rendezvous (two jobs on one
// MASTER_PORT: the second's rank 0 could not serve it) or two ranks share
// a RANK: said now, not after the timeout.
void CheckArrival(StoreClient& store, const Session::Options& options, const std::string& address) {
  const std::string where =
      absl::StrCat("the rendezvous at ", address, " (MASTER_PORT=", options.master_port, ")");
  absl::StatusOr<int64_t> arrived = store.Add(absl::StrCat("arrived/", options.rank), 1);
  Check(arrived.status(), absl::StrCat("rank ", options.rank, ": ", where));
  if (*arrived > 1) {
    throw Error(absl::StrCat("rank ", options.rank, " already joined ", where,
                             ": another job is using MASTER_PORT=", options.master_port,
                             " (give each job its own), or two ranks have RANK=", options.rank));
  }
}

// cuda:LOCAL_RANK where there is such a GPU (one per local rank, as
// torchrun's convention has it), else the CPU.
torch::Device LocalDevice(int local_rank) {
  if (torch::cuda::is_available() &&
      static_cast<size_t>(local_rank) < torch::cuda::device_count()) {
    return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(local_rank));
  }
  return torch::Device(torch::kCPU);
}

std::string ProgramName() {
  char path[4096] = {};
  const ssize_t n = ::readlink("/proc/self/exe", path, sizeof(path) - 1);
  const std::string exe = n > 0 ? std::string(path, n) : "program";
  return exe.substr(exe.rfind('/') + 1);
}

}  // namespace

std::unique_ptr<Session::Impl> Session::Join(const Options& options) {
  if (options.local_rank < 0) throw Error("LOCAL_RANK must be >= 0");
  TlsFlags tls;
  tls.ca = options.tls_ca;
  tls.cert = options.tls_cert;
  tls.key = options.tls_key;
  // HOST:PORT, or a comma list of them: the link follows the leader.
  absl::StatusOr<std::vector<std::string>> coordinators = ParseCoordinatorList(options.coordinator);
  Check(coordinators.status(), "ddp::Session: the coordinator");
  // Without a token file, a coordinator of this user's on this machine
  // made its own tokens (common/local_tokens.h): read now for one address,
  // and looked up at each connection otherwise (each has its own).
  const std::string token_file = options.token_file.empty() && coordinators->size() == 1
                                     ? FindLocalTokenFile(coordinators->front(), Role::kWorker)
                                     : options.token_file;
  absl::StatusOr<ClientSecurity> security = LoadClientSecurity(tls, token_file);
  Check(security.status(), "ddp::Session");
  // Every coordinator of a list is reached the same way from here; a
  // unix-domain socket is on this machine.
  const absl::StatusOr<HostPort> first = ParseHostPort(coordinators->front());
  const HostPort coordinator = first.ok() ? *first : HostPort{"localhost", 0};
  CoordinatorSession::Options joined;
  joined.coordinator = options.coordinator;
  joined.security = *security;
  joined.find_local_token = options.token_file.empty();
  joined.host =
      options.host.empty() ? LocalAddressTowards(coordinator.host, coordinator.port) : options.host;
  // What the coordinator knows this rank by (and its choice of transport).
  joined.device = LocalDevice(options.local_rank).is_cuda()
                      ? absl::StrCat("cuda:", options.local_rank)
                      : absl::StrCat("cpu:", options.local_rank);
  joined.name =
      options.name.empty() ? absl::StrCat(ProgramName(), "-", options.local_rank) : options.name;
  auto session =
      CoordinatorSession::Join(std::move(joined), absl::Seconds(options.timeout_seconds));
  Check(session.status(), "ddp::Session");
  auto impl = std::make_unique<Session::Impl>();
  impl->options = options;
  impl->joined = std::move(*session);
  impl->UseCommunicator(&impl->joined->communicator());
  impl->rank = static_cast<int>(impl->joined->assignment().rank());
  impl->world_size = static_cast<int>(impl->joined->assignment().world_size());
  impl->last_report = absl::Now();
  return impl;
}

std::string Session::Impl::Explain(const absl::Status& status, const std::string& what) const {
  // The program's own fault stands, whatever the coordinator did next.
  if (joined && !IsMisaligned(status)) {
    if (const std::string failure = joined->job_failure(); !failure.empty()) {
      return absl::StrCat(what, ": ", failure);
    }
  }
  const std::string ended = joined && !IsMisaligned(status) ? joined->ended_reason() : "";
  if (!ended.empty()) return absl::StrCat(what, ": ", ended);
  return absl::StrCat(what, ": ", status.message());
}

bool Session::Impl::ReformedAfter(const absl::Status& failure) {
  // Misaligned collectives are the program's: re-forming would not help.
  if (!joined || !elastic || IsMisaligned(failure)) return false;
  if (!joined->AwaitEnd(failure, absl::Seconds(options.timeout_seconds))) return false;
  DDP_LOG(Warning) << "a collective of the program's own was cut short by a re-formation ("
                   << failure.message() << "); it keeps this rank's values";
  GoOnAtLoopsPass(/*at_pass_end=*/true);
  AtStepBoundary();
  return true;
}

bool Session::Impl::Joining() const {
  return joined && !elastic && joined->assignment().state_source() != v1::STATE_SOURCE_FRESH;
}

Session::Session(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Session::~Session() {
  if (!impl_->joined || impl_->finished) return;
  if (std::uncaught_exceptions() > impl_->uncaught_at_start && !impl_->joined->ended()) {
    impl_->joined->Fail(
        absl::StrCat("rank ", impl_->rank, "'s program left with an exception (see its output)"));
    return;
  }
  impl_->Finish();
  // A destructor can't throw: finish() is where a program learns this.
  if (const std::string failure = impl_->joined->job_failure(); !failure.empty()) {
    DDP_LOG(Error) << failure << " (ddp::Session::finish() throws this as a ddp::Error)";
  }
}

void Session::Impl::Finish() {
  if (finished) return;
  finished = true;
  joined->Finish(absl::Seconds(options.timeout_seconds));
}

std::unique_ptr<Session> Session::FromEnvironment() {
  Options options;
  options.local_rank = EnvInt("LOCAL_RANK", false, 0);
  options.timeout_seconds = EnvInt("DDP_TIMEOUT_SECONDS", false, 300);
  if (const std::string coordinator = EnvString("DDP_COORDINATOR"); !coordinator.empty()) {
    options.coordinator = coordinator;
    options.token_file = EnvString("DDP_TOKEN_FILE");
    options.tls_ca = EnvString("DDP_TLS_CA");
    options.tls_cert = EnvString("DDP_TLS_CERT");
    options.tls_key = EnvString("DDP_TLS_KEY");
    options.name = EnvString("DDP_NAME");
    return Start(options);
  }
  options.rank = EnvInt("RANK", true, 0);
  options.world_size = EnvInt("WORLD_SIZE", true, 1);
  options.local_world_size = EnvInt("LOCAL_WORLD_SIZE", false, 0);
  if (const char* backend = std::getenv("DDP_BACKEND"); backend != nullptr && *backend != '\0') {
    options.backend = backend;
  }
  const char* addr = std::getenv("MASTER_ADDR");
  if (addr == nullptr || *addr == '\0')
    throw Error(absl::StrCat("MASTER_ADDR is not set. ", kEnvHelp));
  options.master_addr = addr;
  options.master_port = EnvInt("MASTER_PORT", true, 0);
  options.store_secret = EnvString("DDP_STORE_SECRET");
  options.allow_anonymous_store = EnvString("DDP_ALLOW_ANONYMOUS_STORE") == "1";
  return Start(options);
}

namespace {

// A torchrun-style start's environment, refused with what to set.
void CheckRendezvousOptions(const Session::Options& options) {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    throw Error(absl::StrCat("RANK=", options.rank, " with WORLD_SIZE=", options.world_size,
                             ": the rank must be in [0, WORLD_SIZE)"));
  }
  if (options.master_port < 1 || options.master_port > 65535) {
    throw Error(absl::StrCat("MASTER_PORT=", options.master_port, " is not a TCP port"));
  }
  if (options.backend != "auto" && options.backend != "gloo" && options.backend != "shm") {
    throw Error(absl::StrCat("backend \"", options.backend, "\": use auto, gloo or shm"));
  }
  if (options.store_secret.empty() && !options.allow_anonymous_store) {
    throw Error(
        "DDP_STORE_SECRET is not set: rank 0's rendezvous at MASTER_ADDR:MASTER_PORT serves "
        "only ranks that present the job's secret, or any local user could write to it. Set "
        "it to the same random value on every rank (export DDP_STORE_SECRET=$(openssl rand "
        "-hex 16) where the ranks start; ddp-run needs none), or DDP_ALLOW_ANONYMOUS_STORE=1 "
        "where every user who can reach the port is trusted");
  }
  if (!options.store_secret.empty() && options.store_secret.size() < kMinTokenLength) {
    throw Error(absl::StrCat("DDP_STORE_SECRET is ", options.store_secret.size(),
                             " characters; use at least ", kMinTokenLength,
                             " random ones (openssl rand -hex 16)"));
  }
}

}  // namespace

std::unique_ptr<Session> Session::Start(const Options& options) {
  if (options.timeout_seconds <= 0) throw Error("the session timeout must be positive");
  if (!options.coordinator.empty()) return std::unique_ptr<Session>(new Session(Join(options)));
  CheckRendezvousOptions(options);
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->rank = options.rank;
  impl->world_size = options.world_size;
  const std::string master = options.master_addr.find(':') != std::string::npos
                                 ? absl::StrCat("[", options.master_addr, "]")
                                 : options.master_addr;
  const std::string address = absl::StrCat(master, ":", options.master_port);
  const absl::Duration timeout = absl::Seconds(options.timeout_seconds);
  if (options.rank == 0) {
    auto server = StoreServer::Start(address, options.store_secret);
    Check(server.status(), "ddp::Session");
    impl->server = std::move(*server);
  }
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  if (!channel->WaitForConnected(absl::ToChronoTime(absl::Now() + timeout))) {
    throw Error(absl::StrCat("rank ", options.rank, " could not reach rank 0's rendezvous at ",
                             address, " within ", options.timeout_seconds,
                             " s: is rank 0 running, and are MASTER_ADDR and MASTER_PORT the "
                             "same for every rank?"));
  }
  StoreClient store(v1::Coordinator::NewStub(channel), "session", 1, options.store_secret);
  CheckArrival(store, options, address);
  CoordinatorGlooStore gloo_store(&store, timeout);
  const bool one_machine = options.local_world_size == options.world_size &&
                           options.world_size <= ShmCommunicator::kMaxRanks;
  if (options.backend == "shm" || (options.backend == "auto" && one_machine)) {
    ShmCommunicator::Options shm;
    shm.rank = options.rank;
    shm.world_size = options.world_size;
    shm.timeout = timeout;
    auto created = ShmCommunicator::Create(gloo_store, shm);
    if (created.ok()) {
      impl->owned = std::move(*created);
      impl->UseCommunicator(impl->owned.get());
      return std::unique_ptr<Session>(new Session(std::move(impl)));
    }
    // Every rank learns the same outcome, so "auto" falls back together.
    if (options.backend == "shm" || !absl::IsFailedPrecondition(created.status())) {
      Check(created.status(), absl::StrCat("rank ", options.rank, ": shared memory"));
    }
  }
  GlooCommunicator::Options comm;
  comm.rank = options.rank;
  comm.world_size = options.world_size;
  comm.host = options.host.empty() ? LocalAddressTowards(options.master_addr, options.master_port)
                                   : options.host;
  comm.timeout = timeout;
  auto created = GlooCommunicator::Create(gloo_store, comm);
  Check(created.status(), absl::StrCat("rank ", options.rank, " of ", options.world_size,
                                       ": the ranks could not connect"));
  impl->owned = std::move(*created);
  impl->UseCommunicator(impl->owned.get());
  return std::unique_ptr<Session>(new Session(std::move(impl)));
}

int Session::rank() const { return impl_->rank; }
int Session::world_size() const { return impl_->world_size; }
int Session::local_rank() const { return impl_->options.local_rank; }

torch::Device Session::device() const { return LocalDevice(impl_->options.local_rank); }
std::string Session::backend() const { return impl_->comm->backend(); }
Communicator& Session::communicator() { return *impl_->comm; }

std::string Session::job_id() const {
  return impl_->joined ? impl_->joined->assignment().job_id() : "";
}
uint64_t Session::generation() const {
  return impl_->joined ? impl_->joined->assignment().generation() : 0;
}
uint64_t Session::sampler_seed() const {
  return impl_->joined ? impl_->joined->assignment().sampler_seed() : 0;
}
uint64_t Session::start_epoch() const {
  if (impl_->elastic) return impl_->committed.epoch;
  return impl_->joined ? impl_->joined->assignment().start_epoch() : 0;
}

void Session::report_step(double loss, uint64_t samples, uint64_t epoch) {
  // Nothing to say about a generation the coordinator ended.
  if (!impl_->joined || impl_->joined->ended()) return;
  const absl::Time now = absl::Now();
  v1::StepReport report;
  report.set_generation(impl_->joined->assignment().generation());
  report.set_step(++impl_->reported_steps);
  report.set_epoch(epoch);
  report.set_loss(loss);
  report.set_samples(samples);
  report.set_world_size(static_cast<uint32_t>(impl_->world_size));
  report.set_step_seconds(absl::ToDoubleSeconds(now - impl_->last_report));
  *report.mutable_reduction() = impl_->last_reduction;
  // Now and then the replicas' fingerprint: the coordinator fails the job,
  // naming both ranks and the parameters that differ, if two ranks' differ
  // at the same step. The names go once a generation: the coordinator
  // keeps them.
  if (impl_->ddp && report.step() % kDigestEvery == 0) {
    report.set_parameter_digest(impl_->ddp->digest());
    for (uint64_t d : impl_->ddp->parameter_digests()) report.add_parameter_digests(d);
    if (impl_->digest_names_sent != report.generation()) {
      for (std::string& name : impl_->ddp->digest_names()) {
        report.add_parameter_digest_names(std::move(name));
      }
      impl_->digest_names_sent = report.generation();
    }
  }
  impl_->last_reduction.clear_newly_unused_parameter_names();
  impl_->last_report = now;
  impl_->joined->ReportStep(std::move(report));
}

void Session::finish() {
  if (!impl_->joined) return;
  // The generation may have ended after the last batch (a joiner admitted
  // at that step boundary, which the sampler leaves to the next epoch's
  // first batch): re-form first, so that the joiner takes up the final state
  // rather than wait for ranks that are done. Here, not in the destructor:
  // the elastic state's module and optimizer are still alive.
  if (!impl_->finished && impl_->joined->ended()) {
    impl_->GoOnAtLoopsPass(/*at_pass_end=*/true);
    impl_->AtStepBoundary();
  }
  impl_->Finish();
  if (const std::string failure = impl_->joined->job_failure(); !failure.empty()) {
    throw Error(failure);
  }
}

void Session::all_reduce_sum(torch::Tensor& tensor) {
  if (tensor.scalar_type() != torch::kFloat32 || !tensor.is_contiguous()) {
    throw Error("all_reduce_sum takes a contiguous float32 tensor");
  }
  if (impl_->Joining() || impl_->SkipsCutShortCollective()) return;
  absl::Status s = impl_->check->Agree(
      Collective{CollectiveKind::kAllReduce, static_cast<uint64_t>(tensor.numel())});
  // A GPU's tensor is staged through host memory: the communicators take it.
  torch::Tensor host = tensor.is_cpu() ? tensor : tensor.to(torch::kCPU);
  if (s.ok()) s = impl_->comm->AllReduceSum(host.data_ptr<float>(), host.numel());
  if (s.ok() && !tensor.is_cpu()) tensor.copy_(host);
  if (!s.ok()) {
    if (impl_->ReformedAfter(s)) return;
    throw Error(impl_->Explain(s, "all_reduce_sum"));
  }
}

void Session::broadcast(torch::Tensor& tensor, int root) {
  if (!tensor.is_contiguous()) throw Error("broadcast takes a contiguous tensor");
  if (root < 0 || root >= impl_->world_size) {
    throw Error(
        absl::StrCat("broadcast from rank ", root, ": not a rank of the ", impl_->world_size));
  }
  if (impl_->Joining() || impl_->SkipsCutShortCollective()) return;
  absl::Status s = impl_->check->Agree(
      Collective{CollectiveKind::kBroadcast, static_cast<uint64_t>(tensor.nbytes()), 0, root});
  torch::Tensor host = tensor.is_cpu() ? tensor : tensor.to(torch::kCPU);
  if (s.ok()) s = impl_->comm->Broadcast(host.data_ptr(), host.nbytes(), root);
  if (s.ok() && !tensor.is_cpu()) tensor.copy_(host);
  if (!s.ok()) {
    if (impl_->ReformedAfter(s)) return;
    throw Error(impl_->Explain(s, "broadcast"));
  }
}

void Session::barrier() {
  if (impl_->Joining() || impl_->SkipsCutShortCollective()) return;
  // The check is an all-reduce every rank makes: a barrier by itself.
  if (absl::Status s = impl_->check->Agree(Collective{CollectiveKind::kBarrier}); !s.ok()) {
    if (impl_->ReformedAfter(s)) return;
    throw Error(impl_->Explain(s, "barrier"));
  }
}

}  // namespace ddp
