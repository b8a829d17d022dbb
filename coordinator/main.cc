// ddp-coordinator: assigns ranks, epochs and sampler seeds to workers, serves
// their rendezvous store, and shows operators the whole job.
#include <malloc.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <thread>
#include <tuple>

#include "absl/cleanup/cleanup.h"
#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "common/clock.h"
#include "common/credentials.h"
#include "common/http_server.h"
#include "common/job_spec.h"
#include "common/local_tokens.h"
#include "common/logging.h"
#include "common/metrics_server.h"
#include "common/net_address.h"
#include "common/process.h"
#include "common/tokens.h"
#include "common/version.h"
#include "coordinator/authorizer.h"
#include "coordinator/coordinator.h"
#include "coordinator/coordinator_metrics.h"
#include "coordinator/health_service.h"
#include "coordinator/helper_check.h"
#include "coordinator/helper_process.h"
#include "coordinator/job_validator.h"
#include "coordinator/path_policy.h"
#include "coordinator/rpc_metrics.h"
#include "coordinator/service.h"
#include "coordinator/state_store.h"
#include "coordinator/status_history.h"
#include "coordinator/status_page.h"
#include "coordinator/status_summary.h"
#include "coordinator/status_watchers.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "prometheus/registry.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:29400",
          "address:port to serve on; port 0 picks a free port (see --port_file)");
ABSL_FLAG(std::string, job, "", "JobSpec file (protobuf JSON) to run at start");
ABSL_FLAG(std::string, state_dir, "",
          "directory where the job and generation numbers survive restarts (none: memory only)");
ABSL_FLAG(absl::Duration, heartbeat_interval, absl::Seconds(1),
          "how often workers send heartbeats");
ABSL_FLAG(absl::Duration, heartbeat_timeout, absl::Seconds(5), "a worker silent this long is lost");
ABSL_FLAG(absl::Duration, adopt_grace, absl::Seconds(10),
          "after a restart, how long the saved generation's members have to come back before it "
          "is re-formed without the missing ones");
ABSL_FLAG(bool, exit_when_done, false,
          "when the job ends, stop every worker and exit: 0 if it succeeded, 1 if it failed, "
          "3 if it was cancelled");
ABSL_FLAG(std::string, port_file, "", "write the port served on to this file once serving");
ABSL_FLAG(uint32_t, max_attach_streams, 20000,
          "most worker (Attach) streams open at once, registered or not; more are refused "
          "with RESOURCE_EXHAUSTED");
ABSL_FLAG(absl::Duration, register_deadline, absl::Seconds(10),
          "an Attach stream that sends no RegisterRequest this long after opening is closed "
          "with DEADLINE_EXCEEDED");
ABSL_FLAG(uint32_t, max_watch_streams, 64,
          "most WatchStatus streams open at once; more are refused with RESOURCE_EXHAUSTED");
ABSL_FLAG(uint32_t, status_workers, ddp::kDefaultStatusWorkers,
          "workers GetStatus and WatchStatus list in full; their summary counts every worker, "
          "and ListWorkers pages through all of them");
ABSL_FLAG(std::string, status_file, "",
          "on exit, write the final GetStatus answer to this file (protobuf JSON)");
ABSL_FLAG(std::string, data_root, "/usr/share/datasets,/var/lib/ddp/data",
          "comma-separated folders a job's model and data files may come from (every symlink "
          "resolved); others are refused at submission");
ABSL_FLAG(std::string, output_root, "/var/lib/ddp/output,/var/lib/ddp/checkpoints",
          "comma-separated folders a job's output_path and checkpoint.dir may be in");
ABSL_FLAG(uint64_t, max_input_size, uint64_t{1} << 30,
          "largest model or data file a job may name, in bytes");
ABSL_FLAG(std::string, validate_helper, "",
          "the program that checks a submitted job's model and data (default: ddp-validate "
          "beside this binary)");
ABSL_FLAG(std::string, validate_user, "nobody",
          "the user the job check runs as (it runs the job's own code) when the coordinator may "
          "change user: as root, or holding CAP_SETUID and CAP_SETGID (the systemd unit); the "
          "job's files must be readable by it");
ABSL_FLAG(absl::Duration, validate_timeout, absl::Seconds(60),
          "a job check still running after this long is stopped and the submission refused "
          "with DEADLINE_EXCEEDED; its CPU time limit is this plus 10 seconds");
