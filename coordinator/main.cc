// ddp-coordinator: assigns ranks, epochs and sampler seeds to workers, serves
// their rendezvous store, and shows operators the whole job.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <tuple>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/credentials.h"
#include "common/http_server.h"
#include "common/local_tokens.h"
#include "common/logging.h"
#include "common/net_address.h"
#include "common/process.h"
#include "common/quote.h"
#include "common/tokens.h"
#include "common/version.h"
#include "coordinator/authorizer.h"
#include "coordinator/coordinator_server.h"
#include "coordinator/failover.h"
#include "coordinator/helper_process.h"
#include "coordinator/job_queue.h"
#include "coordinator/path_policy.h"
#include "coordinator/status_summary.h"

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
ABSL_FLAG(uint32_t, job_history, ddp::kDefaultJobHistory,
          "how many ended jobs the coordinator keeps in its durable state (ListJobs, GetJob and "
          "GetStatus answer for them after restarts and takeovers; a --job among them is not "
          "run again); at most 10000");
ABSL_FLAG(bool, exit_when_done, false,
          "when every job has ended (none running or queued), stop every worker and exit: 0 if "
          "every job succeeded, 1 if any failed, else 3 if any was cancelled");
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
ABSL_FLAG(std::string, etcd_endpoints, "",
          "HOST:PORT,... of an etcd cluster: keep the state there instead of --state_dir, and "
          "fail over with the other coordinators given the same endpoints and --etcd_prefix (one "
          "leads, the others stand by)");
ABSL_FLAG(std::string, etcd_prefix, "/ddp/default",
          "the etcd key prefix of this cluster of coordinators' state");
ABSL_FLAG(std::string, etcd_tls_ca, "", "PEM CA that etcd's certificate must chain to (TLS)");
ABSL_FLAG(std::string, etcd_tls_cert, "", "PEM client certificate for etcd (mutual TLS)");
ABSL_FLAG(std::string, etcd_tls_key, "", "PEM private key of --etcd_tls_cert");
ABSL_FLAG(std::string, etcd_user, "",
          "authenticate to etcd as this user (etcd's RBAC; its password in "
          "--etcd_password_file). With --etcd_tls_cert etcd can take the user from the "
          "certificate instead");
ABSL_FLAG(std::string, etcd_password_file, "",
          "a file holding --etcd_user's password (one line; readable by this user only)");
ABSL_FLAG(std::string, state_key_file, "",
          "the secret that seals the state in etcd (at least 32 characters, readable by this "
          "user only; the same file on every coordinator of the cluster): state not sealed with "
          "it is refused. Empty: one made for this user on this machine, next to the local "
          "tokens");
ABSL_FLAG(absl::Duration, lease_ttl, absl::Seconds(2),
          "the leader's etcd lease: a standby takes over this long after the leader is lost "
          "(whole seconds, etcd's unit)");
ABSL_FLAG(std::string, advertise_address, "",
          "HOST:PORT clients dial this coordinator at, told to them by the others (default: "
          "--listen)");
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
absl::StatusOr<CoordinatorSecurity> LoadSecurity() {
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
  CoordinatorSecurity security;
  security.transport = tls.cert.empty() ? "plaintext" : tls.ca.empty() ? "TLS" : "mutual TLS";
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
    for (const TokenEntry& t : tokens->tokens) ++counts[static_cast<int>(t.role)];
    DDP_LOG(Info) << "tokens required: " << counts[0] << " worker, " << counts[1] << " operator, "
                  << counts[2] << " admin token(s) from " << tokens_file;
    security.http.tokens = tokens->tokens;
    for (const auto& [owner, quota] : tokens->quotas) {
      DDP_LOG(Info) << "the jobs of " << Quote(owner) << " may hold " << quota
                    << " worker(s) together";
    }
    security.owner_quotas = std::move(tokens->quotas);
    for (const auto& [owner, limits] : tokens->limits) {
      DDP_LOG(Info) << "the jobs of " << Quote(owner) << ": priority at most "
                    << limits.max_priority.value_or(0) << ", "
                    << (limits.max_queued ? absl::StrCat(*limits.max_queued)
                                          : absl::StrCat("a fair share (", kMaxQueuedJobs, "/",
                                                         tokens->limits.size(), ")"))
                    << " queued at once";
    }
    security.owner_limits = std::move(tokens->limits);
    security.authorizer = std::make_unique<Authorizer>(std::move(tokens->tokens));
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

// The core's options from the flags (all but validate_job and state_store,
// which the server sets), or why they make no sense.
absl::Status CoreOptionsFromFlags(const CoordinatorSecurity& security,
                                  Coordinator::Options& options) {
  // With a tokens file a worker token is not enough for a store: its
  // generation's store token is needed too. A local coordinator's worker
  // token is its user's alone, so that user's processes are trusted alike.
  options.require_store_tokens = security.authorizer != nullptr && security.local_tokens.empty();
  options.registry.name_version_in_refusals = security.authorizer != nullptr;
  options.build = ThisBuild();
  options.owner_quotas = security.owner_quotas;
  options.owner_limits = security.owner_limits;
  options.registry.heartbeat_timeout = absl::GetFlag(FLAGS_heartbeat_timeout);
  options.heartbeat_interval = absl::GetFlag(FLAGS_heartbeat_interval);
  options.status_workers = absl::GetFlag(FLAGS_status_workers);
  if (options.heartbeat_interval <= absl::ZeroDuration() ||
      options.registry.heartbeat_timeout <= options.heartbeat_interval) {
    return absl::InvalidArgumentError(
        "--heartbeat_timeout must be longer than --heartbeat_interval > 0");
  }
  options.adopt_grace = absl::GetFlag(FLAGS_adopt_grace);
  options.job_history = absl::GetFlag(FLAGS_job_history);
  if (options.job_history > ddp::kMaxJobHistory) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--job_history ", options.job_history, " is over the most kept, ", ddp::kMaxJobHistory));
  }
  options.streams.max_streams = absl::GetFlag(FLAGS_max_attach_streams);
  options.streams.register_deadline = absl::GetFlag(FLAGS_register_deadline);
  if (options.streams.max_streams == 0 ||
      options.streams.register_deadline <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "--max_attach_streams and --register_deadline must be positive");
  }
  return absl::OkStatus();
}

