#include "coordinator/helper_check.h"

#include <signal.h>
#include <string.h>

#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/quote.h"
#include "common/status_line.h"
#include "google/protobuf/util/json_util.h"

namespace ddp {
namespace {

std::string SignalName(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev ? absl::StrCat("SIG", abbrev) : absl::StrCat("signal ", sig);
}

absl::Status HelperFailed(absl::string_view what, const HelperProcess::Result& result) {
  DDP_LOG(Warning) << "ddp-validate " << what
                   << "; its stderr ends with: " << Bounded(result.stderr_tail, 2000);
  return absl::InternalError(absl::StrCat("the job validation helper ", what,
                                          " (the coordinator's log has its last words)"));
}

}  // namespace

absl::Status ValidateInHelper(const HelperProcess& helper, const v1::JobSpec& spec,
                              absl::Duration timeout, const std::atomic<bool>& stop) {
  std::string json;
  if (auto s = google::protobuf::util::MessageToJsonString(spec, &json); !s.ok()) {
    return absl::InternalError(absl::StrCat("can't write the spec as JSON: ", s.ToString()));
  }
  absl::StatusOr<HelperProcess::Result> result = helper.Run(json, timeout, stop);
  if (!result.ok()) {
    switch (result.status().code()) {
      case absl::StatusCode::kDeadlineExceeded:
        return absl::DeadlineExceededError(absl::StrCat(
            "checking the job's model and data took longer than ", absl::FormatDuration(timeout),
            " (the coordinator's --validate_timeout) and was stopped; does the model's forward "
            "return?"));
      case absl::StatusCode::kCancelled:
        return absl::UnavailableError("the coordinator is shutting down");
      default:
        return absl::InternalError(
            absl::StrCat("the job validation helper: ", result.status().message()));
    }
  }
  if (result->signal == SIGXCPU) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "checking the job's model and data used more than ", helper.options().max_cpu_seconds,
        " CPU seconds (the coordinator's --validate_timeout, plus 10 s)"));
  }
  if (result->signal == SIGKILL) {
    return absl::ResourceExhaustedError(
        "checking the job's model and data was killed (SIGKILL): out of memory?");
  }
  if (result->signal.has_value()) {
    return HelperFailed(absl::StrCat("crashed (", SignalName(*result->signal), ")"), *result);
  }
  if (result->exit_code != 0) {
    return HelperFailed(absl::StrCat("exited with code ", result->exit_code.value_or(-1)), *result);
  }
  std::optional<absl::Status> answer = DecodeStatusLine(result->output);
  if (!answer.has_value()) return HelperFailed("answered no status line", *result);
  return *answer;
}

JobValidator::Check HelperCheck(const HelperProcess* helper, absl::Duration timeout) {
  return [helper, timeout](const v1::JobSpec& spec, const std::atomic<bool>& stop) {
    return ValidateInHelper(*helper, spec, timeout, stop);
  };
}

}  // namespace ddp
