#include "coordinator/coordinator_server.h"

#include <malloc.h>
#include <signal.h>

#include <cstdio>
#include <fstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/clock.h"
#include "common/job_spec.h"
#include "common/local_tokens.h"
#include "common/logging.h"
#include "common/net_address.h"
#include "common/port_holder.h"
#include "common/process.h"
#include "common/version.h"
#include "coordinator/file_state_store.h"
#include "coordinator/helper_check.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"

namespace ddp {
namespace {

bool Ended(v1::JobState state) {
  return state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_CANCELLED;
}

// 0 if every job succeeded, 1 if any failed, else 3 if any was cancelled.
int ExitCodeFor(const v1::JobStatus& status) {
  int code = 0;
  auto note = [&code](v1::JobState state) {
    if (state == v1::JOB_STATE_FAILED) code = 1;
    if (state == v1::JOB_STATE_CANCELLED && code == 0) code = 3;
  };
  note(status.state());
  for (const v1::JobSummary& job : status.jobs()) note(job.state());
  return code;
}

// Written whole or not at all: a reader never sees half a file.
void WriteFileAtomically(const std::string& file, const std::string& text) {
  std::ofstream(file + ".tmp") << text << "\n";
  std::rename((file + ".tmp").c_str(), file.c_str());
}

// Submits at start-up and waits for the answer (the check may take a while).
absl::StatusOr<v1::JobSpec> SubmitAndWait(Coordinator& core, const v1::JobSpec& spec) {
  absl::Notification answered;
  absl::StatusOr<v1::JobSpec> answer;
  core.SubmitJob(spec, [&](absl::StatusOr<v1::JobSpec> s) {
    answer = std::move(s);
    answered.Notify();
  });
  answered.WaitForNotification();
  return answer;
}

// glibc keeps what a flood of calls freed (thousands of gRPC call arenas,
// spread over every thread's malloc arena) for reuse, so an idle
// coordinator would hold its peak for hours. Hands free pages back.
void ReturnFreeMemory() {
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}

}  // namespace

CoordinatorServer::CoordinatorServer(Options options) : options_(std::move(options)) {}

CoordinatorServer::~CoordinatorServer() { Stop(); }

absl::Status CoordinatorServer::Start() {
  if (absl::Status s = InitValidation(); !s.ok()) return s;
  if (absl::Status s = InitCore(); !s.ok()) return s;
  if (absl::Status s = SubmitStartJob(); !s.ok()) return s;
  if (absl::Status s = InitGrpcServer(); !s.ok()) return s;
  if (absl::Status s = InitMetrics(); !s.ok()) return s;
  if (absl::Status s = InitStatusPage(); !s.ok()) return s;
  if (absl::Status s = AnnounceServing(); !s.ok()) return s;
  StartTicker();
  return absl::OkStatus();
}

absl::Status CoordinatorServer::InitValidation() {
  // User code and user files are looked at only in the helper: the
  // coordinator itself only stats paths.
  validator_ = std::make_unique<JobValidator>(
      options_.validation, HelperCheck(options_.helper.get(), options_.validate_timeout));
  DDP_LOG(Info) << "jobs are checked by " << options_.helper->options().program << " as "
                << options_.helper->user_description() << "; data from " << options_.data_root
                << ", outputs to " << options_.output_root;
  const PathRoots* roots = &options_.roots;
  JobValidator* validator = validator_.get();
  options_.core.validate_job = [roots, validator](
                                   const v1::JobSpec& spec,
                                   std::function<void(absl::StatusOr<v1::JobSpec>)> done) {
    // A program's job names no model or data file: nothing to check.
    if (IsProgramJob(spec)) return done(spec);
    // The paths first: a stat each, quick, and it needs no queue.
    if (absl::Status s = CheckJobPaths(spec, *roots); !s.ok()) return done(s);
    // The helper pins the files it read; where they really were is checked
    // again, as the paths were (they could have moved meanwhile).
    auto checked = std::make_shared<v1::JobSpec>(spec);
    validator->Validate(checked, [checked, roots, done = std::move(done)](absl::Status s) {
      if (s.ok()) s = CheckPinnedInputs(*checked, *roots);
      if (s.ok()) s = PinWriteFolders(checked.get(), *roots);
      if (!s.ok()) return done(s);
      done(*checked);
    });
  };
  // A job restored from the state (a restart, a takeover): its paths and
  // pinned inputs again, as at submission (the roots may differ now).
  options_.core.recheck_restored = [roots](const v1::JobSpec& spec) {
    if (IsProgramJob(spec)) return absl::OkStatus();
    if (absl::Status s = CheckJobPaths(spec, *roots); !s.ok()) return s;
    return CheckPinnedInputs(spec, *roots);
  };
  return absl::OkStatus();
}

absl::Status CoordinatorServer::InitCore() {
  state_store_ = std::move(options_.state_store);
  if (!options_.state_dir.empty()) {
    auto opened = FileStateStore::Open(options_.state_dir);
    if (!opened.ok())
      return absl::Status(opened.status().code(),
                          absl::StrCat("--state_dir: ", opened.status().message()));
    state_store_ = std::move(*opened);
  }
  options_.core.state_store = state_store_.get();
  if (const Leadership* leadership = options_.leadership) {
    // A leader whose lease is unconfirmed for a moment pauses (worker
    // events held) rather than acting on a lease that may have lapsed.
    options_.core.may_act = [leadership] { return leadership->IsLeader(); };
  }
  core_ = std::make_unique<Coordinator>(RealClock::Get(), options_.core);
  if (!state_store_) return absl::OkStatus();
  auto saved = state_store_->Load();
  if (!saved.ok()) return saved.status();
  if (saved->has_value()) {
    core_->Restore(**saved);
    DDP_LOG(Info) << "restored state from " << state_store_->Describe();
  }
  return absl::OkStatus();
}

absl::Status CoordinatorServer::SubmitStartJob() {
  const std::string& path = options_.job_file;
  if (path.empty()) return absl::OkStatus();
  auto spec = LoadJobSpecFile(path, options_.core.build);
  if (spec.ok()) spec = SubmitAndWait(*core_, *spec);
  if (!spec.ok()) {
    return absl::Status(spec.status().code(),
                        absl::StrCat("--job ", path, ": ", spec.status().message()));
  }
  return absl::OkStatus();
}

absl::Status CoordinatorServer::InitGrpcServer() {
  watchers_ = std::make_unique<StatusWatchers>(options_.max_watch_streams);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // Every call is counted and timed by an interceptor; the rest is read
  // from the snapshot at each scrape.
  rpc_registry_ = std::make_shared<prometheus::Registry>();
  rpc_metrics_ = std::make_unique<RpcMetrics>(rpc_registry_.get(), RealClock::Get());
  Coordinator* core = core_.get();
  const Leadership* leadership = options_.leadership;
  core_metrics_ = std::make_shared<CoordinatorMetrics>([core, leadership] {
    CoordinatorSample sample;
    sample.status = core->Snapshot();
    sample.store_keys = core->store_keys();
    sample.store_bytes = core->store_bytes();
    sample.store_waiters = core->store_waiters();
    sample.attach_streams = core->streams()->open();
    if (leadership != nullptr) {
      sample.replicated = true;
      sample.is_leader = leadership->IsLeader();
      sample.leader_changes = leadership->leader_changes();
    }
    return sample;
  });
  const bool metrics_on = !options_.metrics_listen.empty();
  // Attach streams tell rpc_metrics themselves: an interceptor would see
  // each of their messages.
  service_ = std::make_unique<CoordinatorService>(
      core, watchers_.get(), options_.security.authorizer.get(),
      metrics_on ? rpc_metrics_.get() : nullptr, options_.leadership);
  if (metrics_on) {
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> creators;
    creators.push_back(rpc_metrics_->InterceptorFactory({method::kAttach}));
    builder.experimental().SetInterceptorCreators(std::move(creators));
  }
  if (options_.listener != nullptr) {
    acceptor_ = builder.experimental().AddExternalConnectionAcceptor(
        grpc::ServerBuilder::experimental_type::ExternalConnectionType::FROM_FD,
        options_.security.credentials);
    port_ = options_.listener->port();
  } else {
    builder.AddListeningPort(options_.listen, options_.security.credentials, &port_);
  }
  // One coordinator per port: gRPC would share it (SO_REUSEPORT) with a
  // second one, and the kernel would spread workers and clients over both.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.RegisterService(service_.get());
  builder.RegisterService(&health_);
  // Notice dead peers on idle connections too, not only silent heartbeats.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  grpc_server_ = builder.BuildAndStart();
  if (!grpc_server_ || port_ == 0) {
    failure_exit_code_ = 1;
    return absl::UnavailableError(
        absl::StrCat("can't listen on ", options_.listen, ": ", WhyCantListen(options_.listen)));
  }
  // The port's new connections come here from now on (the standby's
  // server had them until now).
  if (options_.listener != nullptr) options_.listener->Route(acceptor_.get());
  return absl::OkStatus();
}

// Served once the gRPC server is up (what it reads exists) and stopped
// before it goes (declared after everything it reads).
absl::Status CoordinatorServer::InitMetrics() {
  absl::Status s = ServeMetrics();
  if (s.ok() || !WaitForPort(s)) return s;
  metrics_retry_ = true;
  return absl::OkStatus();
}

absl::Status CoordinatorServer::ServeMetrics() {
  // A leader waits for a port its predecessor may hold, default or not.
  auto metrics_server =
      StartMetricsServer(options_.metrics_listen, options_.security.http,
                         options_.metrics_required || options_.leadership != nullptr);
  if (!metrics_server.ok()) return metrics_server.status();
  metrics_server_ = std::move(*metrics_server);
  if (metrics_server_) {
    metrics_server_->Register(core_metrics_);
    metrics_server_->Register(rpc_registry_);
    if (options_.extra_metrics) metrics_server_->Register(options_.extra_metrics);
  }
  return absl::OkStatus();
}

bool CoordinatorServer::WaitForPort(const absl::Status& failed) const {
  // A new leader on the machine its predecessor ran on: the deposed one
  // lets the ports go as it steps down.
  if (options_.leadership == nullptr || !absl::IsUnavailable(failed)) return false;
  DDP_LOG(Warning) << failed.message() << "; trying again every second (a deposed leader "
                   << "lets it go as it steps down)";
  return true;
}

void CoordinatorServer::RetryPorts() {
  if (metrics_retry_) {
    absl::Status s = ServeMetrics();
    metrics_retry_ = !s.ok();
  }
  if (page_retry_) {
    absl::Status s = ServeStatusPage();
    page_retry_ = !s.ok();
  }
}

// The page is null when it is off, or when the default address is taken (an
// explicit one that fails is an error).
absl::Status CoordinatorServer::InitStatusPage() {
  // Curves for the page, fed by the ticker; handlers read snapshots only.
  history_ = std::make_unique<StatusHistory>(RealClock::Get(), StatusHistory::Options{});
  Coordinator* core = core_.get();
  page_handler_ = std::make_unique<StatusPageHandler>([core] { return core->Snapshot(); },
                                                      history_.get(), RealClock::Get());
  if (options_.http_listen.empty()) return absl::OkStatus();
  absl::Status s = ServeStatusPage();
  if (s.ok() || !WaitForPort(s)) return s;
  page_retry_ = true;
  return absl::OkStatus();
}

absl::Status CoordinatorServer::ServeStatusPage() {
  HttpServer::Options http;
  http.what = "the status page";
  http.flag = "--http_listen";
  http.listen = options_.http_listen;
  http.access = options_.security.http;
  http.headers = StatusPageHeaders();
  const StatusPageHandler* handler = page_handler_.get();
  auto server = HttpServer::Start(std::move(http),
                                  [handler](absl::string_view method, absl::string_view path) {
                                    return handler->Respond(method, path);
                                  });
  if (!server.ok()) {
    if (!options_.http_required && absl::IsUnavailable(server.status()) &&
        options_.leadership == nullptr) {
      DDP_LOG(Warning) << server.status().message() << "; running without the status page";
      return absl::OkStatus();
    }
    return absl::Status(server.status().code(),
                        absl::StrCat("--http_listen: ", server.status().message()));
  }
  page_ = std::move(*server);
  if (!options_.http_port_file.empty()) {
    WriteFileAtomically(options_.http_port_file, absl::StrCat(page_->port()));
  }
  DDP_LOG(Info) << "status page at " << page_->url() << "/"
                << (options_.security.http.tokens.empty() ? "" : " (tokens required)");
  return absl::OkStatus();
}

absl::Status CoordinatorServer::AnnounceServing() {
  const CoordinatorSecurity& security = options_.security;
  if (!security.local_tokens.empty()) {
    if (absl::Status s = WriteLocalTokens(port_, security.local_tokens); !s.ok()) return s;
    absl::StatusOr<HostPort> asked = ParseHostPort(options_.listen, /*allow_port_zero=*/true);
    remove_local_tokens_ = asked.ok() && asked->port == 0;
    DDP_LOG(Info) << "tokens required: this user's, in " << LocalTokenPath(port_, Role::kAdmin)
                  << " and " << LocalTokenPath(port_, Role::kWorker)
                  << " (--allow_anonymous_loopback: none)";
  }
  if (!options_.port_file.empty()) WriteFileAtomically(options_.port_file, absl::StrCat(port_));
  DDP_LOG(Info) << "serving ddp.v1.Coordinator " << kVersion << " on port " << port_ << " (listen "
                << options_.listen << ", " << security.transport
                << (security.authorizer ? ", tokens required" : ", no tokens") << ")";
  return absl::OkStatus();
}

void CoordinatorServer::StartTicker() {
  ticker_ = std::thread([this] { TickLoop(); });
}

void CoordinatorServer::TickLoop() {
  absl::Time trimmed = absl::Now();
  absl::Time ports_tried = absl::Now();
  while (!stopping_) {
    // A leader whose lease may have lapsed decides nothing more.
    if (options_.leadership != nullptr && !options_.leadership->IsLeader()) {
      absl::SleepFor(absl::Milliseconds(50));
      continue;
    }
    core_->Tick();
    const absl::Time now = absl::Now();
    if ((metrics_retry_ || page_retry_) && now - ports_tried >= absl::Seconds(1)) {
      RetryPorts();
      ports_tried = now;
    }
    watchers_->Broadcast([this](const std::string& id) { return core_->JobStatusView(id); }, now);
    if (page_) history_->Record(*core_->Snapshot());
    if (now - trimmed >= absl::Seconds(5)) {
      ReturnFreeMemory();
      trimmed = now;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
}

int CoordinatorServer::Wait() {
  int exit_code = 0;
  absl::Time ended_at = absl::InfiniteFuture();
  while (true) {
    if (int sig = WaitForTermination(absl::Milliseconds(100)); sig != 0) {
      DDP_LOG(Info) << "got " << (sig == SIGINT ? "SIGINT" : "SIGTERM") << "; shutting down";
      return exit_code;
    }
    if (options_.exit_when_done && JobOver(ended_at, exit_code)) return exit_code;
    // Only a term that is over for good: a lease unconfirmed for a moment
    // pauses the coordinator (the ticker and every call wait it out).
    if (options_.leadership != nullptr && options_.leadership->Deposed()) {
      return kLostLeadership;
    }
  }
}

bool CoordinatorServer::JobOver(absl::Time& ended_at, int& exit_code) {
  const auto snapshot = core_->Snapshot();
  const v1::JobState state = snapshot->state();
  // Every job of the pool, and the queue: a queued job starts at the next
  // tick, so the coordinator's work isn't done.
  bool ended = Ended(state) && snapshot->queued_jobs() == 0;
  for (const v1::JobSummary& job : snapshot->jobs()) ended = ended && Ended(job.state());
  if (!ended) return false;
  if (ended_at == absl::InfiniteFuture()) {
    ended_at = absl::Now();
    exit_code = ExitCodeFor(*snapshot);
    DDP_LOG(Info) << "job ended (" << v1::JobState_Name(state) << ": " << snapshot->message()
                  << "); stopping workers";
    core_->StopAllWorkers("the job ended and the coordinator exits");
  }
  // Give workers a moment to take the stop and hang up.
  return snapshot->attached_workers() == 0 || absl::Now() - ended_at > absl::Seconds(3);
}

void CoordinatorServer::WriteStatusFile() {
  if (options_.status_file.empty()) return;
  core_->Tick();  // publish the latest state
  std::string json;
  google::protobuf::util::MessageToJsonString(*core_->StatusView(), &json);
  WriteFileAtomically(options_.status_file, json);
}

void CoordinatorServer::Stop() {
  if (stopped_) return;
  stopped_ = true;
  // A check in progress is stopped and its submission answered UNAVAILABLE,
  // before the core stops deciding: no job is accepted that is not saved.
  if (validator_) validator_->Shutdown();
  if (!ticker_.joinable()) {
    // Start failed: nothing served long enough to need an orderly end.
    if (grpc_server_ && options_.listener != nullptr) options_.listener->Route(nullptr);
    if (grpc_server_) grpc_server_->Shutdown();
    return;
  }
  WriteStatusFile();
  health_.SetServing(false);
  // Streams close as the server stops: that is not the workers' doing, and
  // the generation they train in must survive for the next start to adopt.
  core_->BeginShutdown();
  core_->FlushState();
  watchers_->FinishAll();
  if (options_.listener != nullptr) options_.listener->Route(nullptr);
  grpc_server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  stopping_ = true;
  ticker_.join();
  page_.reset();  // waits for requests in progress, before what they read goes
  if (remove_local_tokens_) RemoveLocalTokens(port_);
  DDP_LOG(Info) << "stopped";
}

}  // namespace ddp
