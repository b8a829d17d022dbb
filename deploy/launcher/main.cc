// ddp-run: one machine, one command. Starts a coordinator and N workers on
// loopback (free ports picked for them), shows the job's progress, and exits
// with the job's status. Ctrl-C or SIGTERM stops every child.
#include <fcntl.h>
#include <pwd.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/credentials.h"
#include "common/job_spec.h"
#include "common/local_tokens.h"
#include "common/process.h"
#include "common/tokens.h"
#include "ddp/v1/coordinator.grpc.pb.h"
#include "deploy/launcher/child_processes.h"
#include "deploy/launcher/program_launch.h"
#include "deploy/launcher/progress_printer.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/grpcpp.h"

ABSL_FLAG(int32_t, nproc, 2, "number of workers to start");
ABSL_FLAG(int32_t, min_nproc, 0,
          "the job trains on while at least this many workers are there (its min_workers; "
          "like torchrun's --nnodes MIN:MAX): survivors go on while a restarted worker comes "
          "back, and once restarts are spent a program's failed copy no longer stops the "
          "others. 0: --nproc (every worker, always)");
ABSL_FLAG(std::string, job, "",
          "JobSpec file (protobuf JSON); default: a CNN on Fashion-MNIST. min_workers and "
          "max_workers are set to --min_nproc and --nproc");
ABSL_FLAG(int32_t, threads, 0,
          "compute threads per worker (0: the machine's cores divided among the workers)");
ABSL_FLAG(std::string, log_dir, "",
          "where the coordinator's and workers' logs go (default: a new folder under /tmp)");
ABSL_FLAG(int32_t, max_restarts, 3,
          "restart a worker that dies (exits other than by our own stop) up to this many times "
          "in all; the job goes on from the survivors' memory meanwhile");
ABSL_FLAG(bool, status_page, true,
          "serve the coordinator's live status page on a free loopback port (printed at "
          "start); false: no page");
ABSL_FLAG(bool, allow_readable_tokens, false,
          "use a --tokens_file that other users may read (otherwise refused, as ssh refuses "
          "such keys)");
ABSL_FLAG(bool, verbose, false, "show the coordinator's and workers' logs on the terminal");
ABSL_FLAG(std::string, worker_args, "",
          "more flags for every worker, separated by spaces (see ddp-worker --help)");
ABSL_FLAG(int32_t, metrics_port, 0,
          "serve Prometheus metrics on loopback: the coordinator at this port, worker i at this "
          "port + 1 + i (0: no metrics, so ddp-run never takes a port a cluster's daemons use)");
ABSL_FLAG(std::string, tls_cert, "",
          "serve the coordinator over mutual TLS with this PEM certificate (valid for 127.0.0.1, "
          "for server and client use: workers present it too); needs --tls_key and --tls_ca");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_ca, "", "PEM CA certificate that signed --tls_cert");
ABSL_FLAG(std::string, tokens_file, "",
          "the coordinator's tokens file (see ddp-coordinator --help): workers use its first "
          "worker token, the progress display its first operator or admin token");

namespace ddp {
namespace {

constexpr char kUsage[] =
    "ddp-run: trains a job on this machine with N workers, like\n"
    "torchrun --standalone --nproc-per-node N.\n"
    "  ddp-run --nproc 2                 # the default job: a CNN on Fashion-MNIST\n"
    "  ddp-run --nproc 4 --job job.json\n"
    "  ddp-run --nproc 4 -- ./my_trainer --lr 0.1   # your program on the ddp library\n"
    "Everything runs as you, so the job may name any file you can read (model, data) or\n"
    "write (output_path).";

// The user this process runs as: ddp-run's coordinator checks jobs as its
// own user, who runs the workers (and so the job's code) anyway.
std::string ThisUser() {
  const passwd* entry = ::getpwuid(::geteuid());
  return entry ? entry->pw_name : "";
}

std::string BinDir() {
  char path[4096] = {};
  const ssize_t n = ::readlink("/proc/self/exe", path, sizeof(path) - 1);
  std::string exe(path, n > 0 ? n : 0);
  return exe.substr(0, exe.rfind('/'));
}

std::string Tail(const std::string& path, int lines) {
  std::ifstream in(path);
  std::vector<std::string> all;
  for (std::string line; std::getline(in, line);) all.push_back(line);
  std::string out;
  for (size_t i = all.size() > static_cast<size_t>(lines) ? all.size() - lines : 0; i < all.size();
       ++i) {
    absl::StrAppend(&out, "    ", all[i], "\n");
  }
  return out;
}

// Follows WatchStatus and prints progress until the coordinator goes away.
class Watcher {
 public:
  Watcher(const std::string& target, const ClientSecurity& security)
      : stub_(v1::Coordinator::NewStub(MakeChannel(target, security, grpc::ChannelArguments()))) {
    thread_ = std::thread([this] { Loop(); });
  }
  ~Watcher() { Stop(); }
  void Stop() {
    if (stop_.exchange(true)) return;
    {
      absl::MutexLock lock(&mu_);
      if (context_) context_->TryCancel();
    }
    thread_.join();
  }
  // Stops watching, and returns the lines `final_status` still adds.
  std::vector<std::string> Drain(const v1::JobStatus& final_status) {
    Stop();
    return printer_.Update(final_status, absl::Now());
  }

