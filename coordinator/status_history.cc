#include "coordinator/status_history.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ddp {
namespace {

// Steps that carry a point: a member that has trained at least one step.
bool Plottable(const v1::WorkerStatus& w) {
  if (w.rank() < 0 || w.step() == 0) return false;
  switch (w.state()) {
    case v1::WORKER_STATE_TRAINING:
    case v1::WORKER_STATE_EVALUATING:
    case v1::WORKER_STATE_DONE:
      return true;
    default:
      return false;
  }
}

// A JSON string literal: worker ids and job ids come from users.
std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", static_cast<unsigned char>(c));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

void AppendNumber(std::string* out, double v) {
  if (std::isfinite(v)) {
    absl::StrAppend(out, absl::StrFormat("%.6g", v));
  } else {
    absl::StrAppend(out, "null");  // JSON has no NaN or Infinity
  }
}

}  // namespace

StatusHistory::StatusHistory(const Clock* clock, Options options)
    : clock_(clock), options_(options) {}

void StatusHistory::Record(const v1::JobStatus& status) {
  const double now = absl::ToDoubleSeconds(clock_->Now() - absl::UnixEpoch());
  absl::MutexLock lock(&mu_);
  if (status.job_id() != job_id_) {
    job_id_ = status.job_id();
    ranks_.clear();
  }
  for (const v1::WorkerStatus& w : status.workers()) {
    if (!Plottable(w)) continue;
    const size_t rank = static_cast<size_t>(w.rank());
    if (rank >= options_.max_ranks) continue;
    if (rank >= ranks_.size()) ranks_.resize(rank + 1);
    Series& s = ranks_[rank];
    if (!s.points.empty() && s.points.back().step == w.step()) continue;
    // Resumed from an older step: the steps after it will be trained again,
    // and a curve must not fold back on itself.
    while (!s.points.empty() && s.points.back().step >= w.step()) s.points.pop_back();
    s.worker_id = w.worker_id();
    s.points.push_back({now, w.step(), w.last_loss(), w.samples_per_sec()});
    if (s.points.size() > options_.max_points_per_rank) s.points.pop_front();
  }
  RecordAllocationsLocked(status, now);
}

void StatusHistory::RecordAllocationsLocked(const v1::JobStatus& status, double now) {
  if (options_.max_jobs == 0) return;
  // Only the jobs the status still lists (it keeps a bounded few that ended).
  std::set<std::string> listed;
  for (const v1::JobSummary& j : status.jobs()) listed.insert(j.job_id());
  jobs_.erase(std::remove_if(jobs_.begin(), jobs_.end(),
                             [&listed](const JobSeries& s) { return listed.count(s.job_id) == 0; }),
              jobs_.end());
  for (const v1::JobSummary& j : status.jobs()) {
    auto it = std::find_if(jobs_.begin(), jobs_.end(),
                           [&j](const JobSeries& s) { return s.job_id == j.job_id(); });
    if (it == jobs_.end()) {
      if (jobs_.size() == options_.max_jobs) jobs_.erase(jobs_.begin());  // the oldest
      jobs_.push_back({j.job_id(), {}});
      it = std::prev(jobs_.end());
    }
    std::deque<Allocation>& points = it->points;
    if (!points.empty() && points.back().workers == j.workers() &&
        points.back().world_size == j.world_size()) {
      continue;
    }
    points.push_back({now, j.workers(), j.world_size()});
    if (points.size() > options_.max_points_per_job) points.pop_front();
  }
}

std::vector<StatusHistory::RankCurve> StatusHistory::Curves() const {
  absl::MutexLock lock(&mu_);
  std::vector<RankCurve> curves;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    if (ranks_[r].points.empty()) continue;
    curves.push_back({static_cast<uint32_t>(r), ranks_[r].worker_id,
                      std::vector<Point>(ranks_[r].points.begin(), ranks_[r].points.end())});
  }
  return curves;
}

std::vector<StatusHistory::JobAllocations> StatusHistory::Allocations() const {
  absl::MutexLock lock(&mu_);
  std::vector<JobAllocations> jobs;
  for (const JobSeries& s : jobs_) {
    jobs.push_back({s.job_id, std::vector<Allocation>(s.points.begin(), s.points.end())});
  }
  return jobs;
}

std::string StatusHistory::ToJson() const {
  std::string job_id;
  {
    absl::MutexLock lock(&mu_);
    job_id = job_id_;
  }
  // Formatting happens outside the lock: Record() never waits on a reader.
  const std::vector<RankCurve> curves = Curves();
  std::string out =
      absl::StrCat("{\"job_id\":", JsonString(job_id),
                   ",\"max_points_per_rank\":", options_.max_points_per_rank, ",\"ranks\":[");
  for (size_t i = 0; i < curves.size(); ++i) {
    const RankCurve& c = curves[i];
    absl::StrAppend(&out, i ? "," : "", "{\"rank\":", c.rank,
                    ",\"worker_id\":", JsonString(c.worker_id), ",\"points\":[");
    for (size_t j = 0; j < c.points.size(); ++j) {
      const Point& p = c.points[j];
      absl::StrAppend(&out, j ? ",[" : "[", absl::StrFormat("%.3f", p.unix_seconds), ",", p.step,
                      ",");
      AppendNumber(&out, p.loss);
      absl::StrAppend(&out, ",");
      AppendNumber(&out, p.samples_per_sec);
      absl::StrAppend(&out, "]");
    }
    absl::StrAppend(&out, "]}");
  }
  absl::StrAppend(&out, "],\"jobs\":[");
  const std::vector<JobAllocations> jobs = Allocations();
  for (size_t i = 0; i < jobs.size(); ++i) {
    absl::StrAppend(&out, i ? "," : "", "{\"job_id\":", JsonString(jobs[i].job_id),
                    ",\"points\":[");
    for (size_t j = 0; j < jobs[i].points.size(); ++j) {
      const Allocation& p = jobs[i].points[j];
      absl::StrAppend(&out, j ? ",[" : "[", absl::StrFormat("%.3f", p.unix_seconds), ",", p.workers,
                      ",", p.world_size, "]");
    }
    absl::StrAppend(&out, "]}");
  }
  absl::StrAppend(&out, "]}");
  return out;
}

}  // namespace ddp
