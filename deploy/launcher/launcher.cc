#include "deploy/launcher/launcher.h"

#include <fcntl.h>
#include <pwd.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/local_tokens.h"
#include "common/tokens.h"
#include "deploy/launcher/progress_printer.h"
#include "google/protobuf/util/json_util.h"

namespace ddp {
namespace {

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

}  // namespace

Launcher::Launcher(Options options) : options_(std::move(options)) {
  env_ = {absl::StrCat("OMP_NUM_THREADS=", options_.threads),
          absl::StrCat("OPENBLAS_NUM_THREADS=", options_.threads)};
}

std::optional<int> Launcher::Start() {
  if (auto exit = PrepareLogDir()) return exit;
  if (auto exit = WriteWorkerToken()) return exit;
  if (auto exit = AnnounceJob()) return exit;
  if (auto exit = StartCoordinator()) return exit;
  if (auto exit = AwaitCoordinatorPort()) return exit;
  // The page is up before the gRPC port is announced.
  if (int http_port = 0; options_.status_page && (std::ifstream(http_port_file_) >> http_port)) {
    std::cout << "ddp-run: status page at http://127.0.0.1:" << http_port << "/" << std::endl;
  }
  FindWatcherToken();
  watcher_ = std::make_unique<ProgressWatcher>(target_, options_.security.watcher);
  return std::nullopt;
}

std::optional<int> Launcher::PrepareLogDir() {
  dir_ = options_.log_dir;
  if (dir_.empty()) {
    char tmpl[] = "/tmp/ddp-run-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) {
      std::cerr << "ddp-run: can't create a folder under /tmp\n";
      return 1;
    }
    dir_ = tmpl;
  } else {
    // Its parents too: a --log_dir anywhere a user may write.
    std::error_code made;
    std::filesystem::create_directories(dir_, made);
    if (made) {
      std::cerr << "ddp-run: can't make --log_dir " << dir_ << ": " << made.message() << "\n";
      return 2;
    }
  }
  port_file_ = dir_ + "/coordinator.port";
  status_file_ = dir_ + "/final-status.json";
  http_port_file_ = dir_ + "/http.port";
  // A reused --log_dir must not hand us the last run's port or results.
  for (const std::string& stale : {port_file_, http_port_file_, status_file_}) {
    std::remove(stale.c_str());
  }
  for (int i = 0; i < options_.nproc; ++i) {
    std::remove(absl::StrCat(dir_, "/metrics-w", i, ".jsonl").c_str());
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir_ + "/state", ignored);
  std::string json;
  google::protobuf::util::MessageToJsonString(options_.spec, &json);
  std::ofstream(dir_ + "/job.json") << json << "\n";
  return std::nullopt;
}