// Every flag checked and turned into the server's options, or why they make
// no sense (exit 2).
absl::StatusOr<CoordinatorServer::Options> OptionsFromFlags() {
  CoordinatorServer::Options options;
  absl::StatusOr<CoordinatorSecurity> security = LoadSecurity();
  if (!security.ok()) return security.status();
  options.security = std::move(*security);
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  options.metrics_required = options.metrics_listen != kDefaultMetricsListen;
  options.http_listen = absl::GetFlag(FLAGS_http_listen);
  options.http_required = options.http_listen != kDefaultHttpListen;
  for (const auto& [flag, what, listen] :
       {std::tuple{"--metrics_listen", "metrics", options.metrics_listen},
        std::tuple{"--http_listen", "the status page", options.http_listen}}) {
    if (listen.empty()) continue;
    if (absl::Status s = CheckHttpListen(flag, what, listen, options.security.http); !s.ok()) {
      return s;
    }
  }
  absl::StatusOr<PathRoots> roots = RootsFromFlags();
  if (!roots.ok()) return roots.status();
  options.roots = std::move(*roots);
  options.validation = {absl::GetFlag(FLAGS_validate_concurrency),
                        absl::GetFlag(FLAGS_validate_queue)};
  if (options.validation.concurrency < 1 || options.validation.max_waiting < 0) {
    return absl::InvalidArgumentError(
        "--validate_concurrency must be at least 1, --validate_queue at least 0");
  }
  absl::StatusOr<std::unique_ptr<HelperProcess>> helper = HelperFromFlags();
  if (!helper.ok()) {
    return absl::Status(helper.status().code(),
                        absl::StrCat("job checks: ", helper.status().message(),
                                     " (see --validate_helper, --validate_user)"));
  }
  options.helper = std::move(*helper);
  options.validate_timeout = absl::GetFlag(FLAGS_validate_timeout);
  options.data_root = absl::GetFlag(FLAGS_data_root);
  options.output_root = absl::GetFlag(FLAGS_output_root);
  if (absl::Status s = CoreOptionsFromFlags(options.security, options.core); !s.ok()) return s;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.job_file = absl::GetFlag(FLAGS_job);
  options.state_dir = absl::GetFlag(FLAGS_state_dir);
  options.port_file = absl::GetFlag(FLAGS_port_file);
  options.status_file = absl::GetFlag(FLAGS_status_file);
  options.http_port_file = absl::GetFlag(FLAGS_http_port_file);
  options.exit_when_done = absl::GetFlag(FLAGS_exit_when_done);
  options.max_watch_streams = absl::GetFlag(FLAGS_max_watch_streams);
  return options;
}

