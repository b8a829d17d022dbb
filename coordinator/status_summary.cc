#include "coordinator/status_summary.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace ddp {
namespace {

bool InTrouble(const v1::WorkerStatus& w) {
  return w.state() == v1::WORKER_STATE_FAILED || w.state() == v1::WORKER_STATE_LOST;
}

// A member of the status's job (other jobs' members have ranks too).
bool IsMember(const v1::WorkerStatus& w, const std::string& job) {
  return w.rank() >= 0 && w.job_id() == job;
}

void Brief(const v1::WorkerStatus& w, v1::WorkerBrief* out) {
  out->set_worker_id(w.worker_id());
  out->set_host(w.host());
  out->set_rank(w.rank());
  out->set_state(w.state());
  out->set_step(w.step());
  out->set_step_seconds(w.step_seconds());
  out->set_seconds_since_heartbeat(w.seconds_since_heartbeat());
  out->set_phase(w.phase());
}

// Which workers come first when not all fit: trouble, then members
// furthest behind, then by rank; non-members last.
auto ListingKey(const v1::WorkerStatus& w, const std::string& job) {
  const int group = InTrouble(w) ? 0 : IsMember(w, job) ? 1 : 2;
  const uint64_t step = group == 1 ? w.step() : 0;
  return std::make_tuple(group, step, w.rank(), w.worker_id());
}

// The first `n` of `all` under `before`, in that order.
template <typename Before>
std::vector<const v1::WorkerStatus*> Top(std::vector<const v1::WorkerStatus*> all, size_t n,
                                         Before before) {
  n = std::min(n, all.size());
  std::partial_sort(all.begin(), all.begin() + static_cast<ptrdiff_t>(n), all.end(), before);
  all.resize(n);
  return all;
}

// Keeps the first `keep` of `ids`; returns how many went.
uint32_t Truncate(google::protobuf::RepeatedPtrField<std::string>* ids, int keep) {
  if (ids->size() <= keep) return 0;
  const int gone = ids->size() - keep;
  ids->DeleteSubrange(keep, gone);
  return static_cast<uint32_t>(gone);
}

}  // namespace

void BoundStatusView(const v1::JobStatus& full, uint32_t max_workers, v1::JobStatus* view) {
  v1::WorkerSummary* summary = view->mutable_summary();
  std::map<v1::WorkerState, uint32_t> states;
  std::vector<const v1::WorkerStatus*> members;
  for (const v1::WorkerStatus& w : full.workers()) {
    ++states[w.state()];
    if (IsMember(w, full.job_id())) members.push_back(&w);
  }
  summary->set_total(static_cast<uint32_t>(full.workers_size()));
  for (const auto& [state, count] : states) {
    v1::StateCount* c = summary->add_states();
    c->set_state(state);
    c->set_count(count);
  }
  summary->set_members(static_cast<uint32_t>(members.size()));

  if (!members.empty()) {
    const auto [lo, hi] = std::minmax_element(
        members.begin(), members.end(),
        [](const v1::WorkerStatus* a, const v1::WorkerStatus* b) { return a->step() < b->step(); });
    const uint64_t max_step = (*hi)->step();
    summary->set_min_step((*lo)->step());
    summary->set_max_step(max_step);
    std::vector<const v1::WorkerStatus*> behind;
    for (const v1::WorkerStatus* w : members) {
      if (w->step() < max_step) behind.push_back(w);
    }
    summary->set_behind_count(static_cast<uint32_t>(behind.size()));
    for (const v1::WorkerStatus* w :
         Top(std::move(behind), kSummaryBriefs, [](const auto*a, const auto*b) {
           return std::make_tuple(a->step(), a->rank()) < std::make_tuple(b->step(), b->rank());
         })) {
      Brief(*w, summary->add_behind());
    }
    std::vector<const v1::WorkerStatus*> timed;
    for (const v1::WorkerStatus* w : members) {
      if (w->step_seconds() > 0) timed.push_back(w);
    }
    for (const v1::WorkerStatus* w :
         Top(std::move(timed), kSummaryBriefs, [](const auto*a, const auto*b) {
           return std::make_tuple(-a->step_seconds(), a->rank()) <
                  std::make_tuple(-b->step_seconds(), b->rank());
         })) {
      Brief(*w, summary->add_slowest());
    }
  }

  view->clear_workers();
  if (static_cast<uint32_t>(full.workers_size()) <= max_workers) {
    *view->mutable_workers() = full.workers();
  } else {
    std::vector<const v1::WorkerStatus*> all;
    all.reserve(static_cast<size_t>(full.workers_size()));
    for (const v1::WorkerStatus& w : full.workers()) all.push_back(&w);
    for (const v1::WorkerStatus* w :
         Top(std::move(all), max_workers, [&full](const auto*a, const auto*b) {
           return ListingKey(*a, full.job_id()) < ListingKey(*b, full.job_id());
         })) {
      *view->add_workers() = *w;
    }
  }
  summary->set_listed(static_cast<uint32_t>(view->workers_size()));

  const int listed_ids = static_cast<int>(std::min<uint32_t>(max_workers, INT32_MAX));
  Truncate(view->mutable_members(), listed_ids);
  // Each job's members too: at 4,096 workers they were most of the answer.
  for (v1::JobSummary& job : *view->mutable_jobs()) Truncate(job.mutable_members(), listed_ids);
  for (v1::GenerationChange& change : *view->mutable_generation_changes()) {
    change.set_ids_omitted(Truncate(change.mutable_left(), kChangeIds) +
                           Truncate(change.mutable_joined(), kChangeIds) +
                           Truncate(change.mutable_members(), kChangeIds));
  }
}

}  // namespace ddp
