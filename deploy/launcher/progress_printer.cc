#include "deploy/launcher/progress_printer.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ddp {

std::string FormatSeconds(double seconds) {
  const int64_t s = static_cast<int64_t>(std::llround(std::max(0.0, seconds)));
  if (s >= 3600) return absl::StrFormat("%dh%02dm%02ds", s / 3600, (s / 60) % 60, s % 60);
  if (s >= 60) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%ds", s);
}

namespace {

// "  waiting on data 70% (rank 1)" when a rank spends over a tenth of its
// steps waiting for its next batch, as the status page says it.
void AppendDataWait(const v1::JobStatus& status, std::string* line) {
  if (status.data_wait_fraction() <= 0.1) return;
  absl::StrAppend(
      line, absl::StrFormat("  waiting on data %.0f%% (rank %d)", 100 * status.data_wait_fraction(),
                            status.data_wait_rank()));
}

// Training has begun: step lines say how it goes from here.
bool Training(const v1::JobStatus& status) {
  return status.state() == v1::JOB_STATE_RUNNING && status.global_step() > 0;
}

// What the job is doing while no step line says it: repeated every
// interval, so a slow start (workers loading, a rendezvous) never looks
// like a hang.
std::string StateLine(const v1::JobStatus& status, const std::string& stamp, bool repeat) {
  switch (status.state()) {
    case v1::JOB_STATE_WAITING:
      // The coordinator's own words say more (who is still preparing).
      if (!status.message().empty()) {
        return absl::StrFormat("%s job %s: %s", stamp, status.job_id(), status.message());
      }
      return absl::StrFormat("%s job %s: waiting for workers (%d attached, %d needed)", stamp,
                             status.job_id(), status.attached_workers(),
                             status.spec().min_workers());
    case v1::JOB_STATE_RUNNING:
      if (repeat) {
        return absl::StrFormat("%s job %s: generation %d starting on %d worker(s)", stamp,
                               status.job_id(), status.generation(), status.world_size());
      }
      return absl::StrFormat("%s job %s: generation %d formed with %d worker(s)", stamp,
                             status.job_id(), status.generation(), status.world_size());
    case v1::JOB_STATE_RECOVERING:
      return absl::StrFormat("%s job %s: recovering (%d attached): %s", stamp, status.job_id(),
                             status.attached_workers(), status.message());
    default:
      return "";
  }
}

}  // namespace

std::vector<std::string> ProgressPrinter::Update(const v1::JobStatus& status, absl::Time now) {
  std::vector<std::string> lines;
  const std::string stamp = absl::StrFormat("[%7.1fs]", status.elapsed_seconds());
  // Workers attaching matter only while the job waits on them.
  const std::string state =
      absl::StrCat(v1::JobState_Name(status.state()), "/", status.generation(), "/",
                   status.state() == v1::JOB_STATE_RUNNING ? 0 : status.attached_workers());
  const bool changed = state != last_state_;
  if (changed || (!Training(status) && now - last_line_ >= every_)) {
    last_state_ = state;
    std::string line = StateLine(status, stamp, /*repeat=*/!changed);
    if (!line.empty()) lines.push_back(std::move(line));
  }
  for (const v1::EpochResult& e : status.epoch_results()) {
    if (!epochs_printed_.insert(e.epoch()).second) continue;
    lines.push_back(absl::StrFormat(
        "%s epoch %d/%d done in %s: test accuracy %.4f, test loss %.4f, train loss %.4f", stamp,
        e.epoch() + 1, status.epochs(), FormatSeconds(e.seconds()), e.test_accuracy(),
        e.test_loss(), e.train_loss()));
  }
  if (Training(status) && now - last_progress_ >= every_) {
    last_progress_ = now;
    if (status.total_steps() == 0) {  // a program's job: it alone knows how long
      std::string line =
          absl::StrFormat("%s step %d  loss %.4f  %.0f samples/s", stamp, status.global_step(),
                          status.loss(), status.samples_per_sec());
      AppendDataWait(status, &line);
      lines.push_back(std::move(line));
      return Printed(std::move(lines), now);
    }
    const double pct = 100.0 * status.global_step() / status.total_steps();
    std::string line =
        absl::StrFormat("%s epoch %d/%d  step %d/%d (%.1f%%)  loss %.4f  %.0f samples/s", stamp,
                        status.epoch() + 1, status.epochs(), status.global_step(),
                        status.total_steps(), pct, status.loss(), status.samples_per_sec());
    if (status.eta_seconds() > 0)
      absl::StrAppend(&line, "  ETA ", FormatSeconds(status.eta_seconds()));
    AppendDataWait(status, &line);
    lines.push_back(std::move(line));
  }
  return Printed(std::move(lines), now);
}

std::vector<std::string> ProgressPrinter::Printed(std::vector<std::string> lines, absl::Time now) {
  if (!lines.empty()) last_line_ = now;
  return lines;
}

std::string ProgressPrinter::Summary(const v1::JobStatus& status) {
  std::string line = absl::StrFormat("job %s %s after %s: %s", status.job_id(),
                                     v1::JobState_Name(status.state()).substr(10),
                                     FormatSeconds(status.elapsed_seconds()), status.message());
  if (!status.epoch_results().empty()) {
    absl::StrAppend(&line, absl::StrFormat("\ntest accuracy: %.4f", status.test_accuracy()));
  }
  return line;
}

}  // namespace ddp