 private:
  void Loop() {
    while (!stop_) {
      grpc::ClientContext context;
      {
        absl::MutexLock lock(&mu_);
        context_ = &context;
      }
      v1::WatchStatusRequest request;
      request.set_interval_seconds(0.25);
      auto reader = stub_->WatchStatus(&context, request);
      v1::JobStatus status;
      while (reader->Read(&status)) {
        for (const std::string& line : printer_.Update(status, absl::Now())) {
          std::cout << line << std::endl;
        }
      }
      reader->Finish();
      {
        absl::MutexLock lock(&mu_);
        context_ = nullptr;
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
  }

  std::unique_ptr<v1::Coordinator::Stub> stub_;
  std::atomic<bool> stop_{false};
  absl::Mutex mu_;
  grpc::ClientContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;
  // Used by the watch thread, then by Drain once that thread has stopped.
  ProgressPrinter printer_;
  std::thread thread_;
};

// What ddp-run passes to its coordinator, its workers and its own watcher
// for TLS and tokens (on plain loopback, the coordinator makes its own).
struct LaunchSecurity {
  std::vector<std::string> coordinator_flags;
  std::vector<std::string> worker_flags;
  ClientSecurity watcher;
  std::string worker_token;  // written to the log folder for the workers
};

absl::StatusOr<LaunchSecurity> LoadLaunchSecurity() {
  LaunchSecurity out;
  const TlsFlags tls{absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key),
                     absl::GetFlag(FLAGS_tls_ca)};
  if (tls.any()) {
    if (tls.cert.empty() || tls.key.empty() || tls.ca.empty()) {
      return absl::InvalidArgumentError(
          "--tls_cert, --tls_key and --tls_ca go together: the coordinator presents the "
          "certificate and requires it from the workers, who check it against the CA");
    }
    auto server = MakeServerCredentials(tls);  // checks the files now, with the flags' names
    if (!server.ok()) return server.status();
    for (const auto& [flag, path] : {std::pair<std::string, std::string>{"--tls_cert=", tls.cert},
                                     {"--tls_key=", tls.key},
                                     {"--tls_ca=", tls.ca}}) {
      const std::string absolute = std::filesystem::absolute(path).string();
      out.coordinator_flags.push_back(flag + absolute);
      out.worker_flags.push_back(flag + absolute);
    }
  }
  std::string watcher_token;
  if (const std::string file = absl::GetFlag(FLAGS_tokens_file); !file.empty()) {
    const bool allow_readable = absl::GetFlag(FLAGS_allow_readable_tokens);
    auto tokens = LoadTokensFile("--tokens_file", file, allow_readable);
    if (!tokens.ok()) return tokens.status();
    for (const TokenEntry& t : *tokens) {
      if (t.role == Role::kWorker && out.worker_token.empty()) out.worker_token = t.token;
      if (t.role != Role::kWorker && watcher_token.empty()) watcher_token = t.token;
    }
    if (out.worker_token.empty() || watcher_token.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--tokens_file=", file,
          ": ddp-run needs a worker token (for its workers) and an operator or admin token (to "
          "show progress) in it"));
    }
    out.coordinator_flags.push_back("--tokens_file=" + std::filesystem::absolute(file).string());
    if (allow_readable) out.coordinator_flags.push_back("--allow_readable_tokens");
  }
  auto watcher = LoadClientSecurity(tls, "");
  if (!watcher.ok()) return watcher.status();
  out.watcher = std::move(*watcher);
  out.watcher.token = watcher_token;
  return out;
}

// ddp-worker daemons, one per slot, restarted (up to --max_restarts) when
// one dies; returns the coordinator's exit code (the job's outcome), or
// 128 + N when signal N stopped ddp-run.
int RunWorkers(const std::string& target, const std::string& dir, int threads,
               const LaunchSecurity& security, const std::vector<std::string>& env,
               ChildProcesses& children) {
  const int nproc = absl::GetFlag(FLAGS_nproc);
  const int metrics_port = absl::GetFlag(FLAGS_metrics_port);
  const bool verbose = absl::GetFlag(FLAGS_verbose);
  auto log = [&](const std::string& name) { return verbose ? "" : dir + "/" + name + ".log"; };
  const std::string bin = BinDir();
  std::vector<std::vector<std::string>> worker_args(nproc);
  for (int i = 0; i < nproc; ++i) {
    std::vector<std::string> args = {
        bin + "/ddp-worker",
        "--coordinator=" + target,
        absl::StrCat("--device=cpu:", i),
        "--host=127.0.0.1",
        absl::StrCat("--name=w", i),
        absl::StrCat("--threads=", threads),
        absl::StrCat("--metrics_file=", dir, "/metrics-w", i, ".jsonl"),
        metrics_port > 0 ? absl::StrCat("--metrics_listen=127.0.0.1:", metrics_port + 1 + i)
                         : std::string("--metrics_listen=")};
    args.insert(args.end(), security.worker_flags.begin(), security.worker_flags.end());
    for (absl::string_view extra :
         absl::StrSplit(absl::GetFlag(FLAGS_worker_args), ' ', absl::SkipEmpty())) {
      args.emplace_back(extra);
    }
    worker_args[i] = args;
    auto worker =
        children.Start(absl::StrCat("worker ", i), args, env, log(absl::StrCat("worker-", i)));
    if (!worker.ok()) {
      std::cerr << "ddp-run: " << worker.status().message() << "\n";
      return 1;
    }
  }

  int restarts_left = absl::GetFlag(FLAGS_max_restarts);
  int exit_code = -1;
  while (exit_code < 0) {
    if (auto code = children.StopOnTermination(absl::Milliseconds(100), absl::Seconds(5))) {
      return *code;
    }
    for (const auto& [name, code] : children.Reap()) {
      if (name == "coordinator") {
        exit_code = code;
      } else if (code != 0) {
        const int index = std::stoi(name.substr(7));
        const std::string log_path = dir + "/worker-" + name.substr(7) + ".log";
        std::cerr << "ddp-run: " << name << " exited with code " << code << ":\n"
                  << Tail(log_path, 10);
        if (restarts_left > 0) {
          // Like torchrun's restarts, but the others train on meanwhile: the
          // new process joins the next generation and takes up their state.
          --restarts_left;
          std::cerr << "ddp-run: restarting " << name << " (" << restarts_left
                    << " restart(s) left)" << std::endl;
          auto restarted = children.Start(name, worker_args[index], env,
                                          log(absl::StrCat("worker-", index)), /*append=*/true);
          if (!restarted.ok()) std::cerr << "ddp-run: " << restarted.status().message() << "\n";
        }
      }
    }
  }
  return exit_code;
}

// --min_nproc as the job's min_workers (0: --nproc).
int MinProcs() {
  const int min = absl::GetFlag(FLAGS_min_nproc);
  return min == 0 ? absl::GetFlag(FLAGS_nproc) : min;
}

// What the program's copies get: the coordinator, and its TLS and token
// files as DDP_* variables (the flags a ddp-worker would get).
ProgramLaunch ProgramFor(const std::vector<std::string>& program, const std::string& target,
                         int threads, const LaunchSecurity& security) {
  ProgramLaunch launch;
  launch.argv = program;
  launch.nproc = absl::GetFlag(FLAGS_nproc);
  launch.threads = threads;
  launch.log_dir = absl::GetFlag(FLAGS_log_dir);
  launch.coordinator = target;
  launch.max_restarts = absl::GetFlag(FLAGS_max_restarts);
  launch.min_nproc = MinProcs();
  for (const std::string& flag : security.worker_flags) {
    const size_t eq = flag.find('=');
    launch.env.push_back(
        absl::StrCat("DDP_", absl::AsciiStrToUpper(flag.substr(2, eq - 2)), flag.substr(eq)));
  }
  return launch;
}

int Run(const std::vector<std::string>& program) {
  const int nproc = absl::GetFlag(FLAGS_nproc);
  if (nproc < 1 || nproc > 1024) {
    std::cerr << "ddp-run: --nproc must be between 1 and 1024\n";
    return 2;
  }
  const int min_nproc = MinProcs();
  if (min_nproc < 1 || min_nproc > nproc) {
    std::cerr << "ddp-run: --min_nproc must be between 1 and --nproc (" << nproc
              << "), or 0 for --nproc\n";
    return 2;
  }
  if (!program.empty()) {
    if (!absl::GetFlag(FLAGS_job).empty()) {
      std::cerr << "ddp-run: --job and a program (after --) can't be given together\n";
      return 2;
    }
    if (ResolveProgram(program[0]).empty()) {
      std::cerr << "ddp-run: " << program[0]
                << (program[0].find('/') != std::string::npos ? " is not an executable file"
                                                              : " is not on PATH")
                << "\n";
      return 127;
    }
  }
  v1::JobSpec spec = program.empty() ? DefaultJobSpec(nproc) : ProgramJobSpec(min_nproc, nproc);
  if (const std::string path = absl::GetFlag(FLAGS_job); !path.empty()) {
    auto loaded = LoadJobSpecFile(path, ThisBuild());
    if (!loaded.ok()) {
      std::cerr << "ddp-run: --job " << loaded.status().message() << "\n";
      return 2;
    }
    spec = *loaded;
  }
  spec.set_min_workers(min_nproc);
  spec.set_max_workers(nproc);
  absl::StatusOr<LaunchSecurity> security = LoadLaunchSecurity();
  if (!security.ok()) {
    std::cerr << "ddp-run: " << security.status().message() << "\n";
    return 2;
  }
  int threads = absl::GetFlag(FLAGS_threads);
  if (threads <= 0) {
    threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / nproc);
  }