// The failover settings, or nullopt without --etcd_endpoints.
absl::StatusOr<std::optional<FailoverOptions>> FailoverFromFlags() {
  const std::string endpoints = absl::GetFlag(FLAGS_etcd_endpoints);
  if (endpoints.empty()) return std::optional<FailoverOptions>();
  if (!absl::GetFlag(FLAGS_state_dir).empty()) {
    return absl::InvalidArgumentError(
        "--state_dir and --etcd_endpoints: the state is kept in one place; give one of them");
  }
  FailoverOptions failover;
  const bool etcd_tls = !absl::GetFlag(FLAGS_etcd_tls_ca).empty();
  for (absl::string_view endpoint : absl::StrSplit(endpoints, ',', absl::SkipWhitespace())) {
    if (auto parsed = ParseHostPort(endpoint); !parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--etcd_endpoints: ", endpoint, ": ", parsed.status().message()));
    }
    // etcd holds what every worker runs: off loopback, in the clear, anyone
    // on the path reads and rewrites it, as the listeners refuse to be.
    if (!etcd_tls && !IsLocalAddress(endpoint) && !absl::GetFlag(FLAGS_insecure)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--etcd_endpoints: ", endpoint,
          " is off loopback and etcd would be reached in plaintext: give --etcd_tls_ca (and "
          "--etcd_tls_cert/--etcd_tls_key for etcd's client-certificate auth; docs/SECURITY.md, "
          "\"etcd\"), or pass --insecure on a network you trust"));
    }
    failover.etcd.endpoints.emplace_back(endpoint);
  }
  failover.state_key_file = absl::GetFlag(FLAGS_state_key_file);
  failover.etcd.user = absl::GetFlag(FLAGS_etcd_user);
  const std::string password_file = absl::GetFlag(FLAGS_etcd_password_file);
  if (failover.etcd.user.empty() != password_file.empty()) {
    return absl::InvalidArgumentError(
        "--etcd_user and --etcd_password_file: give both (etcd's user and a file with its "
        "password), or neither");
  }
  if (!password_file.empty()) {
    absl::StatusOr<std::string> password = LoadSecretFile("--etcd_password_file", password_file);
    if (!password.ok()) return password.status();
    failover.etcd.password = *std::move(password);
  }
  failover.etcd.ca_file = absl::GetFlag(FLAGS_etcd_tls_ca);
  failover.etcd.cert_file = absl::GetFlag(FLAGS_etcd_tls_cert);
  failover.etcd.key_file = absl::GetFlag(FLAGS_etcd_tls_key);
  failover.prefix = absl::GetFlag(FLAGS_etcd_prefix);
  if (!absl::StartsWith(failover.prefix, "/") || absl::EndsWith(failover.prefix, "/") ||
      failover.prefix.size() < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--etcd_prefix ", failover.prefix, ": a key path like /ddp/NAME (no trailing '/')"));
  }
  failover.lease_ttl = absl::GetFlag(FLAGS_lease_ttl);
  if (failover.lease_ttl < absl::Seconds(1) ||
      failover.lease_ttl != absl::Trunc(failover.lease_ttl, absl::Seconds(1))) {
    return absl::InvalidArgumentError("--lease_ttl: whole seconds, at least 1s (etcd's unit)");
  }
  // Each call to etcd within a quarter of the TTL: a renewal that hangs must
  // leave time for another before the leader has to stop.
  failover.etcd.timeout =
      std::clamp(failover.lease_ttl / 4, absl::Milliseconds(250), absl::Seconds(2));
  failover.advertise = absl::GetFlag(FLAGS_advertise_address);
  if (!failover.advertise.empty()) {
    if (auto parsed = ParseHostPort(failover.advertise); !parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--advertise_address: ", parsed.status().message()));
    }
  }
  return std::optional<FailoverOptions>(std::move(failover));
}

// The command line this process started with, to execute again.
std::vector<std::string>& Arguments() {
  static auto* args = new std::vector<std::string>();
  return *args;
}

// A deposed leader starts over as a fresh process (same pid, same port),
// so that nothing of its term's memory can act again.
[[noreturn]] void StartOver(int port) {
  std::vector<std::string> args = Arguments();
  // Later flags win: the port it had, when --listen asked for any.
  absl::StatusOr<HostPort> listen = ParseHostPort(absl::GetFlag(FLAGS_listen), true);
  if (listen.ok() && listen->port == 0) {
    args.push_back(absl::StrCat("--listen=", JoinHostPort(listen->host, port)));
  }
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  ::execv("/proc/self/exe", argv.data());
  DDP_LOG(Error) << "can't execute itself again: " << std::strerror(errno);
  std::_Exit(1);
}

int Run() {
  SetLogIdentity("coordinator");
  absl::StatusOr<CoordinatorServer::Options> options = OptionsFromFlags();
  if (!options.ok()) {
    DDP_LOG(Error) << options.status().message();
    return 2;
  }
  absl::StatusOr<std::optional<FailoverOptions>> failover = FailoverFromFlags();
  if (!failover.ok()) {
    DDP_LOG(Error) << failover.status().message();
    return 2;
  }
  if (failover->has_value()) {
    return RunWithFailover(std::move(*options), **failover, [](int port) { StartOver(port); });
  }
  CoordinatorServer server(std::move(*options));
  if (absl::Status s = server.Start(); !s.ok()) {
    DDP_LOG(Error) << s.message();
    return server.failure_exit_code();
  }
  const int exit_code = server.Wait();
  server.Stop();
  return exit_code;
}

}  // namespace
}  // namespace ddp

int main(int argc, char** argv) {
  ddp::Arguments().assign(argv, argv + argc);
  ddp::CatchTerminationSignals();
  ddp::ParseFlagsOrExit(argc, argv, ddp::kUsage);
  return ddp::Run();
}
