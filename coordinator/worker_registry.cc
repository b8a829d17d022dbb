#include "coordinator/worker_registry.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/quote.h"
#include "coordinator/rank_assignment.h"

namespace ddp {
namespace {

absl::Status TooLong(absl::string_view field, absl::string_view value, size_t limit) {
  return absl::InvalidArgumentError(absl::StrCat("register.", field, " ", Quote(value), " is ",
                                                 value.size(), " bytes; the limit is ", limit,
                                                 " bytes"));
}

// `value` is at most `limit` bytes, and holds no control characters (nor
// spaces, with `printable_only`: printable ASCII only).
absl::Status CheckText(absl::string_view field, absl::string_view value, size_t limit,
                       bool printable_only = false) {
  if (value.size() > limit) return TooLong(field, value, limit);
  for (unsigned char c : value) {
    const bool bad = printable_only ? (c <= 0x20 || c >= 0x7f) : (c < 0x20 || c == 0x7f);
    if (bad) {
      return absl::InvalidArgumentError(
          absl::StrCat("register.", field, " ", Quote(value), " holds ",
                       printable_only ? "a byte that is not printable ASCII (or a space)"
                                      : "a control character",
                       "; it is shown to operators and written to logs"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

bool IsFree(const WorkerRecord& w) {
  return !w.lost() && (w.state() == v1::WORKER_STATE_IDLE || w.state() == v1::WORKER_STATE_DONE ||
                       w.state() == v1::WORKER_STATE_FAILED);
}

absl::Status CheckRegisterFields(const v1::RegisterRequest& request) {
  if (request.host().empty()) {
    return absl::InvalidArgumentError(
        "register.host is empty: a worker must say which host "
        "its peers reach it at");
  }
  if (absl::Status s = CheckText("host", request.host(), kMaxHostBytes, true); !s.ok()) return s;
  if (absl::Status s = CheckText("name", request.name(), kMaxWorkerNameBytes); !s.ok()) return s;
  if (absl::Status s = CheckText("device", request.device(), kMaxDeviceBytes); !s.ok()) return s;
  if (absl::Status s = CheckText("version", request.version(), kMaxVersionBytes); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckText("machine_id", request.machine_id(), kMaxMachineIdBytes); !s.ok()) {
    return s;
  }
  const auto& backends = request.capabilities().backends();
  if (static_cast<size_t>(backends.size()) > kMaxBackends) {
    return absl::InvalidArgumentError(absl::StrCat("register.capabilities.backends has ",
                                                   backends.size(), " entries; the limit is ",
                                                   kMaxBackends));
  }
  for (const std::string& backend : backends) {
    if (absl::Status s = CheckText("capabilities.backends", backend, kMaxBackendBytes); !s.ok()) {
      return s;
    }
  }
  return CheckLabels("register.labels", {request.labels().begin(), request.labels().end()});
}

absl::StatusOr<WorkerRecord*> WorkerRegistry::Register(const v1::RegisterRequest& request,
                                                       const std::string& version, uint64_t session,
                                                       bool* took_over) {
  *took_over = false;
  if (absl::Status s = CheckRegisterFields(request); !s.ok()) return s;
  absl::StatusOr<Device> device = ParseDevice(request.device());
  if (!device.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("register.device: ", device.status().message()));
  }
  if (request.version() != version) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker version ", Quote(request.version()), " differs from the coordinator's",
        options_.name_version_in_refusals ? absl::StrCat(" \"", version, "\"")
                                          : " (ddp-coordinator --version, or its log, names it)",
        "; run the same build on every machine"));
  }
  const std::string id = request.name().empty()
                             ? absl::StrCat(request.host(), "/", device->ToString())
                             : request.name();
  const absl::Time now = clock_->Now();
  const std::string slot = absl::StrCat(request.host(), "/", device->ToString());
  std::vector<std::string> taken_by;  // the id, and the slot's owner if another
  if (by_id_.count(id)) taken_by.push_back(id);
  if (auto it = by_slot_.find(slot); it != by_slot_.end() && it->second != id) {
    taken_by.push_back(it->second);
  }
  for (const std::string& other_id : taken_by) {
    WorkerRecord& other = *by_id_.at(other_id);
    const bool same_slot = other.host == request.host() && other.device == *device;
    const bool same_process = other.id == id && same_slot && other.pid == request.pid() &&
                              request.pid() != 0 && other.machine_id == request.machine_id();
    if (!other.lost_ && same_process) {
      // Its old stream died without us noticing yet: the new one takes over.
      other.session = session;
      other.last_seen = now;
      *took_over = true;
      return &other;
    }
    if (!other.lost_) {
      return absl::AlreadyExistsError(absl::StrFormat(
          "%s %s on host %s is already attached as worker \"%s\" (pid %d, last heard "
          "%.1fs ago); stop that worker, give this one another --device or --name, or "
          "wait %.0fs for the coordinator to mark it lost",
          same_slot ? "device" : "worker id", same_slot ? device->ToString() : id, other.host,
          other.id, other.pid, absl::ToDoubleSeconds(now - other.last_seen),
          absl::ToDoubleSeconds(options_.heartbeat_timeout)));
    }
  }
  for (const std::string& other_id : taken_by) Erase(other_id);  // lost ones, coming back
  auto record = std::make_unique<WorkerRecord>();
  record->id = id;
  record->host = request.host();
  record->device = *device;
  record->machine_id = request.machine_id();
  record->labels = {request.labels().begin(), request.labels().end()};
  record->pid = request.pid();
  record->version = request.version();
  record->capabilities = request.capabilities();
  record->session = session;
  record->registered_at = now;
  record->last_seen = now;
  record->step_advanced_at = now;
  WorkerRecord* raw = record.get();
  by_id_[id] = std::move(record);
  by_slot_[slot] = id;
  InsertInOrder(&ordered_, raw);
  InsertInOrder(&by_job_[raw->job], raw);
  ++num_attached_;
  return raw;
}

WorkerRecord* WorkerRegistry::FindAttached(const std::string& id, uint64_t session) {
  WorkerRecord* w = Find(id);
  return (w != nullptr && !w->lost_ && w->session == session) ? w : nullptr;
}

WorkerRecord* WorkerRegistry::Find(const std::string& id) {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : it->second.get();
}

const WorkerRecord* WorkerRegistry::Find(const std::string& id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : it->second.get();
}

void WorkerRegistry::Erase(const std::string& id) {
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return;
  const WorkerRecord& w = *it->second;
  if (!w.lost_) --num_attached_;
  auto slot = by_slot_.find(absl::StrCat(w.host, "/", w.device.ToString()));
  if (slot != by_slot_.end() && slot->second == id) by_slot_.erase(slot);
  RemoveInOrder(&ordered_, &w);
  UnindexJob(&w);
  by_id_.erase(it);
}

void WorkerRegistry::InsertInOrder(std::vector<const WorkerRecord*>* v, const WorkerRecord* w) {
  v->insert(std::lower_bound(v->begin(), v->end(), w, SlotBefore), w);
}

void WorkerRegistry::RemoveInOrder(std::vector<const WorkerRecord*>* v, const WorkerRecord* w) {
  const auto [first, last] = std::equal_range(v->begin(), v->end(), w, SlotBefore);
  if (auto at = std::find(first, last, w); at != last) v->erase(at);
}

void WorkerRegistry::UnindexJob(const WorkerRecord* w) {
  auto of = by_job_.find(w->job);
  if (of == by_job_.end()) return;
  RemoveInOrder(&of->second, w);
  if (of->second.empty()) by_job_.erase(of);
}

void WorkerRegistry::MoveToJob(WorkerRecord* worker, const std::string& job_id) {
  if (worker->job == job_id) return;
  UnindexJob(worker);
  worker->job = job_id;
  InsertInOrder(&by_job_[job_id], worker);
}

const std::vector<const WorkerRecord*>& WorkerRegistry::OfJob(absl::string_view job_id) const {
  static const std::vector<const WorkerRecord*> kNone;
  auto it = by_job_.find(job_id);
  return it == by_job_.end() ? kNone : it->second;
}

std::vector<std::string> WorkerRegistry::JobsHolding() const {
  std::vector<std::string> jobs;
  for (const auto& [job, workers] : by_job_) jobs.push_back(job);
  return jobs;
}

void WorkerRegistry::SetState(WorkerRecord* w, v1::WorkerState state, std::string detail) {
  w->state_ = state;
  w->detail_ = std::move(detail);
}

void WorkerRegistry::MarkLostRecord(WorkerRecord* w, const std::string& reason) {
  w->lost_ = true;
  w->lost_at_ = clock_->Now();
  SetState(w, v1::WORKER_STATE_LOST, reason);
  --num_attached_;
}

bool WorkerRegistry::MarkLost(const std::string& id, uint64_t session, const std::string& reason) {
  WorkerRecord* w = FindAttached(id, session);
  if (w == nullptr) return false;
  MarkLostRecord(w, reason);
  return true;
}

void WorkerRegistry::MarkAssigned(WorkerRecord* worker, uint64_t generation, uint32_t rank,
                                  uint64_t start_step) {
  SetState(worker, v1::WORKER_STATE_RENDEZVOUS,
           absl::StrCat("assigned rank ", rank, " of generation ", generation));
  worker->generation = generation;
  worker->step = start_step;
  RestartHangClock(worker);
  worker->unused_parameters.clear();
  worker->unused_names_dropped = 0;
  worker->reduction.Clear();
  worker->timings.Clear();
  worker->step_seconds = 0;
  worker->probe.Clear();
  worker->parameter_digest.clear();
  worker->digest_step = 0;
}

void WorkerRegistry::MarkRejoined(WorkerRecord* worker, uint64_t generation) {
  SetState(worker, v1::WORKER_STATE_TRAINING, "training (re-attached after a coordinator restart)");
  worker->generation = generation;
  if (worker->held) worker->step = worker->held->step();
  RestartHangClock(worker);
}

void WorkerRegistry::RecordReportedState(WorkerRecord* worker, const v1::StateChange& change,
                                         const std::string& detail) {
  SetState(worker, change.state(), detail);
  worker->generation = change.generation();
  if (change.has_probe()) {
    worker->probe = change.probe();
    worker->probe.set_backend(Truncated(change.probe().backend(), kMaxBackendBytes));
  }
  if (change.state() == v1::WORKER_STATE_TRAINING) RestartHangClock(worker);
}

void WorkerRegistry::MarkIdle(WorkerRecord* worker, const std::string& detail) {
  SetState(worker, v1::WORKER_STATE_IDLE, detail);
}

void WorkerRegistry::MarkDone(WorkerRecord* worker, const std::string& detail) {
  SetState(worker, v1::WORKER_STATE_DONE, detail);
}

void WorkerRegistry::MarkFailed(WorkerRecord* worker, const std::string& detail) {
  SetState(worker, v1::WORKER_STATE_FAILED, detail);
}

void WorkerRegistry::MarkExited(WorkerRecord* worker, const std::string& detail) {
  SetState(worker, v1::WORKER_STATE_DONE, detail);
}

bool WorkerRegistry::RecordHeartbeat(WorkerRecord* worker, const v1::Heartbeat& heartbeat) {
  NoteStep(worker, heartbeat.step());
  const absl::Duration bound = absl::Seconds(heartbeat.phase_bound_seconds());
  const bool bounded_phase_ended =
      worker->phase_bound > absl::ZeroDuration() && bound == absl::ZeroDuration();
  // An evaluation that ended is progress: the next step is measured from
  // now, not from the step before it (the evaluation took its own bound).
  if (bounded_phase_ended) RestartHangClock(worker);
  worker->phase = heartbeat.phase();
  worker->phase_bound = bound;
  return bounded_phase_ended;
}

void WorkerRegistry::RecordStepReport(WorkerRecord* worker, const v1::StepReport& report) {
  if (worker->state_ == v1::WORKER_STATE_RENDEZVOUS) {
    SetState(worker, v1::WORKER_STATE_TRAINING, "training");  // a step says so
  }
  // Reports trail heartbeats: a report of a step the worker's heartbeat
  // already counted says nothing newer about its phase (it may be
  // evaluating by now).
  if (report.step() > worker->step || worker->generation != report.generation()) {
    worker->phase = report.reduction().phase();
    worker->phase_bound = absl::ZeroDuration();
  }
  worker->generation = report.generation();
  worker->epoch = report.epoch();
  NoteStep(worker, report.step());
  worker->last_loss = report.loss();
  worker->reduction = report.reduction();
  worker->reduction.clear_newly_unused_parameter_names();  // kept once, below
  worker->timings = report.timings();
  worker->step_seconds = report.step_seconds();
  NoteUnusedParameters(worker, report.reduction().newly_unused_parameter_names());
  if (!report.parameter_digest().empty()) {
    worker->parameter_digest = report.parameter_digest();
    worker->digest_step = report.step();
  }
}

void WorkerRegistry::RecordThroughput(WorkerRecord* worker, double samples, double seconds) {
  if (seconds > 0) worker->samples_per_sec = samples / seconds;
}

void WorkerRegistry::AllowPrepareAgain(WorkerRecord* worker) {
  if (!worker->held && !worker->prepare_failed) worker->prepare_asked.clear();
}

void WorkerRegistry::NoteUnusedParameters(
    WorkerRecord* worker, const google::protobuf::RepeatedPtrField<std::string>& names) {
  size_t added = 0;
  for (const std::string& name : names) {
    const bool fits = name.size() <= kMaxParameterNameBytes &&
                      added < kMaxNewUnusedNamesPerReport &&
                      worker->unused_parameters.size() < kMaxUnusedNamesPerWorker;
    if (!fits) {
      ++worker->unused_names_dropped;
    } else if (worker->unused_parameters.insert(name).second) {
      ++added;
    }
  }
}

void WorkerRegistry::NoteStep(WorkerRecord* worker, uint64_t step) {
  if (step > worker->step) {
    worker->step = step;
    worker->step_advanced_at = clock_->Now();
  }
}

std::vector<std::string> WorkerRegistry::ExpireSilent() {
  const absl::Time now = clock_->Now();
  std::vector<std::string> expired, forget;
  for (auto& [id, record] : by_id_) {
    WorkerRecord& w = *record;
    if (w.lost_ && now - w.lost_at_ > options_.lost_retention) {
      forget.push_back(id);
    } else if (!w.lost_ && now - w.last_seen > options_.heartbeat_timeout) {
      expired.push_back(w.id);
      MarkLostRecord(
          &w, absl::StrFormat("no heartbeat for %.1fs", absl::ToDoubleSeconds(now - w.last_seen)));
    }
  }
  for (const std::string& id : forget) Erase(id);
  return expired;
}

void WorkerRegistry::Grace(absl::Duration paused) {
  const absl::Time now = clock_->Now();
  for (auto& [id, record] : by_id_) {
    if (record->lost_) continue;
    record->last_seen = now;
    record->step_advanced_at = std::min(now, record->step_advanced_at + paused);
  }
}

bool SlotBefore(const WorkerRecord* a, const WorkerRecord* b) {
  return SlotKey(a->host, a->device, a->id) < SlotKey(b->host, b->device, b->id);
}

}  // namespace ddp
