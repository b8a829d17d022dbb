#include "deploy/launcher/program_launch.h"

#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <optional>

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

namespace {

// The copies of one program: started, restarted, and watched until they
// all exit or one's failure ends the run.
class ProgramCopies {
 public:
  ProgramCopies(const ProgramLaunch& launch, ChildProcesses& children)
      : launch_(launch),
        children_(children),
        argv_(launch.argv),
        restarts_left_(launch.max_restarts) {
    argv_[0] = ResolveProgram(launch.argv[0]);
  }

  // Starts copy `i` (`again`: a restart, its log appended to).
  bool StartCopy(int i, bool again) {
    std::vector<std::string> env = {absl::StrCat("DDP_COORDINATOR=", launch_.coordinator),
                                    absl::StrCat("LOCAL_RANK=", i),
                                    absl::StrCat("LOCAL_WORLD_SIZE=", launch_.nproc),
                                    absl::StrCat("OMP_NUM_THREADS=", launch_.threads),
                                    absl::StrCat("OPENBLAS_NUM_THREADS=", launch_.threads)};
    env.insert(env.end(), launch_.env.begin(), launch_.env.end());
    const std::string log =
        launch_.log_dir.empty() ? "" : absl::StrCat(launch_.log_dir, "/rank-", i, ".log");
    auto started = children_.Start(absl::StrCat("rank ", i), argv_, env, log, again);
    if (!started.ok()) {
      std::cerr << "ddp-run: " << started.status().message() << "\n";
      return false;
    }
    ++running_;
    return true;
  }

  int running() const { return running_; }

  // Reaps what exited and decides; the exit code when the run ends now.
  std::optional<int> Poll() {
    if (auto code = children_.StopOnTermination(absl::Milliseconds(100), absl::Seconds(10))) {
      return code;
    }
    for (const auto& [name, code] : children_.Reap()) {
      if (name == "coordinator") {
        coordinator_code_ = code;
        coordinator_gone_ = absl::Now();
        continue;
      }
      --running_;
      if (auto exit = OnCopyExit(name, code)) return exit;
    }
    // The job ended (its coordinator told the ranks to stop): they leave
    // within moments, or are made to.
    if (running_ > 0 && absl::Now() - coordinator_gone_ > absl::Seconds(10)) {
      std::cerr << "ddp-run: " << running_
                << " rank(s) still running 10 s after the job ended; stopping them" << std::endl;
      children_.StopAll(absl::Seconds(10));
      return coordinator_code_ != 0 ? coordinator_code_ : 1;
    }
    return std::nullopt;
  }

  // Once every copy exited: the coordinator's code (the job's outcome).
  int AfterLastCopy() {
    // Ranks that finished leave once the job ended, so the coordinator is
    // already on its way out.
    for (absl::Time deadline = absl::Now() + absl::Seconds(5);
         coordinator_code_ < 0 && absl::Now() < deadline;) {
      for (const auto& [name, code] : children_.Reap()) {
        if (name == "coordinator") coordinator_code_ = code;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    if (coordinator_code_ < 0) {
      std::cerr << "ddp-run: every rank exited, but the job did not end (did every rank start a "
                   "ddp::Session, and finish it?); stopping the coordinator"
                << std::endl;
      return 1;
    }
    if (coordinator_code_ == 0) {
      std::cout << "ddp-run: all " << launch_.nproc << " rank(s) finished" << std::endl;
    }
    return coordinator_code_;
  }

 private:
  // Copy `name` exited with `code`: restarted, left out, or the end.
  std::optional<int> OnCopyExit(const std::string& name, int code) {
    if (code == 0) return std::nullopt;
    if (restarts_left_ > 0 && coordinator_code_ < 0) {
      // The others train on; the new copy joins them at a step boundary.
      --restarts_left_;
      std::cerr << "ddp-run: " << name << " exited with code " << code << "; restarting it ("
                << restarts_left_ << " restart(s) left)" << std::endl;
      if (StartCopy(std::stoi(name.substr(5)), true)) return std::nullopt;
    }
    if (running_ >= launch_.min_nproc && launch_.min_nproc < launch_.nproc &&
        coordinator_code_ < 0) {
      // The job re-forms without it and goes on (--min_nproc).
      std::cerr << "ddp-run: " << name << " exited with code " << code << "; " << running_
                << " rank(s) train on (--min_nproc " << launch_.min_nproc << ")" << std::endl;
      return std::nullopt;
    }
    std::cerr << "ddp-run: " << name << " exited with code " << code << "; stopping the other ranks"
              << std::endl;
    children_.StopAll(absl::Seconds(10));
    return code;
  }

  const ProgramLaunch& launch_;
  ChildProcesses& children_;
  std::vector<std::string> argv_;  // the program resolved
  int restarts_left_;
  int running_ = 0;
  int coordinator_code_ = -1;  // -1: still running
  absl::Time coordinator_gone_ = absl::InfiniteFuture();
};

}  // namespace

int RunProgram(const ProgramLaunch& launch, ChildProcesses& children) {
  std::cout << "ddp-run: " << launch.nproc << " rank(s) of " << absl::StrJoin(launch.argv, " ")
            << ", " << launch.threads << " thread(s) each, joined to the coordinator at "
            << launch.coordinator << (launch.log_dir.empty() ? "" : ", logs in " + launch.log_dir)
            << std::endl;
  ProgramCopies copies(launch, children);
  for (int i = 0; i < launch.nproc; ++i) {
    if (!copies.StartCopy(i, /*again=*/false)) return 1;
  }
  while (copies.running() > 0) {
    if (auto code = copies.Poll()) return *code;
  }
  return copies.AfterLastCopy();
}

}  // namespace ddp