ABSL_FLAG(uint64_t, validate_memory, uint64_t{4} << 30,
          "address space a job check may use, in bytes");
ABSL_FLAG(int32_t, validate_concurrency, 2, "job checks run at once");
ABSL_FLAG(bool, allow_unconfined_checks, false,
          "let ddp-validate run a job's code where the kernel can't confine it (no Landlock); "
          "without it such a machine refuses every submission that needs a check");
ABSL_FLAG(int32_t, validate_queue, 4,
          "job checks waiting for their turn; a submission beyond them is refused with "
          "RESOURCE_EXHAUSTED");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate (chain) the coordinator presents: serve TLS (needs --tls_key)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA certificate(s): every client must present a certificate they signed "
          "(mutual TLS); needs --tls_cert");
ABSL_FLAG(std::string, tokens_file, "",
          "file of \"<role> <token>\" lines (roles worker, operator, admin; # comments): every "
          "call must then carry \"authorization: Bearer <token>\" of a role allowed to make it, "
          "and store calls the caller's store token; see README");
ABSL_FLAG(bool, insecure, false,
          "allow --listen, --metrics_listen and --http_listen addresses other than loopback "
          "without TLS and --tokens_file (on a network you trust: anyone who reaches the port "
          "can cancel jobs or join as a worker, or read the job's status)");
// The default metrics address: if it is taken, the coordinator runs without
// metrics rather than not at all.
constexpr char kDefaultMetricsListen[] = "127.0.0.1:9400";
ABSL_FLAG(std::string, metrics_listen, kDefaultMetricsListen,
          "HOST:PORT to serve Prometheus metrics on (/metrics); port 0 picks one; empty: off. "
          "With --tls_cert it is HTTPS (--tls_ca: client certificates required), with "
          "--tokens_file it needs an operator or admin token; off loopback only with both, or "
          "--insecure. If the default is taken, the coordinator runs without metrics; an "
          "address given explicitly that can't be bound is an error");
// The default status page address: if it is taken (a second coordinator on
// the machine), the coordinator runs without the page rather than not at all.
constexpr char kDefaultHttpListen[] = "127.0.0.1:9401";
ABSL_FLAG(std::string, http_listen, kDefaultHttpListen,
          "HOST:PORT of the live status page (http://HOST:PORT/; the same as JSON at "
          "/api/status); HOST an IP address or localhost, port 0 picks one (see "
          "--http_port_file); empty: off. TLS and tokens as for --metrics_listen (a browser "
          "asks for the token as a password). If the default is taken, the coordinator runs "
          "without the page; an address given explicitly that can't be bound is an error");
ABSL_FLAG(std::string, http_port_file, "",
          "write the status page's port to this file once serving");
ABSL_FLAG(int32_t, http_max_connections_per_address, 16,
          "connections one remote address may hold open to the status page (and, separately, "
          "to the metrics) while still sending their request; one more ends the oldest of them");
ABSL_FLAG(int32_t, http_max_connections, 512,
          "connections the status page (and, separately, the metrics) holds open in all; an "
          "eighth is kept for requests being answered (one more unfinished request ends the "
          "oldest), and beyond it connections wait in the kernel's accept queue");
ABSL_FLAG(absl::Duration, http_header_timeout, absl::Seconds(5),
          "a connection to the status page or metrics that has not sent its whole request head "
          "this long after connecting is closed (however steadily it trickles: slowloris)");
ABSL_FLAG(bool, allow_anonymous_loopback, false,
          "on a loopback --listen without --tokens_file, let any local user call every RPC "
          "(submit, cancel, attach as a worker, the store); by default a worker and an admin "
          "token are made and written, readable by this user only, to "
          "$XDG_RUNTIME_DIR/ddp/coordinator-PORT-{worker,admin}.token (/tmp/ddp-UID/ without "
          "XDG_RUNTIME_DIR), where this user's workers, ddp-run and clients find them");
ABSL_FLAG(bool, allow_readable_tokens, false,
          "start even when --tokens_file may be read by other users (as ssh refuses such "
          "keys, the coordinator otherwise refuses to start)");

