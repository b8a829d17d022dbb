// ddp-worker: one per GPU or CPU slot. Attaches to the coordinator, trains
// what it is assigned, all-reduces gradients directly with its peers.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/coordinator_targets.h"
#include "common/credentials.h"
#include "common/device.h"
#include "common/job_spec.h"
#include "common/labels.h"
#include "common/logging.h"
#include "common/metrics_server.h"
#include "common/net_address.h"
#include "common/process.h"
#include "common/tokens.h"
#include "worker/agent.h"
#include "worker/confinement.h"
#include "worker/device_placement.h"
#include "worker/job_host.h"
#include "worker/link/worker_metrics.h"
#include "worker/process/job_process.h"
#include "worker/threads.h"

ABSL_FLAG(std::string, coordinator, "127.0.0.1:29400",
          "the coordinator's HOST:PORT, or a comma list of replicated coordinators "
          "(a:29400,b:29400,c:29400), of which the worker attaches to the leader");
ABSL_FLAG(std::string, device, "cpu", "device this worker owns: cpu, cpu:N or cuda:N");
ABSL_FLAG(std::string, name, "", "worker id (default: HOST/DEVICE)");
ABSL_FLAG(std::string, labels, "",
          "what this worker declares about itself, as key=value,... (zone=a,gpu=h200): a job's "
          "workerSelector picks workers by them");
ABSL_FLAG(std::string, host, "",
          "address peers reach this worker at (default: this machine's host name)");
ABSL_FLAG(int32_t, threads, 0, "intra-op and BLAS threads (0: every core)");
ABSL_FLAG(bool, deterministic, false,
          "GPU arithmetic that repeats bit for bit and matches PyTorch's deterministic mode: "
          "no TF32, deterministic cuDNN and cuBLAS algorithms (slower; for comparisons)");
ABSL_FLAG(bool, send_reports, true,
          "send step reports to the coordinator (turn off only to measure their cost)");
ABSL_FLAG(bool, allow_unconfined, false,
          "run job code even where the kernel can't confine it (no Landlock or seccomp); "
          "without it such a worker refuses every job");
ABSL_FLAG(bool, in_process_jobs, false,
          "run job code in this daemon's own process instead of a process of its own per job "
          "(less isolation: native code in a model could reach the daemon's link and "
          "credentials; to debug, or to measure what the process costs)");
ABSL_FLAG(std::string, metrics_file, "",
          "append one line per training step here: a ddp.v1.StepRecord (loss, timings, "
          "reduction) as protobuf JSON");
ABSL_FLAG(std::string, debug_hang_file, "",
          "test-only fault injection: while this file exists, training stalls before its next "
          "step while heartbeats go on (the coordinator must evict this worker as hung)");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA certificate(s) the coordinator's certificate must chain to: connect over TLS");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM client certificate to present (for a coordinator with --tls_ca); needs --tls_key");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, token_file, "",
          "file holding this worker's bearer token (a worker token from the coordinator's "
          "--tokens_file); never put a token on the command line");
// Worker N's default metrics port: clear of the coordinator's metrics (9400)
// and status page (9401) on a machine that runs both.
constexpr int kWorkerMetricsBasePort = 9410;
ABSL_FLAG(std::string, metrics_listen, "auto",
          "HOST:PORT to serve Prometheus metrics on (/metrics); auto: 127.0.0.1:(9410 + N) for "
          "--device cpu:N or cuda:N (if taken, the worker runs without metrics); empty: off. "
          "Off loopback only with --metrics_tls_cert and --metrics_tokens_file, or --insecure");
ABSL_FLAG(std::string, metrics_tls_cert, "",
          "PEM certificate (chain) the metrics endpoint presents: serve HTTPS (needs "
          "--metrics_tls_key)");
ABSL_FLAG(std::string, metrics_tls_key, "", "PEM private key of --metrics_tls_cert");
ABSL_FLAG(std::string, metrics_tls_ca, "",
          "PEM CA certificate(s): scrapers must present a certificate they signed");
ABSL_FLAG(bool, allow_readable_tokens, false,
          "load a --metrics_tokens_file that other users may read (refused otherwise, as ssh "
          "refuses such keys)");
