#include "coordinator/helper_check.h"

#include <signal.h>
#include <string.h>

#include <optional>
#include <set>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/job_kinds.h"
#include "common/job_spec.h"
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

// The pins the helper wrote after its status line; the helper ran the job's
// code, so its line is checked as untrusted: the files a check must read,
// each once, with a real path and a SHA-256 that look like one.
absl::StatusOr<google::protobuf::RepeatedPtrField<v1::InputFile>> ParsePins(
    absl::string_view line, const v1::JobSpec& spec) {
  std::string bytes;
  v1::JobSpec pins;
  if (!absl::ConsumeSuffix(&line, "\n") || !absl::Base64Unescape(line, &bytes) ||
      !pins.ParseFromString(bytes)) {
    return absl::InternalError("its list of the files it read is not well-formed");
  }
  std::vector<std::string> expected = ExpectedInputs(spec);
  std::set<std::string> wanted(expected.begin(), expected.end());
  if (static_cast<size_t>(pins.input_files_size()) != wanted.size()) {
    return absl::InternalError(absl::StrCat("it read ", pins.input_files_size(),
                                            " input files, not the job's ", wanted.size()));
  }
  for (const v1::InputFile& pin : pins.input_files()) {
    const bool hex = pin.sha256().size() == 64 &&
                     pin.sha256().find_first_not_of("0123456789abcdef") == std::string::npos;
    if (wanted.erase(pin.path()) != 1 || !absl::StartsWith(pin.real_path(), "/") || !hex) {
      return absl::InternalError(absl::StrCat("its pin of ", Quote(pin.path()), " is not valid"));
    }
  }
  return pins.input_files();
}

}  // namespace

std::vector<std::string> ExpectedInputs(const v1::JobSpec& spec) {
  std::vector<std::string> paths;
  if (ModelKindOf(spec.model()) == v1::MODEL_KIND_TORCHSCRIPT) {
    paths.push_back(spec.model().path());
  }
  const v1::DatasetSpec& data = spec.dataset();
  switch (DatasetKindOf(data)) {
    case v1::DATASET_KIND_FASHION_MNIST:
      for (const char* file : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                               "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"}) {
        paths.push_back(absl::StrCat(data.path(), "/", file));
      }
      break;
    case v1::DATASET_KIND_TENSORS:
      paths.push_back(data.path());
      if (!data.test_path().empty()) paths.push_back(data.test_path());
      break;
    case v1::DATASET_KIND_IMAGE_FOLDER:
      // Its images pinned through a manifest, else the folder by its
      // listing (every image's name, size and label).
      paths.push_back(data.manifest().empty() ? data.path() : data.manifest());
      if (!data.test_path().empty()) {
        paths.push_back(data.test_manifest().empty() ? data.test_path() : data.test_manifest());
      }
      break;
    case v1::DATASET_KIND_SHARDS:  // the records pinned through their index
      paths.push_back(absl::StrCat(data.path(), "/", kShardsIndexName));
      if (!data.test_path().empty()) {
        paths.push_back(absl::StrCat(data.test_path(), "/", kShardsIndexName));
      }
      break;
    case v1::DATASET_KIND_SYNTHETIC:
    case v1::DATASET_KIND_PROGRAM:
    case v1::DATASET_KIND_UNKNOWN:
      break;
  }
  return paths;
}

absl::Status ValidateInHelper(const HelperProcess& helper, v1::JobSpec& spec,
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
  absl::string_view output = result->output;
  const size_t end = output.find('\n');
  std::optional<absl::Status> answer =
      DecodeStatusLine(output.substr(0, end == absl::string_view::npos ? end : end + 1));
  if (!answer.has_value()) return HelperFailed("answered no status line", *result);
  if (!answer->ok()) return *answer;
  absl::StatusOr<google::protobuf::RepeatedPtrField<v1::InputFile>> pins =
      ParsePins(output.substr(end + 1), spec);
  if (!pins.ok()) return HelperFailed(pins.status().message(), *result);
  *spec.mutable_input_files() = std::move(*pins);
  return absl::OkStatus();
}

JobValidator::Check HelperCheck(const HelperProcess* helper, absl::Duration timeout) {
  return [helper, timeout](v1::JobSpec& spec, const std::atomic<bool>& stop) {
    return ValidateInHelper(*helper, spec, timeout, stop);
  };
}

}  // namespace ddp
