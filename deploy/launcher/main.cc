// ddp-run: one machine, one command. Starts a coordinator and N workers on
// loopback (free ports picked for them), shows the job's progress, and exits
// with the job's status. Ctrl-C or SIGTERM stops every child.
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/credentials.h"
#include "common/job_spec.h"
#include "common/process.h"
#include "common/tokens.h"
#include "deploy/launcher/launcher.h"
#include "deploy/launcher/program_launch.h"

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
    for (const TokenEntry& t : tokens->tokens) {
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

// --min_nproc as the job's min_workers (0: --nproc).
int MinProcs() {
  const int min = absl::GetFlag(FLAGS_min_nproc);
  return min == 0 ? absl::GetFlag(FLAGS_nproc) : min;
}

// The job to run, from the flags and the program (if any), or the exit
// code to leave with (the reason printed).
std::optional<int> JobFromFlags(const std::vector<std::string>& program, v1::JobSpec& spec) {
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
  spec = program.empty() ? DefaultJobSpec(nproc) : ProgramJobSpec(min_nproc, nproc);
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
  return std::nullopt;
}

int Run(const std::vector<std::string>& program) {
  Launcher::Options options;
  if (auto exit = JobFromFlags(program, options.spec)) return *exit;
  absl::StatusOr<LaunchSecurity> security = LoadLaunchSecurity();
  if (!security.ok()) {
    std::cerr << "ddp-run: " << security.status().message() << "\n";
    return 2;
  }
  options.security = std::move(*security);
  options.program = program;
  options.nproc = absl::GetFlag(FLAGS_nproc);
  options.min_nproc = MinProcs();
  options.threads = absl::GetFlag(FLAGS_threads);
  if (options.threads <= 0) {
    options.threads =
        std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / options.nproc);
  }
  options.log_dir = absl::GetFlag(FLAGS_log_dir);
  options.max_restarts = absl::GetFlag(FLAGS_max_restarts);
  options.status_page = absl::GetFlag(FLAGS_status_page);
  options.verbose = absl::GetFlag(FLAGS_verbose);
  for (absl::string_view extra :
       absl::StrSplit(absl::GetFlag(FLAGS_worker_args), ' ', absl::SkipEmpty())) {
    options.worker_args.emplace_back(extra);
  }
  options.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  Launcher launcher(std::move(options));
  if (auto exit = launcher.Start()) return *exit;
  return launcher.Wait();
}

}  // namespace
}  // namespace ddp

int main(int argc, char** argv) {
  ddp::CatchTerminationSignals();
  const std::vector<std::string> program =
      ddp::ParseFlagsOrExit(argc, argv, ddp::kUsage, /*program_allowed=*/true);
  return ddp::Run(program);
}