ABSL_FLAG(std::string, metrics_tokens_file, "",
          "a tokens file like the coordinator's --tokens_file: each scrape must then carry an "
          "operator or admin token from it (\"authorization: Bearer <token>\")");
ABSL_FLAG(bool, insecure, false,
          "allow a --metrics_listen address other than loopback without TLS and tokens (anyone "
          "who reaches the port can read the job's progress)");
ABSL_FLAG(std::string, index_log, "",
          "debug: append one JSON line per step with the dataset indices this rank trains in it, "
          "written before the step runs (to check that every sample is trained once)");

namespace ddp {
namespace {

constexpr char kUsage[] =
    "ddp-worker: trains what the coordinator assigns, on one device.\n"
    "  ddp-worker --coordinator 10.0.0.1:29400 --device cuda:0 \\\n"
    "      --tls_ca ca.crt --tls_cert worker.crt --tls_key worker.key --token_file worker.token";

std::string HostName() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "127.0.0.1";
  return name;
}

// This process's binary, by its name (so a job's process shows as
// ddp-worker), or /proc/self/exe where the file has gone (replaced since).
std::string ThisBinary() {
  std::error_code ec;
  const std::filesystem::path path = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec || !std::filesystem::exists(path, ec)) return "/proc/self/exe";
  return path.string();
}

// The daemon's composition root: each Init reads its flags and builds one
// part, failing with a message for the operator; Run then attaches and
// trains until a Stop or a termination signal.
class WorkerDaemon {
 public:
  absl::Status Init() {
    if (absl::Status s = InitDevice(); !s.ok()) return s;
    if (absl::Status s = InitLink(); !s.ok()) return s;
    InitTraining();
    return InitMetrics();
  }

  int Run() {
    WorkerAgent agent(options_);
    // Made after the agent, so it stops serving before the agent goes.
    auto metrics_server = StartMetricsServer(metrics_listen_, metrics_access_, !metrics_auto_);
    if (!metrics_server.ok()) {
      DDP_LOG(Error) << metrics_server.status().message();
      return 2;
    }
    if (*metrics_server) (*metrics_server)->Register(metrics_);
    std::atomic<bool> done{false};
    std::thread signals([&] {
      while (!done) {
        if (WaitForTermination(absl::Milliseconds(200)) != 0) {
          DDP_LOG(Info) << "shutting down";
          agent.Shutdown();
          return;
        }
      }
    });
    const int code = agent.Run();
    done = true;
    signals.join();
    return code;
  }

 private:
  absl::Status InitDevice() {
    absl::StatusOr<Device> device = ParseDevice(absl::GetFlag(FLAGS_device));
    if (!device.ok()) return Prefixed("--device: ", device.status());
    // A GPU this process can't use is refused here, not at the first job.
    if (absl::Status s = CheckDeviceUsable(*device); !s.ok()) return s;
    if (absl::GetFlag(FLAGS_threads) < 0) {
      return absl::InvalidArgumentError("--threads must be >= 0");
    }
    options_.device = *device;
    absl::StatusOr<Labels> labels = ParseLabels("--labels", absl::GetFlag(FLAGS_labels));
    if (!labels.ok()) return labels.status();
    options_.labels = std::move(*labels);
    if (absl::GetFlag(FLAGS_deterministic)) UseDeterministicAlgorithms();
    return absl::OkStatus();
  }

