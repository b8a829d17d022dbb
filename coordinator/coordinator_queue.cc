// The Coordinator's jobs as operators list them (ListJobs, GetJob): those
// that started (running, ended, or ended and kept only in the history), in
// start order, then the queued ones in the order they will start. When a
// queued job starts is the pool's business (coordinator_pool.cc).
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/logging.h"
#include "common/quote.h"
#include "coordinator/coordinator.h"

namespace ddp {
namespace {

constexpr uint32_t kDefaultJobPage = 100;
constexpr uint32_t kMaxJobPage = 1000;

// A started job's place: "s/<start sequence>".
std::string StartedToken(uint64_t start_sequence) { return absl::StrCat("s/", start_sequence); }

// A queued job's place in start order: "q/<priority>/<sequence>".
std::string QueuedToken(const QueuedJob& job) {
  return absl::StrCat("q/", job.spec.priority(), "/", job.sequence);
}

// Where a page starts: after a started job's place (`started`), after every
// started job and a queued job's place (`priority`, `sequence`), or at the
// beginning.
struct PageStart {
  uint64_t started = 0;
  bool after_queued = false;
  int32_t priority = 0;
  uint64_t sequence = 0;

  bool SkipsStarted(uint64_t start_sequence) const {
    return after_queued || start_sequence <= this->started;
  }
  bool Skips(const QueuedJob& job) const {
    if (!after_queued) return false;
    if (job.spec.priority() != priority) return job.spec.priority() > priority;
    return job.sequence <= sequence;
  }
};

absl::StatusOr<PageStart> ParsePageToken(const std::string& token) {
  PageStart start;
  if (token.empty()) return start;
  std::vector<std::string> parts = absl::StrSplit(token, '/');
  if (parts.size() == 2 && parts[0] == "s" && absl::SimpleAtoi(parts[1], &start.started)) {
    return start;
  }
  if (parts.size() == 3 && parts[0] == "q" && absl::SimpleAtoi(parts[1], &start.priority) &&
      absl::SimpleAtoi(parts[2], &start.sequence)) {
    start.after_queued = true;
    return start;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("page_token ", Quote(token),
                   " is not one this coordinator gave: pass the previous ListJobs's "
                   "next_page_token, or none for the first page"));
}

bool Matches(const v1::JobSummary& job, const v1::ListJobsRequest& request) {
  return (request.state() == v1::JOB_STATE_UNSPECIFIED || job.state() == request.state()) &&
         (request.owner().empty() || job.owner() == request.owner());
}

}  // namespace

absl::StatusOr<v1::JobSummary> Coordinator::GetJob(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  if (const JobRun* run = FindRunLocked(job_id)) {
    v1::JobSummary s = run->Summary(now);
    s.set_workers(HeldCountLocked(*run));
    *s.mutable_spec() = run->spec();
    return s;
  }
  if (const std::optional<size_t> i = queue_.IndexOf(job_id)) {
    v1::JobSummary s = queue_.Summary(*i, now, QueueWhyLocked(*i));
    *s.mutable_spec() = queue_.jobs()[*i].spec;
    return s;
  }
  // Ended long ago, or before a restart: its record (no spec).
  if (const JobHistory::Entry* ended = history_.Find(job_id)) {
    return JobHistory::Summary(ended->record, now);
  }
  return absl::NotFoundError(absl::StrCat(
      "no job ", Quote(job_id), " (running: ", RunningJobsLocked(), "; ", queue_.size(),
      " queued; ListJobs lists every job, and of those that ended the coordinator keeps the last ",
      history_.entries().size(), ")"));
}

absl::StatusOr<v1::ListJobsResponse> Coordinator::ListJobs(
    const v1::ListJobsRequest& request) const {
  absl::StatusOr<PageStart> start = ParsePageToken(request.page_token());
  if (!start.ok()) return start.status();
  const uint32_t page_size =
      request.page_size() == 0 ? kDefaultJobPage : std::min(request.page_size(), kMaxJobPage);
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  // Every job in the order they run: its summary, the token a page ending
  // on it gives, and whether this page starts after it.
  struct Listed {
    v1::JobSummary summary;
    std::string token;
    bool before_page;
  };
  std::vector<Listed> jobs;
  // Those that started (ended ones of which only a record is left among
  // them), in start order.
  std::vector<std::pair<uint64_t, Listed>> started;
  for (const auto& run : runs_) {
    started.push_back({run->start_sequence(),
                       {run->Summary(now), StartedToken(run->start_sequence()),
                        start->SkipsStarted(run->start_sequence())}});
    started.back().second.summary.set_workers(HeldCountLocked(*run));
  }
  for (const JobHistory::Entry& ended : history_.entries()) {
    if (FindRunLocked(ended.record.job_id()) != nullptr) continue;  // whole, above
    started.push_back({ended.start_sequence,
                       {JobHistory::Summary(ended.record, now), StartedToken(ended.start_sequence),
                        start->SkipsStarted(ended.start_sequence)}});
  }
  std::stable_sort(started.begin(), started.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [sequence, listed] : started) jobs.push_back(std::move(listed));
  for (size_t i = 0; i < queue_.size(); ++i) {
    const QueuedJob& job = queue_.jobs()[i];
    jobs.push_back(
        {queue_.Summary(i, now, QueueWhyLocked(i)), QueuedToken(job), start->Skips(job)});
  }
  v1::ListJobsResponse response;
  uint32_t total = 0;
  std::string last_token;
  for (Listed& job : jobs) {
    if (!Matches(job.summary, request)) continue;
    ++total;
    if (job.before_page) continue;
    if (static_cast<uint32_t>(response.jobs_size()) == page_size) {
      response.set_next_page_token(last_token);
      continue;  // still counted in total_size
    }
    *response.add_jobs() = std::move(job.summary);
    last_token = job.token;
  }
  response.set_total_size(total);
  return response;
}

}  // namespace ddp