  std::string dir = absl::GetFlag(FLAGS_log_dir);
  if (dir.empty()) {
    char tmpl[] = "/tmp/ddp-run-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) {
      std::cerr << "ddp-run: can't create a folder under /tmp\n";
      return 1;
    }
    dir = tmpl;
  } else {
    ::mkdir(dir.c_str(), 0755);
  }
  // A reused --log_dir must not hand us the last run's port or results.
  for (const std::string& stale : {std::string("/coordinator.port"), std::string("/http.port"),
                                   std::string("/final-status.json")}) {
    std::remove((dir + stale).c_str());
  }
  for (int i = 0; i < nproc; ++i) {
    std::remove(absl::StrCat(dir, "/metrics-w", i, ".jsonl").c_str());
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir + "/state", ignored);
  std::string json;
  google::protobuf::util::MessageToJsonString(spec, &json);
  std::ofstream(dir + "/job.json") << json << "\n";
  if (!security->worker_token.empty()) {
    // Tokens go to the workers in a file only the user can read, never on
    // a command line that every user's ps shows.
    const std::string token_file = dir + "/worker.token";
    std::remove(token_file.c_str());
    const int fd = ::open(token_file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    const std::string line = security->worker_token + "\n";
    if (fd < 0 || ::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
      std::cerr << "ddp-run: can't write " << token_file << "\n";
      if (fd >= 0) ::close(fd);
      return 1;
    }
    ::close(fd);
    security->worker_flags.push_back("--token_file=" + token_file);
  }
  const std::string port_file = dir + "/coordinator.port";
  const std::string status_file = dir + "/final-status.json";
  const bool verbose = absl::GetFlag(FLAGS_verbose);
  auto log = [&](const std::string& name) { return verbose ? "" : dir + "/" + name + ".log"; };

  if (program.empty()) {
    std::cout << "ddp-run: job " << spec.name() << " (" << spec.model().kind() << " on "
              << spec.dataset().kind() << ", " << spec.epochs() << " epoch(s), batch "
              << spec.batch_size() << " per worker) on " << nproc << " worker(s), " << threads
              << " thread(s) each; logs in " << dir << std::endl;
  }

  const int metrics_port = absl::GetFlag(FLAGS_metrics_port);
  if (metrics_port < 0 || metrics_port + nproc >= 65536) {
    std::cerr << "ddp-run: --metrics_port must be 0 (off) or leave room for " << nproc
              << " worker port(s) above it\n";
    return 2;
  }
  if (metrics_port > 0) {
    std::cout << "ddp-run: Prometheus metrics at http://127.0.0.1:" << metrics_port
              << "/metrics (coordinator) and ports " << metrics_port + 1 << "-"
              << metrics_port + nproc << " (workers)" << std::endl;
  }
  ChildProcesses children;
  const std::string bin = BinDir();
  const std::vector<std::string> env = {absl::StrCat("OMP_NUM_THREADS=", threads),
                                        absl::StrCat("OPENBLAS_NUM_THREADS=", threads)};
  std::vector<std::string> coordinator_args = {
      bin + "/ddp-coordinator", "--listen=127.0.0.1:0", "--port_file=" + port_file,
      "--job=" + dir + "/job.json", "--exit_when_done", "--status_file=" + status_file,
      "--state_dir=" + dir + "/state",
      // One user's own machine: their files, wherever they are.
      "--data_root=/", "--output_root=/", "--validate_user=" + ThisUser(),
      metrics_port > 0 ? absl::StrCat("--metrics_listen=127.0.0.1:", metrics_port)
                       : std::string("--metrics_listen=")};
  // A free port: the default one may belong to another coordinator.
  const std::string http_port_file = dir + "/http.port";
  const bool status_page = absl::GetFlag(FLAGS_status_page);
  if (status_page) {
    coordinator_args.push_back("--http_listen=127.0.0.1:0");
    coordinator_args.push_back("--http_port_file=" + http_port_file);
  } else {
    coordinator_args.push_back("--http_listen=");
  }
  coordinator_args.insert(coordinator_args.end(), security->coordinator_flags.begin(),
                          security->coordinator_flags.end());
  auto coordinator = children.Start("coordinator", coordinator_args, env, log("coordinator"));
  if (!coordinator.ok()) {
    std::cerr << "ddp-run: " << coordinator.status().message() << "\n";
    return 1;
  }
  int port = 0;
  for (absl::Time deadline = absl::Now() + absl::Seconds(60); port == 0;) {
    std::ifstream(port_file) >> port;
    if (port != 0) break;
    for (const auto& [name, code] : children.Reap()) {
      std::cerr << "ddp-run: the coordinator exited with code " << code << " before serving:\n"
                << Tail(dir + "/coordinator.log", 10);
      return 1;
    }
    if (absl::Now() > deadline) {
      std::cerr << "ddp-run: the coordinator did not start serving within 60s\n";
      return 1;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  const std::string target = absl::StrCat("127.0.0.1:", port);
  // The page is up before the gRPC port is announced.
  if (int http_port = 0; status_page && (std::ifstream(http_port_file) >> http_port)) {
    std::cout << "ddp-run: status page at http://127.0.0.1:" << http_port << "/" << std::endl;
  }
  // Without --tokens_file the coordinator made this user's own tokens, in
  // files the workers and programs find by its port; the display reads the
  // admin one.
  if (security->watcher.token.empty()) {
    if (const std::string file = FindLocalTokenFile(target, Role::kAdmin); !file.empty()) {
      absl::StatusOr<std::string> token = LoadTokenFile("the coordinator's admin token", file);
      if (token.ok()) security->watcher.token = *token;
    }
  }
  Watcher watcher(target, security->watcher);
  const int exit_code = program.empty()
                            ? RunWorkers(target, dir, threads, *security, env, children)
                            : RunProgram(ProgramFor(program, target, threads, *security), children);
  if (children.interrupted()) return exit_code;
  // The coordinator stopped the workers on its way out; give them a moment.
  for (absl::Time deadline = absl::Now() + absl::Seconds(5);
       children.num_running() > 0 && absl::Now() < deadline;) {
    children.Reap();
    absl::SleepFor(absl::Milliseconds(20));
  }
  children.StopAll(absl::Seconds(2));
  // The coordinator leaves its last word in the status file; the watch
  // stream may have ended before the final snapshot.
  std::ifstream final_in(status_file);
  std::stringstream final_json;
  final_json << final_in.rdbuf();
  v1::JobStatus final_status;
  if (google::protobuf::util::JsonStringToMessage(final_json.str(), &final_status).ok()) {
    for (const std::string& line : watcher.Drain(final_status)) std::cout << line << std::endl;
    std::cout << ProgressPrinter::Summary(final_status) << std::endl;
  }
  if (exit_code != 0 && !verbose) {
    std::cerr << "ddp-run: the job did not succeed (exit code " << exit_code
              << "); the coordinator's log ends with:\n"
              << Tail(dir + "/coordinator.log", 10);
  }
  return exit_code;
}

}  // namespace
}  // namespace ddp

int main(int argc, char** argv) {
  ddp::CatchTerminationSignals();
  const std::vector<std::string> program =
      ddp::ParseFlagsOrExit(argc, argv, ddp::kUsage, /*program_allowed=*/true);
  return ddp::Run(program);
}
