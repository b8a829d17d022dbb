// ddp-validate: the coordinator's helper. Reads one JobSpec (protobuf JSON)
// on stdin, checks that its model loads and fits its data (PreflightJob), and
// writes one status line (common/status_line.h) on stdout.
//
// It runs the job's own code (a TorchScript forward), so the coordinator
// never does this itself: it starts this binary for each submission, as an
// unprivileged user, with limits on memory, CPU time, files and time
// (coordinator/helper_process.h), and confines itself to the job's input
// files before it loads any (worker/confinement.h): it writes nothing, reads
// nothing else, starts no process and opens no network socket. When the
// job passes, a second line carries what it read (each input file's real
// path, size and SHA-256: a JobSpec holding only input_files, base64): the
// coordinator pins the job to them. Run by hand it is a quick check of a
// job:
//   ddp-validate [--allow_unconfined] < job.json
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include <ATen/Parallel.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "common/status_line.h"
#include "worker/confinement.h"
#include "worker/preflight.h"

namespace {

// A spec is a few kilobytes; anything near this is not one.
constexpr size_t kMaxInput = 1 << 20;

absl::Status Validate(bool allow_unconfined, ddp::InputFiles* inputs) {
  std::string json;
  char chunk[1 << 14];
  for (ssize_t n; (n = ::read(STDIN_FILENO, chunk, sizeof(chunk))) != 0;) {
    if (n < 0) return absl::InternalError("ddp-validate: can't read stdin");
    json.append(chunk, n);
    if (json.size() > kMaxInput) {
      return absl::InvalidArgumentError(
          absl::StrCat("the job spec is larger than ", kMaxInput, " bytes"));
    }
  }
  absl::StatusOr<ddp::v1::JobSpec> spec = ddp::ParseJobSpecJson(json, ddp::ThisBuild());
  if (!spec.ok()) return spec.status();
  // Reads the job's inputs and nothing else; writes nothing.
  ddp::Confinement confinement = ddp::ConfinementForJob(*spec, {});
  confinement.write.clear();
  if (absl::Status s = ddp::ConfineThisThread(confinement); !s.ok()) {
    if (s.code() != absl::StatusCode::kFailedPrecondition || !allow_unconfined) {
      return absl::Status(
          s.code(), absl::StrCat("the job check can't confine the job's code: ", s.message()));
    }
  }
  // A batch of two samples: one thread is plenty, and the limits are per
  // process.
  at::set_num_threads(1);
  return ddp::PreflightJob(*spec, inputs);
}

}  // namespace

int main(int argc, char** argv) {
  const bool allow_unconfined = argc == 2 && std::string(argv[1]) == "--allow_unconfined";
  if (argc > 2 || (argc == 2 && !allow_unconfined)) {
    std::fprintf(stderr,
                 "usage: %s [--allow_unconfined] < job.json\n(checks the job's model and data, "
                 "confined to them; prints one line: a status code and a message)\n",
                 argv[0]);
    return 2;
  }
  // The answer goes to the original stdout; the job's code (TorchScript's
  // print) writes to fd 1, which now leads to stderr, so it can't forge it.
  const int answer = ::fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 3);
  if (answer < 0 || ::dup2(STDERR_FILENO, STDOUT_FILENO) < 0) return 1;
  ddp::InputFiles inputs;
  const absl::Status status = Validate(allow_unconfined, &inputs);
  std::string line = ddp::EncodeStatusLine(status);
  if (status.ok()) {
    ddp::v1::JobSpec pins;
    for (const ddp::v1::InputFile& pin : inputs.Recorded()) *pins.add_input_files() = pin;
    absl::StrAppend(&line, absl::Base64Escape(pins.SerializeAsString()), "\n");
  }
  const bool written =
      ::write(answer, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  // No destructors: threads the job's code started must not delay the exit.
  std::fflush(stderr);
  ::_exit(written ? 0 : 1);
}