  absl::Status InitLink() {
    const std::string coordinator = absl::GetFlag(FLAGS_coordinator);
    auto coordinators = ParseCoordinatorList(coordinator);
    if (!coordinators.ok()) return Prefixed("--coordinator: ", coordinators.status());
    const TlsFlags tls{absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key),
                       absl::GetFlag(FLAGS_tls_ca)};
    auto security = LoadClientSecurity(tls, absl::GetFlag(FLAGS_token_file));
    if (!security.ok()) return security.status();
    if (!security->tls && !security->token.empty() &&
        !std::all_of(coordinators->begin(), coordinators->end(),
                     [](const std::string& address) { return IsLocalAddress(address); })) {
      DDP_LOG(Warning) << "--token_file without TLS: the token crosses the network in clear "
                          "text; set --tls_ca (and --tls_cert/--tls_key for mutual TLS)";
    }
    options_.link.coordinator = coordinator;
    options_.link.security = std::move(*security);
    // A coordinator of this user's on this machine makes its own tokens.
    options_.link.find_local_token = absl::GetFlag(FLAGS_token_file).empty();
    return absl::OkStatus();
  }

  void InitTraining() {
    options_.host = absl::GetFlag(FLAGS_host).empty() ? HostName() : absl::GetFlag(FLAGS_host);
    options_.name = absl::GetFlag(FLAGS_name);
    options_.metrics_file = absl::GetFlag(FLAGS_metrics_file);
    options_.index_log = absl::GetFlag(FLAGS_index_log);
    options_.debug_hang_file = absl::GetFlag(FLAGS_debug_hang_file);
    options_.send_reports = absl::GetFlag(FLAGS_send_reports);
    options_.allow_unconfined = absl::GetFlag(FLAGS_allow_unconfined);
    options_.deterministic = absl::GetFlag(FLAGS_deterministic);
    // This binary again, as each job's process.
    if (!absl::GetFlag(FLAGS_in_process_jobs)) options_.job_process_binary = ThisBinary();
    if (absl::StatusOr<int> abi = LandlockAbi(); !abi.ok()) {
      DDP_LOG(Warning) << abi.status().message()
                       << (options_.allow_unconfined
                               ? ": job code will run unconfined (--allow_unconfined)"
                               : ": every job will be refused (start with --allow_unconfined to "
                                 "run job code unconfined)");
    }
    options_.threads = SetComputeThreads(absl::GetFlag(FLAGS_threads));
    SetLogIdentity(options_.name.empty() ? "worker" : "worker " + options_.name);
    DDP_LOG(Info) << "device " << options_.device.ToString() << ", " << options_.threads
                  << " compute thread(s), peers reach it at " << options_.host;
  }

  absl::Status InitMetrics() {
    metrics_listen_ = absl::GetFlag(FLAGS_metrics_listen);
    metrics_auto_ = metrics_listen_ == "auto";
    // One port per device, so the workers of one machine don't collide.
    if (metrics_auto_) {
      metrics_listen_ = absl::StrCat("127.0.0.1:", kWorkerMetricsBasePort + options_.device.index);
    }
    metrics_access_.tls_cert = absl::GetFlag(FLAGS_metrics_tls_cert);
    metrics_access_.tls_key = absl::GetFlag(FLAGS_metrics_tls_key);
    metrics_access_.tls_ca = absl::GetFlag(FLAGS_metrics_tls_ca);
    metrics_access_.insecure = absl::GetFlag(FLAGS_insecure);
    if (const std::string file = absl::GetFlag(FLAGS_metrics_tokens_file); !file.empty()) {
      auto tokens =
          LoadTokensFile("--metrics_tokens_file", file, absl::GetFlag(FLAGS_allow_readable_tokens));
      if (!tokens.ok()) return tokens.status();
      metrics_access_.tokens = std::move(tokens->tokens);
    }
    if (!metrics_listen_.empty()) {
      if (absl::Status s =
              CheckHttpListen("--metrics_listen", "metrics", metrics_listen_, metrics_access_);
          !s.ok()) {
        return s;
      }
    }
    metrics_ = std::make_shared<WorkerMetrics>();
    options_.metrics = metrics_.get();
    return absl::OkStatus();
  }

  static absl::Status Prefixed(absl::string_view prefix, const absl::Status& status) {
    return absl::Status(status.code(), absl::StrCat(prefix, status.message()));
  }

  WorkerAgent::Options options_;
  std::string metrics_listen_;
  bool metrics_auto_ = false;
  HttpAccess metrics_access_;
  std::shared_ptr<WorkerMetrics> metrics_;
};

int Run() {
  WorkerDaemon daemon;
  if (absl::Status s = daemon.Init(); !s.ok()) {
    DDP_LOG(Error) << s.message();
    return 2;
  }
  return daemon.Run();
}

}  // namespace
}  // namespace ddp

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], ddp::kJobProcessFlag) == 0) {
    const int code = ddp::RunJobProcess(argc, argv);
    // Not through exit(): LibTorch's and gRPC's static teardown has nothing
    // to do for a process that is done.
    std::fflush(nullptr);
    ::_exit(code);
  }
  ddp::CatchTerminationSignals();
  ddp::ParseFlagsOrExit(argc, argv, ddp::kUsage);
  return ddp::Run();
}
