#include "bench/schedule_sim_json.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/json_keys.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace ddp {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;

absl::Status Bad(absl::string_view path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("trace: ", path, ": ", what));
}

absl::Status CheckKeys(const Struct& s, absl::string_view path,
                       const std::set<std::string>& known) {
  for (const auto& [key, value] : s.fields()) {
    if (!known.count(key)) {
      return Bad(absl::StrCat(path, key),
                 absl::StrCat("unknown key (known: ", absl::StrJoin(known, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

// The number at `key`, if there is one, into `out`, checked against [lo, hi].
absl::Status Number(const Struct& s, absl::string_view path, const std::string& key, double lo,
                    double hi, double* out) {
  auto it = s.fields().find(key);
  if (it == s.fields().end()) return absl::OkStatus();
  if (it->second.kind_case() != Value::kNumberValue) {
    return Bad(absl::StrCat(path, key), "must be a number");
  }
  const double v = it->second.number_value();
  if (!(v >= lo && v <= hi)) {
    return Bad(absl::StrCat(path, key), absl::StrCat("must be in [", lo, ", ", hi, "]"));
  }
  *out = v;
  return absl::OkStatus();
}

template <typename Int>
absl::Status Integer(const Struct& s, absl::string_view path, const std::string& key, double lo,
                     double hi, Int* out) {
  double v = static_cast<double>(*out);
  if (absl::Status st = Number(s, path, key, lo, hi, &v); !st.ok()) return st;
  if (v != std::floor(v)) return Bad(absl::StrCat(path, key), "must be a whole number");
  *out = static_cast<Int>(v);
  return absl::OkStatus();
}

absl::Status Seconds(const Struct& s, absl::string_view path, const std::string& key,
                     absl::Duration* out) {
  double v = absl::ToDoubleSeconds(*out);
  if (absl::Status st = Number(s, path, key, 0, 1e9, &v); !st.ok()) return st;
  *out = absl::Seconds(v);
  return absl::OkStatus();
}

absl::Status Bool(const Struct& s, absl::string_view path, const std::string& key, bool* out) {
  auto it = s.fields().find(key);
  if (it == s.fields().end()) return absl::OkStatus();
  if (it->second.kind_case() != Value::kBoolValue) {
    return Bad(absl::StrCat(path, key), "must be true or false");
  }
  *out = it->second.bool_value();
  return absl::OkStatus();
}

absl::Status String(const Struct& s, absl::string_view path, const std::string& key,
                    std::string* out) {
  auto it = s.fields().find(key);
  if (it == s.fields().end()) return absl::OkStatus();
  if (it->second.kind_case() != Value::kStringValue) {
    return Bad(absl::StrCat(path, key), "must be a string");
  }
  *out = it->second.string_value();
  return absl::OkStatus();
}

absl::StatusOr<TraceJob> ParseJob(const Value& v, absl::string_view path) {
  if (v.kind_case() != Value::kStructValue) return Bad(path, "a job must be an object");
  const Struct& s = v.struct_value();
  const std::string p = absl::StrCat(path, ".");
  if (absl::Status st = CheckKeys(s, p,
                                  {"id", "owner", "priority", "submit_s", "work", "t1", "a",
                                   "min_workers", "max_workers", "preemptible"});
      !st.ok()) {
    return st;
  }
  if (!s.fields().count("id") || !s.fields().count("work")) return Bad(path, "needs id and work");
  TraceJob job;
  constexpr double kMaxInt = 1 << 30;
  for (absl::Status st : {
           String(s, p, "id", &job.id),
           String(s, p, "owner", &job.owner),
           Integer(s, p, "priority", -kMaxInt, kMaxInt, &job.priority),
           Seconds(s, p, "submit_s", &job.submit),
           Number(s, p, "work", 0, std::numeric_limits<double>::max(), &job.work),
           Number(s, p, "t1", 0, std::numeric_limits<double>::max(), &job.t1),
           Number(s, p, "a", 0, 1, &job.a),
           Integer(s, p, "min_workers", 1, kMaxInt, &job.min_workers),
           Integer(s, p, "max_workers", 1, kMaxInt, &job.max_workers),
           Bool(s, p, "preemptible", &job.preemptible),
       }) {
    if (!st.ok()) return st;
  }
  return job;
}

std::string Quoted(absl::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      absl::StrAppend(&out, "\\", std::string(1, c));
    } else if (c < 0x20) {
      absl::StrAppendFormat(&out, "\\u%04x", c);
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  return out + "\"";
}

std::string Num(double v) { return absl::StrFormat("%.10g", v); }
std::string Secs(absl::Duration d) { return Num(absl::ToDoubleSeconds(d)); }

}  // namespace

absl::StatusOr<Trace> ParseTrace(absl::string_view json) {
  if (absl::Status s = CheckNoDuplicateKeys(json); !s.ok()) return s;
  Struct root;
  google::protobuf::util::JsonParseOptions options;
  if (auto s = google::protobuf::util::JsonStringToMessage(std::string(json), &root, options);
      !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("trace: not a JSON object: ", s.ToString()));
  }
  if (absl::Status s =
          CheckKeys(root, "",
                    {"workers", "reform_pause_s", "checkpoint_pause_s", "restart_pause_s",
                     "reform_min_interval_s", "max_events", "owner_quota", "meta", "jobs"});
      !s.ok()) {
    return s;
  }
  Trace trace;
  for (absl::Status s : {
           Integer(root, "", "workers", 1, 1 << 20, &trace.workers),
           Integer(root, "", "max_events", 1, 1e12, &trace.max_events),
           Seconds(root, "", "reform_pause_s", &trace.costs.reform_pause),
           Seconds(root, "", "checkpoint_pause_s", &trace.costs.checkpoint_pause),
           Seconds(root, "", "restart_pause_s", &trace.costs.restart_pause),
           Seconds(root, "", "reform_min_interval_s", &trace.costs.reform_min_interval),
       }) {
    if (!s.ok()) return s;
  }
  if (auto it = root.fields().find("owner_quota"); it != root.fields().end()) {
    if (it->second.kind_case() != Value::kStructValue) {
      return Bad("owner_quota", "must be an object of owner: workers");
    }
    const Struct& quotas = it->second.struct_value();
    for (const auto& [owner, value] : quotas.fields()) {
      uint32_t quota = 0;
      if (absl::Status s = Integer(quotas, "owner_quota.", owner, 0, 1 << 20, &quota); !s.ok()) {
        return s;
      }
      trace.owner_quota[owner] = quota;
    }
  }
  auto jobs = root.fields().find("jobs");
  if (jobs == root.fields().end() || jobs->second.kind_case() != Value::kListValue) {
    return Bad("jobs", "must be a list of jobs");
  }
  for (int i = 0; i < jobs->second.list_value().values_size(); ++i) {
    auto job = ParseJob(jobs->second.list_value().values(i), absl::StrCat("jobs[", i, "]"));
    if (!job.ok()) return job.status();
    trace.jobs.push_back(*std::move(job));
  }
  return trace;
}

std::string ResultToJson(const Trace& trace, const SimResult& result, bool segments) {
  const double makespan = absl::ToDoubleSeconds(result.makespan);
  double jct_sum = 0;
  size_t longest = 0;
  uint64_t starts = 0, grows = 0, shrinks = 0, preemptions = 0;
  std::vector<std::string> jobs;
  for (size_t j = 0; j < result.jobs.size(); ++j) {
    const JobOutcome& o = result.jobs[j];
    const TraceJob& spec = trace.jobs[j];
    jct_sum += absl::ToDoubleSeconds(o.end - o.submit);
    if (o.queued > result.jobs[longest].queued) longest = j;
    starts += o.starts;
    grows += o.grows;
    shrinks += o.shrinks;
    preemptions += o.preemptions;
    std::string job = absl::StrCat(
        "{\"id\":", Quoted(o.id), ",\"owner\":", Quoted(spec.owner),
        ",\"priority\":", spec.priority, ",\"min_workers\":", spec.min_workers,
        ",\"max_workers\":", spec.max_workers, ",\"submit_s\":", Secs(o.submit),
        ",\"start_s\":", Secs(o.first_start), ",\"end_s\":", Secs(o.end),
        ",\"jct_s\":", Secs(o.end - o.submit), ",\"wait_s\":", Secs(o.first_start - o.submit),
        ",\"queued_s\":", Secs(o.queued), ",\"paused_s\":", Secs(o.paused),
        ",\"starts\":", o.starts, ",\"grows\":", o.grows, ",\"shrinks\":", o.shrinks,
        ",\"reallocations\":", o.grows + o.shrinks, ",\"preemptions\":", o.preemptions,
        ",\"work\":", Num(spec.work), ",\"work_done\":", Num(o.work_done));
    if (segments) {
      std::vector<std::string> segs;
      for (const SimSegment& seg : o.segments) {
        std::vector<std::string> ids;
        for (const std::string& w : seg.workers) ids.push_back(Quoted(w));
        segs.push_back(absl::StrCat("{\"from_s\":", Secs(seg.from), ",\"to_s\":", Secs(seg.to),
                                    ",\"rate\":", Num(seg.rate), ",\"workers\":[",
                                    absl::StrJoin(ids, ","), "]}"));
      }
      absl::StrAppend(&job, ",\"segments\":[", absl::StrJoin(segs, ","), "]");
    }
    jobs.push_back(job + "}");
  }
  const SimCosts& c = trace.costs;
  return absl::StrCat(
      "{\"policy\":", Quoted(PolicyName(result.policy)), ",\"workers\":", result.workers,
      ",\"costs\":{\"reform_pause_s\":", Secs(c.reform_pause),
      ",\"checkpoint_pause_s\":", Secs(c.checkpoint_pause),
      ",\"restart_pause_s\":", Secs(c.restart_pause),
      ",\"reform_min_interval_s\":", Secs(c.reform_min_interval), "}",
      ",\"totals\":{\"jobs\":", result.jobs.size(),
      ",\"avg_jct_s\":", Num(jct_sum / result.jobs.size()), ",\"makespan_s\":", Num(makespan),
      ",\"utilisation\":", Num(result.busy_worker_seconds / (result.workers * makespan)),
      ",\"training_utilisation\":",
      Num(result.training_worker_seconds / (result.workers * makespan)),
      ",\"longest_wait_s\":", Secs(result.jobs[longest].queued),
      ",\"longest_wait_job\":", Quoted(result.jobs[longest].id), ",\"events\":", result.events,
      ",\"decisions\":", result.decisions, ",\"starts\":", starts, ",\"grows\":", grows,
      ",\"shrinks\":", shrinks, ",\"preemptions\":", preemptions, "},\"jobs\":[\n",
      absl::StrJoin(jobs, ",\n"), "]}\n");
}

}  // namespace ddp
