#include "deploy/launcher/program_launch.h"

#include <unistd.h>

#include <cstdlib>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/job_spec.h"

namespace ddp {

v1::JobSpec ProgramJobSpec(int min_nproc, int nproc) {
  v1::JobSpec spec;
  spec.set_name("program");
  spec.mutable_model()->set_kind("program");
  // After a loss the job waits for the restarted copy unless min_nproc
  // copies can go on (a program with elastic state goes on from the
  // survivors' state; one without can't follow a re-formation, and the job
  // fails saying so).
  spec.set_min_workers(min_nproc);
  spec.set_max_workers(nproc);
  // Copies started together begin together: with fewer than all, the job
  // waits a moment for the slowest to attach rather than admitting it as a
  // joiner later.
  spec.set_settle_seconds(min_nproc < nproc ? 5 : 0);
  return WithDefaults(spec);
}

std::string ResolveProgram(const std::string& program) {
  if (program.find('/') != std::string::npos) {
    return ::access(program.c_str(), X_OK) == 0 ? program : "";
  }
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path ? path : "/usr/bin:/bin", ':')) {
    const std::string candidate = absl::StrCat(dir.empty() ? "." : dir, "/", program);
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

int RunProgram(const ProgramLaunch& launch, ChildProcesses& children) {
  std::vector<std::string> argv = launch.argv;
  argv[0] = ResolveProgram(launch.argv[0]);
  std::cout << "ddp-run: " << launch.nproc << " rank(s) of " << absl::StrJoin(launch.argv, " ")
            << ", " << launch.threads << " thread(s) each, joined to the coordinator at "
            << launch.coordinator << (launch.log_dir.empty() ? "" : ", logs in " + launch.log_dir)
            << std::endl;
  auto start = [&](int i, bool again) {
    std::vector<std::string> env = {absl::StrCat("DDP_COORDINATOR=", launch.coordinator),
                                    absl::StrCat("LOCAL_RANK=", i),
                                    absl::StrCat("LOCAL_WORLD_SIZE=", launch.nproc),
                                    absl::StrCat("OMP_NUM_THREADS=", launch.threads),
                                    absl::StrCat("OPENBLAS_NUM_THREADS=", launch.threads)};
    env.insert(env.end(), launch.env.begin(), launch.env.end());
    const std::string log =
        launch.log_dir.empty() ? "" : absl::StrCat(launch.log_dir, "/rank-", i, ".log");
    auto started = children.Start(absl::StrCat("rank ", i), argv, env, log, again);
    if (!started.ok()) std::cerr << "ddp-run: " << started.status().message() << "\n";
    return started.ok();
  };
  for (int i = 0; i < launch.nproc; ++i) {
    if (!start(i, false)) return 1;
  }
  int restarts_left = launch.max_restarts;
  int running = launch.nproc;
  int coordinator_code = -1;
  absl::Time coordinator_gone = absl::InfiniteFuture();
  while (running > 0) {
    if (auto code = children.StopOnTermination(absl::Milliseconds(100), absl::Seconds(10))) {
      return *code;
    }
    for (const auto& [name, code] : children.Reap()) {
      if (name == "coordinator") {
        coordinator_code = code;
        coordinator_gone = absl::Now();
        continue;
      }
      --running;
      if (code == 0) continue;
      if (restarts_left > 0 && coordinator_code < 0) {
        // The others train on; the new copy joins them at a step boundary.
        --restarts_left;
        std::cerr << "ddp-run: " << name << " exited with code " << code << "; restarting it ("
                  << restarts_left << " restart(s) left)" << std::endl;
        if (start(std::stoi(name.substr(5)), true)) {
          ++running;
          continue;
        }
      }
      if (running >= launch.min_nproc && launch.min_nproc < launch.nproc && coordinator_code < 0) {
        // The job re-forms without it and goes on (--min_nproc).
        std::cerr << "ddp-run: " << name << " exited with code " << code << "; " << running
                  << " rank(s) train on (--min_nproc " << launch.min_nproc << ")" << std::endl;
        continue;
      }
      std::cerr << "ddp-run: " << name << " exited with code " << code
                << "; stopping the other ranks" << std::endl;
      children.StopAll(absl::Seconds(10));
      return code;
    }
    // The job ended (its coordinator told the ranks to stop): they leave
    // within moments, or are made to.
    if (running > 0 && absl::Now() - coordinator_gone > absl::Seconds(10)) {
      std::cerr << "ddp-run: " << running
                << " rank(s) still running 10 s after the job ended; stopping them" << std::endl;
      children.StopAll(absl::Seconds(10));
      return coordinator_code != 0 ? coordinator_code : 1;
    }
  }
  // Ranks that finished leave once the job ended, so the coordinator is
  // already on its way out.
  for (absl::Time deadline = absl::Now() + absl::Seconds(5);
       coordinator_code < 0 && absl::Now() < deadline;) {
    for (const auto& [name, code] : children.Reap()) {
      if (name == "coordinator") coordinator_code = code;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  if (coordinator_code < 0) {
    std::cerr << "ddp-run: every rank exited, but the job did not end (did every rank start a "
                 "ddp::Session, and finish it?); stopping the coordinator"
              << std::endl;
    return 1;
  }
  if (coordinator_code == 0) {
    std::cout << "ddp-run: all " << launch.nproc << " rank(s) finished" << std::endl;
  }
  return coordinator_code;
}

}  // namespace ddp