namespace ddp {
namespace {

constexpr char kUsage[] =
    "ddp-coordinator: assigns ranks to ddp-worker daemons and watches the job.\n"
    "  ddp-coordinator --listen 127.0.0.1:29400 --job job.json --state_dir /var/lib/ddp\n"
    "Off loopback it needs TLS and tokens (or --insecure):\n"
    "  ddp-coordinator --listen 0.0.0.0:29400 --tls_cert coordinator.crt --tls_key "
    "coordinator.key \\\n"
    "      --tls_ca ca.crt --tokens_file /etc/ddp/tokens\n"
    "Operators: grpcurl -cacert ca.crt -cert op.crt -key op.key -H 'authorization: Bearer TOKEN' "
    "\\\n"
    "      HOST:29400 ddp.v1.Coordinator/GetStatus   (on loopback without TLS: -plaintext)";

// What the server's transport and callers must prove, from the flags; or
// why the flags don't make sense (exit 2).
struct Security {
  std::shared_ptr<grpc::ServerCredentials> credentials;
  std::unique_ptr<Authorizer> authorizer;  // null: every call allowed
  // Made at start (no --tokens_file, on loopback): written to their local
  // files once the port is known (common/local_tokens.h).
  std::vector<TokenEntry> local_tokens;
  // The metrics and the status page: the same certificate, CA and tokens.
  HttpAccess http;
};

absl::StatusOr<Security> LoadSecurity() {
  const std::string listen = absl::GetFlag(FLAGS_listen);
  if (!absl::StartsWith(listen, "unix:")) {
    if (auto parsed = ParseHostPort(listen, /*allow_port_zero=*/true); !parsed.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--listen: ", parsed.status().message()));
    }
  }
  const TlsFlags tls{absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key),
                     absl::GetFlag(FLAGS_tls_ca)};
  const std::string tokens_file = absl::GetFlag(FLAGS_tokens_file);
  if (!IsLocalAddress(listen) && (tls.cert.empty() || tokens_file.empty())) {
    if (!absl::GetFlag(FLAGS_insecure)) {
      std::vector<std::string> missing;
      if (tls.cert.empty()) missing.push_back("--tls_cert and --tls_key (TLS)");
      if (tokens_file.empty()) missing.push_back("--tokens_file (callers' tokens and roles)");
      return absl::FailedPreconditionError(absl::StrCat(
          "refusing to listen on ", listen, " without ", absl::StrJoin(missing, " and "),
          ": anyone who reaches that address could cancel jobs, read the rendezvous store or "
          "join as a worker. Set --tls_cert, --tls_key (and --tls_ca to require client "
          "certificates) and --tokens_file, listen on 127.0.0.1, or pass --insecure on a "
          "network you trust (see README, \"Running it safely\")"));
    }
    DDP_LOG(Warning) << "--insecure: serving " << listen << " without "
                     << (tls.cert.empty() ? "TLS" : "")
                     << (tls.cert.empty() && tokens_file.empty() ? " or " : "")
                     << (tokens_file.empty() ? "tokens" : "")
                     << "; anyone who reaches it may control the job";
  }
  Security security;
  security.http.tls_cert = tls.cert;
  security.http.tls_key = tls.key;
  security.http.tls_ca = tls.ca;
  security.http.insecure = absl::GetFlag(FLAGS_insecure);
  security.http.max_connections_per_address = absl::GetFlag(FLAGS_http_max_connections_per_address);
  security.http.max_connections = absl::GetFlag(FLAGS_http_max_connections);
  security.http.header_timeout = absl::GetFlag(FLAGS_http_header_timeout);
  auto credentials = MakeServerCredentials(tls);
  if (!credentials.ok()) return credentials.status();
  security.credentials = std::move(*credentials);
  if (!tokens_file.empty()) {
    auto tokens =
        LoadTokensFile("--tokens_file", tokens_file, absl::GetFlag(FLAGS_allow_readable_tokens));
    if (!tokens.ok()) return tokens.status();
    int counts[3] = {0, 0, 0};
    for (const TokenEntry& t : *tokens) ++counts[static_cast<int>(t.role)];
    DDP_LOG(Info) << "tokens required: " << counts[0] << " worker, " << counts[1] << " operator, "
                  << counts[2] << " admin token(s) from " << tokens_file;
    security.http.tokens = *tokens;
    security.authorizer = std::make_unique<Authorizer>(std::move(*tokens));
  } else if (IsLocalAddress(listen) && !absl::StartsWith(listen, "unix:") &&
             !absl::GetFlag(FLAGS_allow_anonymous_loopback)) {
    // No anonymous admin, even on loopback: this user's own tokens. A
    // restart on the same port keeps the earlier ones. The pages stay
    // open on loopback: they only show.
    absl::StatusOr<HostPort> at = ParseHostPort(listen, /*allow_port_zero=*/true);
    if (at.ok() && at->port != 0) security.local_tokens = ReadLocalTokens(at->port);
    if (security.local_tokens.empty()) security.local_tokens = NewLocalTokens();
    // A known port's files are written before it serves: a worker waiting
    // for it finds its token as soon as it can connect.
    if (at.ok() && at->port != 0) {
      if (absl::Status s = WriteLocalTokens(at->port, security.local_tokens); !s.ok()) return s;
    }
    security.authorizer = std::make_unique<Authorizer>(security.local_tokens);
  }
  return security;
}

// Serves the page once the core exists; null when it is off, or when the
// default address is taken (an explicit one that fails is an error).
absl::StatusOr<std::unique_ptr<HttpServer>> StartStatusPage(const StatusPageHandler* handler,
                                                            const HttpAccess& access) {
  const std::string listen = absl::GetFlag(FLAGS_http_listen);
  if (listen.empty()) return nullptr;
  HttpServer::Options options;
  options.what = "the status page";
  options.flag = "--http_listen";
  options.listen = listen;
  options.access = access;
  options.headers = StatusPageHeaders();
  auto server = HttpServer::Start(std::move(options),
                                  [handler](absl::string_view method, absl::string_view path) {
                                    return handler->Respond(method, path);
                                  });
  if (!server.ok()) {
    if (listen == kDefaultHttpListen && absl::IsUnavailable(server.status())) {
      DDP_LOG(Warning) << server.status().message() << "; running without the status page";
      return nullptr;
    }
    return server.status();
  }
  if (const std::string file = absl::GetFlag(FLAGS_http_port_file); !file.empty()) {
    std::ofstream(file + ".tmp") << (*server)->port() << "\n";
    std::rename((file + ".tmp").c_str(), file.c_str());
  }
  DDP_LOG(Info) << "status page at " << (*server)->url() << "/"
                << (access.tokens.empty() ? "" : " (tokens required)");
  return server;
}

int ExitCodeFor(v1::JobState state) {
  switch (state) {
    case v1::JOB_STATE_SUCCEEDED:
      return 0;
    case v1::JOB_STATE_CANCELLED:
      return 3;
    default:
      return 1;
  }
}

std::string BinDir() {
  char path[4096] = {};
  const ssize_t n = ::readlink("/proc/self/exe", path, sizeof(path) - 1);
  std::string exe(path, n > 0 ? n : 0);
  return exe.substr(0, exe.rfind('/'));
}

absl::StatusOr<PathRoots> RootsFromFlags() {
  PathRoots roots;
  auto data = ParseRootList("--data_root", absl::GetFlag(FLAGS_data_root));
  if (!data.ok()) return data.status();
  auto output = ParseRootList("--output_root", absl::GetFlag(FLAGS_output_root));
  if (!output.ok()) return output.status();
  roots.data = std::move(*data);
  roots.output = std::move(*output);
  roots.max_input_bytes = absl::GetFlag(FLAGS_max_input_size);
  return roots;
}

absl::StatusOr<std::unique_ptr<HelperProcess>> HelperFromFlags() {
  const absl::Duration timeout = absl::GetFlag(FLAGS_validate_timeout);
  if (timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--validate_timeout must be positive");
  }
  HelperProcess::Options helper;
  helper.program = absl::GetFlag(FLAGS_validate_helper);
  if (helper.program.empty()) helper.program = BinDir() + "/ddp-validate";
  if (absl::GetFlag(FLAGS_allow_unconfined_checks)) helper.args = {"--allow_unconfined"};
  // Nothing of the coordinator's environment; one thread for a batch of two.
  helper.env = {"PATH=/usr/bin:/bin", "OMP_NUM_THREADS=1", "OPENBLAS_NUM_THREADS=1",
                "MKL_NUM_THREADS=1"};
  helper.user = absl::GetFlag(FLAGS_validate_user);
  helper.max_address_space_bytes = absl::GetFlag(FLAGS_validate_memory);
  // The wall-clock deadline normally ends a check; the CPU limit catches one
  // that burns many threads at once.
  helper.max_cpu_seconds = static_cast<uint64_t>(std::ceil(absl::ToDoubleSeconds(timeout))) + 10;
  return HelperProcess::Create(std::move(helper));
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

int Run() {
  SetLogIdentity("coordinator");
  absl::StatusOr<Security> security = LoadSecurity();
  if (!security.ok()) {
    DDP_LOG(Error) << security.status().message();
    return 2;
  }
  const std::string metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  const std::string http_listen = absl::GetFlag(FLAGS_http_listen);
  for (const auto& [flag, what, listen] :
       {std::tuple{"--metrics_listen", "metrics", metrics_listen},
        std::tuple{"--http_listen", "the status page", http_listen}}) {
    if (listen.empty()) continue;
    if (absl::Status s = CheckHttpListen(flag, what, listen, security->http); !s.ok()) {
      DDP_LOG(Error) << s.message();
      return 2;
    }
  }
  absl::StatusOr<PathRoots> roots = RootsFromFlags();
  if (!roots.ok()) {
    DDP_LOG(Error) << roots.status().message();
    return 2;
  }
  if (absl::GetFlag(FLAGS_validate_concurrency) < 1 || absl::GetFlag(FLAGS_validate_queue) < 0) {
    DDP_LOG(Error) << "--validate_concurrency must be at least 1, --validate_queue at least 0";
    return 2;
  }
  absl::StatusOr<std::unique_ptr<HelperProcess>> helper = HelperFromFlags();
  if (!helper.ok()) {
    DDP_LOG(Error) << "job checks: " << helper.status().message()
                   << " (see --validate_helper, --validate_user)";
    return 2;
  }
  // User code and user files are looked at only in the helper: the
  // coordinator itself only stats paths.
  JobValidator validator(
      {absl::GetFlag(FLAGS_validate_concurrency), absl::GetFlag(FLAGS_validate_queue)},
      HelperCheck(helper->get(), absl::GetFlag(FLAGS_validate_timeout)));
  DDP_LOG(Info) << "jobs are checked by " << (*helper)->options().program << " as "
                << (*helper)->user_description() << "; data from " << absl::GetFlag(FLAGS_data_root)
                << ", outputs to " << absl::GetFlag(FLAGS_output_root);
  Coordinator::Options options;
  // With a tokens file a worker token is not enough for a store: its
  // generation's store token is needed too. A local coordinator's worker
  // token is its user's alone, so that user's processes are trusted alike.
  options.require_store_tokens = security->authorizer != nullptr && security->local_tokens.empty();
  options.registry.name_version_in_refusals = security->authorizer != nullptr;
  options.build = ThisBuild();
  options.registry.heartbeat_timeout = absl::GetFlag(FLAGS_heartbeat_timeout);
  options.heartbeat_interval = absl::GetFlag(FLAGS_heartbeat_interval);
  options.status_workers = absl::GetFlag(FLAGS_status_workers);
  if (options.heartbeat_interval <= absl::ZeroDuration() ||
      options.registry.heartbeat_timeout <= options.heartbeat_interval) {
    DDP_LOG(Error) << "--heartbeat_timeout must be longer than --heartbeat_interval > 0";
    return 2;
  }
  options.adopt_grace = absl::GetFlag(FLAGS_adopt_grace);
  options.streams.max_streams = absl::GetFlag(FLAGS_max_attach_streams);
  options.streams.register_deadline = absl::GetFlag(FLAGS_register_deadline);
  if (options.streams.max_streams == 0 ||
      options.streams.register_deadline <= absl::ZeroDuration()) {
    DDP_LOG(Error) << "--max_attach_streams and --register_deadline must be positive";
    return 2;
  }
  options.validate_job = [&roots, &validator](
                             const v1::JobSpec& spec,
                             std::function<void(absl::StatusOr<v1::JobSpec>)> done) {
    // A program's job names no model or data file: nothing to check.
    if (IsProgramJob(spec)) return done(spec);
    // The paths first: a stat each, quick, and it needs no queue.
    if (absl::Status s = CheckJobPaths(spec, *roots); !s.ok()) return done(s);
    // The helper pins the files it read; where they really were is checked
    // again, as the paths were (they could have moved meanwhile).
    auto checked = std::make_shared<v1::JobSpec>(spec);
    const PathRoots* allowed = &*roots;
    validator.Validate(checked, [checked, allowed, done = std::move(done)](absl::Status s) {
      if (s.ok()) s = CheckPinnedInputs(*checked, *allowed);
      if (!s.ok()) return done(s);
      done(*checked);
    });
  };
  std::unique_ptr<StateStore> state_store;
  if (const std::string dir = absl::GetFlag(FLAGS_state_dir); !dir.empty()) {
    auto opened = StateStore::Open(dir);
    if (!opened.ok()) {
      DDP_LOG(Error) << "--state_dir: " << opened.status().message();
      return 2;
    }
    state_store = std::move(*opened);
    options.state_store = state_store.get();
  }
  Coordinator core(RealClock::Get(), options);
  // Checks still running call into the core: they end before it goes.
  absl::Cleanup stop_checks = [&validator] { validator.Shutdown(); };
  if (state_store) {
    auto saved = state_store->Load();
    if (!saved.ok()) {
      DDP_LOG(Error) << saved.status().message();
      return 2;
    }
    if (saved->has_value()) {
      core.Restore(**saved);
      DDP_LOG(Info) << "restored state from " << state_store->path();
    }
  }
  if (const std::string path = absl::GetFlag(FLAGS_job); !path.empty()) {
    auto spec = LoadJobSpecFile(path, options.build);
    if (spec.ok()) spec = SubmitAndWait(core, *spec);
    if (!spec.ok()) {
      DDP_LOG(Error) << "--job " << path << ": " << spec.status().message();
      return 2;
    }
  }

  StatusWatchers watchers(absl::GetFlag(FLAGS_max_watch_streams));
  HealthService health;
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // Every call is counted and timed by an interceptor; the rest is read
  // from the snapshot at each scrape.
  auto rpc_registry = std::make_shared<prometheus::Registry>();
  RpcMetrics rpc_metrics(rpc_registry.get(), RealClock::Get());
  auto core_metrics = std::make_shared<CoordinatorMetrics>([&core] {
    CoordinatorSample sample;
    sample.status = core.Snapshot();
    sample.store_keys = core.store_keys();
    sample.store_bytes = core.store_bytes();
    sample.store_waiters = core.store_waiters();
    sample.attach_streams = core.streams()->open();
    return sample;
  });
  // Attach streams tell rpc_metrics themselves: an interceptor would see
  // each of their messages.
  CoordinatorService service(&core, &watchers, security->authorizer.get(),
                             metrics_listen.empty() ? nullptr : &rpc_metrics);
  if (!metrics_listen.empty()) {
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> creators;
    creators.push_back(rpc_metrics.InterceptorFactory({method::kAttach}));
    builder.experimental().SetInterceptorCreators(std::move(creators));
  }
  int port = 0;
  builder.AddListeningPort(absl::GetFlag(FLAGS_listen), security->credentials, &port);
  builder.RegisterService(&service);
  builder.RegisterService(&health);
  // Notice dead peers on idle connections too, not only silent heartbeats.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    DDP_LOG(Error) << "can't listen on " << absl::GetFlag(FLAGS_listen)
                   << " (address in use, or not an address of this host?)";
    return 1;
  }
  // Served once the gRPC server is up (what it reads exists) and stopped
  // before it goes (declared after everything it reads).
  auto metrics_server = StartMetricsServer(metrics_listen, security->http,
                                           /*required=*/metrics_listen != kDefaultMetricsListen);
  if (!metrics_server.ok()) {
    DDP_LOG(Error) << metrics_server.status().message();
    server->Shutdown();
    return 2;
  }
  if (*metrics_server) {
    (*metrics_server)->Register(core_metrics);
    (*metrics_server)->Register(rpc_registry);
  }
  // Curves for the page, fed by the ticker; handlers read snapshots only.
  StatusHistory history(RealClock::Get(), StatusHistory::Options{});
  StatusPageHandler page_handler([&core] { return core.Snapshot(); }, &history, RealClock::Get());
  absl::StatusOr<std::unique_ptr<HttpServer>> page = StartStatusPage(&page_handler, security->http);
  if (!page.ok()) {
    DDP_LOG(Error) << "--http_listen: " << page.status().message();
    server->Shutdown();
    return 2;
  }
  if (!security->local_tokens.empty()) {
    if (absl::Status s = WriteLocalTokens(port, security->local_tokens); !s.ok()) {
      DDP_LOG(Error) << s.message();
      server->Shutdown();
      return 2;
    }
    DDP_LOG(Info) << "tokens required: this user's, in " << LocalTokenPath(port, Role::kAdmin)
                  << " and " << LocalTokenPath(port, Role::kWorker)
                  << " (--allow_anonymous_loopback: none)";
  }
  if (const std::string file = absl::GetFlag(FLAGS_port_file); !file.empty()) {
    std::ofstream(file + ".tmp") << port << "\n";
    std::rename((file + ".tmp").c_str(), file.c_str());
  }
  DDP_LOG(Info) << "serving ddp.v1.Coordinator " << kVersion << " on port " << port << " (listen "
                << absl::GetFlag(FLAGS_listen) << ", "
                << (absl::GetFlag(FLAGS_tls_cert).empty() ? "plaintext"
                    : absl::GetFlag(FLAGS_tls_ca).empty() ? "TLS"
                                                          : "mutual TLS")
                << (security->authorizer ? ", tokens required" : ", no tokens") << ")";

  std::atomic<bool> stopping{false};
  std::thread ticker([&] {
    absl::Time trimmed = absl::Now();
    while (!stopping) {
      core.Tick();
      const absl::Time now = absl::Now();
      watchers.Broadcast(core.StatusView(), now);
      if (*page) history.Record(*core.Snapshot());
      if (now - trimmed >= absl::Seconds(5)) {
        ReturnFreeMemory();
        trimmed = now;
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
  });

  int exit_code = 0;
  absl::Time ended_at = absl::InfiniteFuture();
  while (true) {
    if (int sig = WaitForTermination(absl::Milliseconds(100)); sig != 0) {
      DDP_LOG(Info) << "got " << (sig == SIGINT ? "SIGINT" : "SIGTERM") << "; shutting down";
      break;
    }
    if (!absl::GetFlag(FLAGS_exit_when_done)) continue;
    const auto snapshot = core.Snapshot();
    const v1::JobState state = snapshot->state();
    const bool ended = state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED ||
                       state == v1::JOB_STATE_CANCELLED;
    if (!ended) continue;
    if (ended_at == absl::InfiniteFuture()) {
      ended_at = absl::Now();
      exit_code = ExitCodeFor(state);
      DDP_LOG(Info) << "job ended (" << v1::JobState_Name(state) << ": " << snapshot->message()
                    << "); stopping workers";
      core.StopAllWorkers("the job ended and the coordinator exits");
    }
    // Give workers a moment to take the stop and hang up.
    if (snapshot->attached_workers() == 0 || absl::Now() - ended_at > absl::Seconds(3)) break;
  }
  // A check in progress is stopped and its submission answered UNAVAILABLE,
  // before the core stops deciding: no job is accepted that is not saved.
  validator.Shutdown();
  if (const std::string file = absl::GetFlag(FLAGS_status_file); !file.empty()) {
    core.Tick();  // publish the latest state
    std::string json;
    google::protobuf::util::MessageToJsonString(*core.StatusView(), &json);
    std::ofstream(file + ".tmp") << json << "\n";
    std::rename((file + ".tmp").c_str(), file.c_str());
  }
  health.SetServing(false);
  // Streams close as the server stops: that is not the workers' doing, and
  // the generation they train in must survive for the next start to adopt.
  core.BeginShutdown();
  core.FlushState();
  watchers.FinishAll();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  stopping = true;
  ticker.join();
  page->reset();  // waits for requests in progress, before what they read goes
  DDP_LOG(Info) << "stopped";
  return exit_code;
}

}  // namespace
}  // namespace ddp

int main(int argc, char** argv) {
  ddp::CatchTerminationSignals();
  ddp::ParseFlagsOrExit(argc, argv, ddp::kUsage);
  return ddp::Run();
}