std::optional<int> Launcher::WriteWorkerToken() {
  LaunchSecurity& security = options_.security;
  if (security.worker_token.empty()) return std::nullopt;
  // Tokens go to the workers in a file only the user can read, never on a
  // command line that every user's ps shows.
  const std::string token_file = dir_ + "/worker.token";
  std::remove(token_file.c_str());
  const int fd = ::open(token_file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  const std::string line = security.worker_token + "\n";
  if (fd < 0 || ::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
    std::cerr << "ddp-run: can't write " << token_file << "\n";
    if (fd >= 0) ::close(fd);
    return 1;
  }
  ::close(fd);
  security.worker_flags.push_back("--token_file=" + token_file);
  return std::nullopt;
}

std::optional<int> Launcher::AnnounceJob() {
  const v1::JobSpec& spec = options_.spec;
  const int nproc = options_.nproc;
  if (options_.program.empty()) {
    std::cout << "ddp-run: job " << spec.name() << " (" << spec.model().kind() << " on "
              << spec.dataset().kind() << ", " << spec.epochs() << " epoch(s), batch "
              << spec.batch_size() << " per worker) on " << nproc << " worker(s), "
              << options_.threads << " thread(s) each; logs in " << dir_ << std::endl;
  }
  const int metrics_port = options_.metrics_port;
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
  return std::nullopt;
}

std::string Launcher::LogOf(const std::string& name) const {
  return options_.verbose ? "" : dir_ + "/" + name + ".log";
}

std::optional<int> Launcher::StartCoordinator() {
  const int metrics_port = options_.metrics_port;
  std::vector<std::string> args = {
      BinDir() + "/ddp-coordinator", "--listen=127.0.0.1:0", "--port_file=" + port_file_,
      "--job=" + dir_ + "/job.json", "--exit_when_done", "--status_file=" + status_file_,
      "--state_dir=" + dir_ + "/state",
      // One user's own machine: their files, wherever they are.
      "--data_root=/", "--output_root=/", "--validate_user=" + ThisUser(),
      metrics_port > 0 ? absl::StrCat("--metrics_listen=127.0.0.1:", metrics_port)
                       : std::string("--metrics_listen=")};
  // A free port: the default one may belong to another coordinator.
  if (options_.status_page) {
    args.push_back("--http_listen=127.0.0.1:0");
    args.push_back("--http_port_file=" + http_port_file_);
  } else {
    args.push_back("--http_listen=");
  }
  const std::vector<std::string>& flags = options_.security.coordinator_flags;
  args.insert(args.end(), flags.begin(), flags.end());
  auto coordinator = children_.Start("coordinator", args, env_, LogOf("coordinator"));
  if (!coordinator.ok()) {
    std::cerr << "ddp-run: " << coordinator.status().message() << "\n";
    return 1;
  }
  return std::nullopt;
}

std::optional<int> Launcher::AwaitCoordinatorPort() {
  int port = 0;
  for (absl::Time deadline = absl::Now() + absl::Seconds(60); port == 0;) {
    std::ifstream(port_file_) >> port;
    if (port != 0) break;
    for (const auto& [name, code] : children_.Reap()) {
      std::cerr << "ddp-run: the coordinator exited with code " << code << " before serving:\n"
                << Tail(dir_ + "/coordinator.log", 10);
      return 1;
    }
    if (absl::Now() > deadline) {
      std::cerr << "ddp-run: the coordinator did not start serving within 60s\n";
      return 1;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  target_ = absl::StrCat("127.0.0.1:", port);
  return std::nullopt;
}

// Without --tokens_file the coordinator made this user's own tokens, in files
// the workers and programs find by its port; the display reads the admin one.
void Launcher::FindWatcherToken() {
  ClientSecurity& watcher = options_.security.watcher;
  if (!watcher.token.empty()) return;
  if (const std::string file = FindLocalTokenFile(target_, Role::kAdmin); !file.empty()) {
    absl::StatusOr<std::string> token = LoadTokenFile("the coordinator's admin token", file);
    if (token.ok()) watcher.token = *token;
  }
}

int Launcher::Wait() {
  const int exit_code =
      options_.program.empty() ? RunWorkers() : RunProgram(ProgramFor(), children_);
  if (children_.interrupted()) return exit_code;
  // The coordinator stopped the workers on its way out; give them a moment.
  for (absl::Time deadline = absl::Now() + absl::Seconds(5);
       children_.num_running() > 0 && absl::Now() < deadline;) {
    children_.Reap();
    absl::SleepFor(absl::Milliseconds(20));
  }
  children_.StopAll(absl::Seconds(2));
  Report(exit_code);
  return exit_code;
}

std::vector<std::string> Launcher::WorkerArgs(int i) const {
  const int metrics_port = options_.metrics_port;
  std::vector<std::string> args = {
      BinDir() + "/ddp-worker",
      "--coordinator=" + target_,
      absl::StrCat("--device=cpu:", i),
      "--host=127.0.0.1",
      absl::StrCat("--name=w", i),
      absl::StrCat("--threads=", options_.threads),
      absl::StrCat("--metrics_file=", dir_, "/metrics-w", i, ".jsonl"),
      metrics_port > 0 ? absl::StrCat("--metrics_listen=127.0.0.1:", metrics_port + 1 + i)
                       : std::string("--metrics_listen=")};
  const std::vector<std::string>& flags = options_.security.worker_flags;
  args.insert(args.end(), flags.begin(), flags.end());
  args.insert(args.end(), options_.worker_args.begin(), options_.worker_args.end());
  return args;
}

// ddp-worker daemons, one per slot, restarted (up to max_restarts) when one
// dies; returns the coordinator's exit code (the job's outcome), or 128 + N
// when signal N stopped ddp-run.
int Launcher::RunWorkers() {
  for (int i = 0; i < options_.nproc; ++i) {
    worker_argv_.push_back(WorkerArgs(i));
    auto worker = children_.Start(absl::StrCat("worker ", i), worker_argv_.back(), env_,
                                  LogOf(absl::StrCat("worker-", i)));
    if (!worker.ok()) {
      std::cerr << "ddp-run: " << worker.status().message() << "\n";
      return 1;
    }
  }
  int restarts_left = options_.max_restarts;
  while (true) {
    if (auto code = children_.StopOnTermination(absl::Milliseconds(100), absl::Seconds(5))) {
      return *code;
    }
    std::optional<int> exit_code;
    for (const auto& [name, code] : children_.Reap()) {
      if (name == "coordinator") {
        exit_code = code;
      } else if (code != 0) {
        OnWorkerExit(name, code, restarts_left);
      }
    }
    if (exit_code) return *exit_code;
  }
}

void Launcher::OnWorkerExit(const std::string& name, int code, int& restarts_left) {
  const int index = std::stoi(name.substr(7));
  const std::string log_path = dir_ + "/worker-" + name.substr(7) + ".log";
  std::cerr << "ddp-run: " << name << " exited with code " << code << ":\n" << Tail(log_path, 10);
  if (restarts_left <= 0) return;
  // Like torchrun's restarts, but the others train on meanwhile: the new
  // process joins the next generation and takes up their state.
  --restarts_left;
  std::cerr << "ddp-run: restarting " << name << " (" << restarts_left << " restart(s) left)"
            << std::endl;
  auto restarted = children_.Start(name, worker_argv_[index], env_,
                                   LogOf(absl::StrCat("worker-", index)), /*append=*/true);
  if (!restarted.ok()) std::cerr << "ddp-run: " << restarted.status().message() << "\n";
}

// What the program's copies get: the coordinator, and its TLS and token
// files as DDP_* variables (the flags a ddp-worker would get).
ProgramLaunch Launcher::ProgramFor() const {
  ProgramLaunch launch;
  launch.argv = options_.program;
  launch.nproc = options_.nproc;
  launch.threads = options_.threads;
  launch.log_dir = options_.log_dir;
  launch.coordinator = target_;
  launch.max_restarts = options_.max_restarts;
  launch.min_nproc = options_.min_nproc;
  for (const std::string& flag : options_.security.worker_flags) {
    const size_t eq = flag.find('=');
    launch.env.push_back(
        absl::StrCat("DDP_", absl::AsciiStrToUpper(flag.substr(2, eq - 2)), flag.substr(eq)));
  }
  return launch;
}

void Launcher::Report(int exit_code) {
  // The coordinator leaves its last word in the status file; the watch
  // stream may have ended before the final snapshot.
  std::ifstream final_in(status_file_);
  std::stringstream final_json;
  final_json << final_in.rdbuf();
  v1::JobStatus final_status;
  if (google::protobuf::util::JsonStringToMessage(final_json.str(), &final_status).ok()) {
    for (const std::string& line : watcher_->Drain(final_status)) std::cout << line << std::endl;
    std::cout << ProgressPrinter::Summary(final_status) << std::endl;
  }
  if (exit_code != 0 && !options_.verbose) {
    std::cerr << "ddp-run: the job did not succeed (exit code " << exit_code
              << "); the coordinator's log ends with:\n"
              << Tail(dir_ + "/coordinator.log", 10);
  }
}

}  // namespace ddp
