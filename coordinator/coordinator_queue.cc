// The Coordinator's queue side: the next queued job taking the pool when the
// current one ends, and the jobs operators list (ListJobs, GetJob).
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
// The page token after the current job.
constexpr char kCurrentToken[] = "current";

// A queued job's place in start order: "q/<priority>/<sequence>".
std::string QueuedToken(const QueuedJob& job) {
  return absl::StrCat("q/", job.spec.priority(), "/", job.sequence);
}

// Where a page starts: after the current job, after a queued job's place
// (`priority`, `sequence`), or at the beginning.
struct PageStart {
  bool after_current = false;
  bool after_queued = false;
  int32_t priority = 0;
  uint64_t sequence = 0;

  bool Skips(const QueuedJob& job) const {
    if (!after_queued) return false;
    if (job.spec.priority() != priority) return job.spec.priority() > priority;
    return job.sequence <= sequence;
  }
};

absl::StatusOr<PageStart> ParsePageToken(const std::string& token) {
  PageStart start;
  if (token.empty()) return start;
  start.after_current = true;
  if (token == kCurrentToken) return start;
  std::vector<std::string> parts = absl::StrSplit(token, '/');
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

v1::JobSummary CurrentSummary(const JobRun& run, absl::Time now) {
  v1::JobSummary s;
  s.set_job_id(run.id());
  s.set_state(run.progress().state());
  s.set_message(run.progress().message());
  s.set_priority(run.spec().priority());
  s.set_owner(run.owner());
  s.set_age_seconds(absl::ToDoubleSeconds(now - run.progress().submitted_at()));
  return s;
}

bool Matches(const v1::JobSummary& job, const v1::ListJobsRequest& request) {
  return (request.state() == v1::JOB_STATE_UNSPECIFIED || job.state() == request.state()) &&
         (request.owner().empty() || job.owner() == request.owner());
}

}  // namespace

void Coordinator::StartQueuedLocked(JobRun& run, Effects* fx) {
  if (run.active() || queue_.empty()) return;
  std::optional<QueuedJob> next = queue_.PopNext();
  DDP_LOG(Info) << "job " << next->spec.name() << " leaves the queue: "
                << (run.id().empty() ? std::string("the pool is free")
                                     : absl::StrCat("job ", run.id(), " ended"));
  if (absl::Status s = StartJobLocked(run, next->spec, next->owner, fx); !s.ok()) {
    DDP_LOG(Error) << "job " << next->spec.name() << " could not start, and is dropped: " << s;
    dirty_ = true;
    PersistLocked(run, fx);
  }
}

absl::StatusOr<v1::JobSummary> Coordinator::GetJob(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  const JobRun& run = *run_;
  const absl::Time now = clock_->Now();
  if (run.progress().state() != v1::JOB_STATE_UNSPECIFIED && run.id() == job_id) {
    v1::JobSummary s = CurrentSummary(run, now);
    *s.mutable_spec() = run.spec();
    return s;
  }
  if (const std::optional<size_t> i = queue_.IndexOf(job_id)) {
    v1::JobSummary s = queue_.Summary(*i, now, run.active() ? run.id() : "");
    *s.mutable_spec() = queue_.jobs()[*i].spec;
    return s;
  }
  return absl::NotFoundError(absl::StrCat(
      "no job ", Quote(job_id), ": the coordinator holds ",
      run.id().empty() ? std::string("no current job") : absl::StrCat("job \"", run.id(), "\""),
      " and ", queue_.size(),
      " queued (ListJobs lists them; ended jobs other than the last are "
      "not kept)"));
}

absl::StatusOr<v1::ListJobsResponse> Coordinator::ListJobs(
    const v1::ListJobsRequest& request) const {
  absl::StatusOr<PageStart> start = ParsePageToken(request.page_token());
  if (!start.ok()) return start.status();
  const uint32_t page_size =
      request.page_size() == 0 ? kDefaultJobPage : std::min(request.page_size(), kMaxJobPage);
  absl::MutexLock lock(&mu_);
  const JobRun& run = *run_;
  const absl::Time now = clock_->Now();
  // Every job in the order they run: its summary, the token a page ending
  // on it gives, and whether this page starts after it.
  struct Listed {
    v1::JobSummary summary;
    std::string token;
    bool before_page;
  };
  std::vector<Listed> jobs;
  if (run.progress().state() != v1::JOB_STATE_UNSPECIFIED) {
    jobs.push_back({CurrentSummary(run, now), kCurrentToken, start->after_current});
  }
  const std::string ahead = run.active() ? run.id() : "";
  for (size_t i = 0; i < queue_.size(); ++i) {
    const QueuedJob& job = queue_.jobs()[i];
    jobs.push_back({queue_.Summary(i, now, ahead), QueuedToken(job), start->Skips(job)});
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
