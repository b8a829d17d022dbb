#include "coordinator/coordinator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"

namespace ddp {
namespace {

bool IsFree(const WorkerRecord& w) {
  return !w.lost && (w.state == v1::WORKER_STATE_IDLE || w.state == v1::WORKER_STATE_DONE ||
                     w.state == v1::WORKER_STATE_FAILED);
}

// Whether the worker can run the job's backend on its device.
bool CanRun(const WorkerRecord& w, const v1::JobSpec& spec) {
  if (spec.backend() == "gloo" || spec.backend() == "shm") return !w.device.is_cuda();
  const auto& backends = w.capabilities.backends();
  const bool has_nccl = std::find(backends.begin(), backends.end(), "nccl") != backends.end();
  if (spec.backend() == "nccl") return w.device.is_cuda() && has_nccl;
  return !w.device.is_cuda() || has_nccl;  // auto: nccl on CUDA devices
}

}  // namespace

Coordinator::Coordinator(const Clock* clock, Options options)
    : clock_(clock),
      options_(std::move(options)),
      store_(clock),
      registry_(clock, options_.registry),
      generations_(clock),
      job_(clock) {
  absl::MutexLock lock(&mu_);
  PublishLocked();
}

void Coordinator::Restore(const v1::DurableState& state) {
  absl::MutexLock lock(&mu_);
  generations_.RestoreLatest(state.latest_generation());
  job_.Restore(state);
  dirty_ = true;
  PublishLocked();
}

void Coordinator::PersistLocked(Effects* fx) {
  if (options_.state_store == nullptr) return;
  v1::DurableState state;
  job_.FillDurable(&state);
  state.set_latest_generation(generations_.latest());
  fx->persist.emplace(++persist_sequence_, std::move(state));
}

void Coordinator::Apply(Effects& fx) {
  if (fx.persist) {
    if (absl::Status s = options_.state_store->Save(fx.persist->second, fx.persist->first);
        !s.ok()) {
      DDP_LOG(Error) << "can't save state: " << s.message();
    }
  }
  for (auto& [channel, message] : fx.sends) channel->Send(message);
  for (auto& [channel, status] : fx.closes) channel->Close(status);
  for (const auto& ns : fx.dropped_namespaces) {
    store_.DropNamespaces(ns, absl::StrCat("generation ended; store namespace ", ns, " is gone"));
  }
}

void Coordinator::SendLocked(const std::string& worker_id, v1::CoordinatorMessage message,
                             Effects* fx) {
  auto it = channels_.find(worker_id);
  if (it == channels_.end()) return;
  fx->sends.emplace_back(it->second.second, std::move(message));
}

void Coordinator::RejectLocked(const std::string& worker_id, absl::Status why, Effects* fx) {
  v1::CoordinatorMessage message;
  message.mutable_rejected()->set_code(static_cast<int>(why.code()));
  message.mutable_rejected()->set_message(std::string(why.message()));
  SendLocked(worker_id, std::move(message), fx);
}

absl::StatusOr<Coordinator::Session> Coordinator::Attach(const v1::RegisterRequest& request,
                                                         std::shared_ptr<WorkerChannel> channel) {
  Effects fx;
  Session session;
  {
    absl::MutexLock lock(&mu_);
    const uint64_t id = next_session_++;
    absl::StatusOr<WorkerRecord*> worker = registry_.Register(request, options_.version, id);
    if (!worker.ok()) return worker.status();
    session = Session{(*worker)->id, id};
    channels_[session.worker_id] = {id, std::move(channel)};
    v1::CoordinatorMessage reply;
    auto* registered = reply.mutable_registered();
    registered->set_worker_id(session.worker_id);
    registered->set_heartbeat_interval_ms(
        static_cast<uint32_t>(absl::ToInt64Milliseconds(options_.heartbeat_interval)));
    registered->set_coordinator_version(options_.version);
    SendLocked(session.worker_id, std::move(reply), &fx);
    DDP_LOG(Info) << "worker " << session.worker_id << " attached (" << request.host() << " "
                  << (*worker)->device.ToString() << ", pid " << request.pid() << ")";
    dirty_ = true;
    MaybeFormGenerationLocked(&fx);
  }
  Apply(fx);
  return session;
}

absl::Status Coordinator::CheckMemberLocked(const WorkerRecord& worker, uint64_t generation,
                                            int* rank) {
  const Generation* current = generations_.current();
  if (current == nullptr || current->number != generation) {
    return absl::FailedPreconditionError(absl::StrCat(
        "stale generation ", generation, ": the job is ",
        current ? absl::StrCat("in generation ", current->number)
                : absl::StrCat("not running a generation (latest ", generations_.latest(), ")"),
        "; the message was dropped"));
  }
  *rank = current->RankOf(worker.id);
  if (*rank < 0) {
    return absl::FailedPreconditionError(absl::StrCat("worker ", worker.id,
                                                      " is not a member of generation ", generation,
                                                      "; the message was dropped"));
  }
  return absl::OkStatus();
}

void Coordinator::OnMessage(const Session& session, const v1::WorkerMessage& message) {
  Effects fx;
  {
    absl::MutexLock lock(&mu_);
    WorkerRecord* worker = registry_.FindAttached(session.worker_id, session.id);
    if (worker == nullptr) return;  // an old stream of a worker that came back
    registry_.Touch(worker);
    dirty_ = true;
    switch (message.kind_case()) {
      case v1::WorkerMessage::kHeartbeat: {
        int rank;
        const auto& hb = message.heartbeat();
        if (hb.generation() != 0 && CheckMemberLocked(*worker, hb.generation(), &rank).ok()) {
          worker->step = std::max(worker->step, hb.step());
          worker->phase = hb.phase();
        }
        break;
      }
      case v1::WorkerMessage::kReports:
        OnReportsLocked(worker, message.reports(), &fx);
        break;
      case v1::WorkerMessage::kState:
        OnStateChangeLocked(worker, message.state(), &fx);
        break;
      case v1::WorkerMessage::kEpochResult: {
        int rank;
        const auto& result = message.epoch_result();
        if (absl::Status s = CheckMemberLocked(*worker, result.generation(), &rank); !s.ok()) {
          ++worker->stale_messages;
          RejectLocked(worker->id, s, &fx);
          break;
        }
        job_.OnEpochResult(result);
        PersistLocked(&fx);
        DDP_LOG(Info) << "epoch " << result.epoch() << " done: test accuracy "
                      << result.test_accuracy() << ", train loss " << result.train_loss();
        break;
      }
      case v1::WorkerMessage::kRegister:
        RejectLocked(worker->id,
                     absl::InvalidArgumentError("already registered on this stream; a worker "
                                                "registers once per stream"),
                     &fx);
        break;
      case v1::WorkerMessage::KIND_NOT_SET:
        RejectLocked(worker->id, absl::InvalidArgumentError("empty WorkerMessage"), &fx);
        break;
    }
  }
  Apply(fx);
}

void Coordinator::OnReportsLocked(WorkerRecord* worker, const v1::StepReportBatch& batch,
                                  Effects* fx) {
  worker->reports_dropped += batch.dropped();
  double samples = 0, seconds = 0;
  for (const v1::StepReport& report : batch.reports()) {
    int rank;
    if (absl::Status s = CheckMemberLocked(*worker, report.generation(), &rank); !s.ok()) {
      ++worker->stale_messages;
      RejectLocked(worker->id, s, fx);
      return;
    }
    job_.OnStepReport(rank, report);
    worker->generation = report.generation();
    worker->epoch = report.epoch();
    worker->step = std::max(worker->step, report.step());
    worker->last_loss = report.loss();
    worker->reduction = report.reduction();
    worker->phase = report.reduction().phase();
    for (const auto& name : report.reduction().newly_unused_parameter_names()) {
      worker->unused_parameters.insert(name);
    }
    samples += report.samples();
    seconds += report.step_seconds();
    if (!report.parameter_digest().empty()) {
      worker->parameter_digest = report.parameter_digest();
      worker->digest_step = report.step();
      absl::Status same = job_.OnParameterDigest(rank, report.step(), report.parameter_digest());
      if (!same.ok()) {
        DDP_LOG(Error) << same.message();
        job_.Fail(std::string(same.message()));
        EndGenerationLocked("replicas diverged", fx);
        return;
      }
    }
  }
  if (seconds > 0) worker->samples_per_sec = samples / seconds;
}

void Coordinator::OnStateChangeLocked(WorkerRecord* worker, const v1::StateChange& change,
                                      Effects* fx) {
  const Generation* current = generations_.current();
  const int rank = current ? current->RankOf(worker->id) : -1;
  const bool in_current = rank >= 0 && change.generation() == current->number;
  if (change.state() == v1::WORKER_STATE_IDLE) {
    // IDLE names the generation the worker left (0: none). Never stale: it
    // is a fact about the worker.
    if (in_current && worker->state != v1::WORKER_STATE_DONE) {
      const std::string reason = absl::StrFormat("rank %d (worker %s) left generation %d: %s", rank,
                                                 worker->id, current->number, change.detail());
      DDP_LOG(Warning) << reason;
      job_.Fail(reason);
      EndGenerationLocked(absl::StrCat("rank ", rank, " (", worker->id, ") left"), fx);
    } else if (rank >= 0) {
      return;  // about an older generation; it is already assigned to the current one
    }
    worker->state = v1::WORKER_STATE_IDLE;
    worker->detail = change.detail();
    MaybeFormGenerationLocked(fx);  // it may complete a quorum
    return;
  }
  if (!in_current) {
    ++worker->stale_messages;
    int unused_rank;  // not a member of the current generation: always an error
    RejectLocked(worker->id, CheckMemberLocked(*worker, change.generation(), &unused_rank), fx);
    return;
  }
  worker->state = change.state();
  worker->detail = change.detail();
  worker->generation = change.generation();
  if (change.has_probe()) worker->probe = change.probe();
  const uint64_t generation = change.generation();
  if (change.state() == v1::WORKER_STATE_DONE) {
    if (job_.OnRankDone(rank)) {
      DDP_LOG(Info) << "job " << job_.id() << " succeeded in generation " << generation;
      EndGenerationLocked("", fx);
    }
  } else if (change.state() == v1::WORKER_STATE_FAILED) {
    const std::string reason = absl::StrFormat("rank %d (worker %s) failed in generation %d: %s",
                                               rank, worker->id, generation, change.detail());
    DDP_LOG(Warning) << reason;
    job_.Fail(reason);
    EndGenerationLocked(absl::StrCat("rank ", rank, " (", worker->id, ") failed"), fx);
  }
}

void Coordinator::EndGenerationLocked(const std::string& abort_reason, Effects* fx) {
  const Generation* g = generations_.current();
  if (g == nullptr) return;
  if (!abort_reason.empty()) {
    for (const RankCandidate& member : g->members) {
      WorkerRecord* w = registry_.Find(member.worker_id);
      if (w == nullptr || w->lost || w->state == v1::WORKER_STATE_FAILED) continue;
      v1::CoordinatorMessage message;
      message.mutable_abort()->set_generation(g->number);
      message.mutable_abort()->set_reason(abort_reason);
      SendLocked(member.worker_id, std::move(message), fx);
    }
  }
  fx->dropped_namespaces.push_back(absl::StrCat(job_.id(), "/", g->number, "/"));
  generations_.EndCurrent();
  dirty_ = true;
  PersistLocked(fx);
}

void Coordinator::OnWorkerLostLocked(WorkerRecord* worker, Effects* fx) {
  DDP_LOG(Warning) << "worker " << worker->id << " lost: " << worker->detail;
  auto channel = channels_.find(worker->id);
  if (channel != channels_.end()) {
    fx->closes.emplace_back(channel->second.second,
                            absl::UnavailableError(absl::StrCat("marked lost (", worker->detail,
                                                                "); reconnect to attach again")));
    channels_.erase(channel);
  }
  const Generation* g = generations_.current();
  const int rank = g ? g->RankOf(worker->id) : -1;
  if (rank < 0) return;
  const std::string reason = absl::StrFormat(
      "rank %d (worker %s on %s %s) lost in generation %d: %s; it had completed step %d and "
      "was in phase %s",
      rank, worker->id, worker->host, worker->device.ToString(), g->number, worker->detail,
      worker->step, v1::StepPhase_Name(worker->phase));
  job_.Fail(reason);
  EndGenerationLocked(absl::StrCat("rank ", rank, " (", worker->id, ") lost"), fx);
}

void Coordinator::OnStreamClosed(const Session& session, const std::string& reason) {
  Effects fx;
  {
    absl::MutexLock lock(&mu_);
    if (!registry_.MarkLost(session.worker_id, session.id, reason)) return;
    dirty_ = true;
    OnWorkerLostLocked(registry_.Find(session.worker_id), &fx);
  }
  Apply(fx);
}

void Coordinator::MaybeFormGenerationLocked(Effects* fx) {
  if (job_.state() != v1::JOB_STATE_WAITING || generations_.current() != nullptr) return;
  // Cheap test first: this runs on every registration.
  if (registry_.num_attached() < job_.spec().min_workers()) return;
  std::vector<RankCandidate> free_workers;
  for (const WorkerRecord* w : registry_.All()) {
    if (IsFree(*w) && CanRun(*w, job_.spec())) {
      free_workers.push_back(RankCandidate{w->id, w->host, w->device, w->machine_id});
    }
  }
  std::optional<Generation> g = generations_.MaybeForm(job_.spec(), std::move(free_workers));
  if (!g) return;
  job_.OnGenerationStarted(static_cast<uint32_t>(g->members.size()), g->start_step);
  bool single_machine = true;
  for (const RankCandidate& m : g->members) {
    single_machine &= !m.machine_id.empty() && m.machine_id == g->members[0].machine_id;
  }
  DDP_LOG(Info) << "job " << job_.id() << ": generation " << g->number << " formed with "
                << g->members.size() << " worker(s)";
  for (size_t rank = 0; rank < g->members.size(); ++rank) {
    const RankCandidate& member = g->members[rank];
    WorkerRecord* w = registry_.Find(member.worker_id);
    w->state = v1::WORKER_STATE_RENDEZVOUS;
    w->detail = absl::StrCat("assigned rank ", rank, " of generation ", g->number);
    w->generation = g->number;
    w->step = g->start_step;
    w->unused_parameters.clear();
    w->reduction.Clear();
    w->probe.Clear();
    w->parameter_digest.clear();
    w->digest_step = 0;
    v1::CoordinatorMessage message;
    v1::Assignment* a = message.mutable_assignment();
    a->set_job_id(job_.id());
    a->set_generation(g->number);
    a->set_rank(static_cast<uint32_t>(rank));
    a->set_world_size(static_cast<uint32_t>(g->members.size()));
    a->set_start_epoch(g->start_epoch);
    a->set_start_step(g->start_step);
    a->set_sampler_seed(job_.spec().seed());
    a->set_source_rank(g->source_rank);
    *a->mutable_spec() = job_.spec();
    a->set_worker_id(member.worker_id);
    a->set_single_machine(single_machine);
    SendLocked(member.worker_id, std::move(message), fx);
  }
  dirty_ = true;
  PersistLocked(fx);
}

absl::StatusOr<v1::JobSpec> Coordinator::SubmitJob(const v1::JobSpec& requested) {
  v1::JobSpec spec = WithDefaults(requested);
  if (absl::Status s = ValidateJobSpec(spec, options_.build); !s.ok()) return s;
  {
    // Refuse early, before the (slow) preflight, when a job is active.
    absl::MutexLock lock(&mu_);
    if (job_.active()) return job_.Submit(spec);
  }
  if (options_.preflight) {
    if (absl::Status s = options_.preflight(spec); !s.ok()) return s;
  }
  Effects fx;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = job_.Submit(spec); !s.ok()) return s;
    DDP_LOG(Info) << "job " << spec.name() << " submitted: " << spec.model().kind() << " on "
                  << spec.dataset().kind() << ", " << spec.min_workers() << "-"
                  << spec.max_workers() << " workers";
    dirty_ = true;
    PersistLocked(&fx);
    MaybeFormGenerationLocked(&fx);
  }
  Apply(fx);
  return spec;
}

absl::Status Coordinator::CancelJob(const std::string& job_id, const std::string& reason) {
  Effects fx;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = job_.Cancel(job_id, reason); !s.ok()) return s;
    DDP_LOG(Info) << "job " << job_id << " cancelled: " << reason;
    EndGenerationLocked(reason.empty() ? "job cancelled" : absl::StrCat("job cancelled: ", reason),
                        &fx);
    dirty_ = true;
    PersistLocked(&fx);
  }
  Apply(fx);
  return absl::OkStatus();
}

absl::StatusOr<std::string> Coordinator::StoreNamespace(const std::string& job_id,
                                                        uint64_t generation,
                                                        const std::string& key) {
  if (key.empty()) return absl::InvalidArgumentError("store key is empty");
  absl::MutexLock lock(&mu_);
  if (!job_.active() || job_id != job_.id()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job \"", job_id, "\" is not running",
        job_.active() ? absl::StrCat("; the current job is \"", job_.id(), "\"") : ""));
  }
  if (!generations_.IsCurrent(generation)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "stale generation ", generation, " for job \"", job_id, "\": the current generation is ",
        generations_.current() ? generations_.current()->number : 0));
  }
  return absl::StrCat(job_id, "/", generation, "/");
}

absl::Status Coordinator::StoreSet(const v1::StoreSetRequest& request) {
  absl::StatusOr<std::string> ns =
      StoreNamespace(request.job_id(), request.generation(), request.key());
  if (!ns.ok()) return ns.status();
  store_.Set(*ns, request.key(), request.value());
  return absl::OkStatus();
}

void Coordinator::StoreGet(const v1::StoreGetRequest& request, KvStore::GetCallback done) {
  absl::StatusOr<std::string> ns =
      StoreNamespace(request.job_id(), request.generation(), request.key());
  if (!ns.ok()) return done(ns.status());
  if (request.timeout_seconds() < 0) {
    return done(absl::InvalidArgumentError("timeout_seconds must not be negative"));
  }
  absl::Duration wait = request.timeout_seconds() == 0 ? options_.default_store_wait
                                                       : absl::Seconds(request.timeout_seconds());
  wait = std::min(wait, options_.max_store_wait);
  store_.Get(*ns, request.key(), clock_->Now() + wait, std::move(done));
}

absl::StatusOr<int64_t> Coordinator::StoreAdd(const v1::StoreAddRequest& request) {
  absl::StatusOr<std::string> ns =
      StoreNamespace(request.job_id(), request.generation(), request.key());
  if (!ns.ok()) return ns.status();
  return store_.Add(*ns, request.key(), request.delta());
}

void Coordinator::Tick() {
  Effects fx;
  {
    absl::MutexLock lock(&mu_);
    for (const std::string& id : registry_.ExpireSilent()) {
      OnWorkerLostLocked(registry_.Find(id), &fx);
      dirty_ = true;
    }
    MaybeFormGenerationLocked(&fx);
    const absl::Duration age = clock_->Now() - published_at_;
    if ((dirty_ && age >= options_.snapshot_min_interval) || age >= options_.snapshot_max_age) {
      PublishLocked();
    }
  }
  Apply(fx);
  store_.ExpireWaiters();
}

void Coordinator::PublishLocked() {
  job_.SampleProgress();
  auto status = std::make_shared<v1::JobStatus>();
  job_.FillStatus(status.get());
  const Generation* g = generations_.last();
  status->set_generation(generations_.latest());
  if (g) status->set_world_size(static_cast<uint32_t>(g->members.size()));
  const absl::Time now = clock_->Now();
  uint32_t attached = 0;
  for (const WorkerRecord* w : registry_.All()) {
    attached += w->lost ? 0 : 1;
    v1::WorkerStatus* ws = status->add_workers();
    ws->set_worker_id(w->id);
    ws->set_host(w->host);
    ws->set_device(w->device.ToString());
    ws->set_pid(w->pid);
    ws->set_version(w->version);
    ws->set_rank(g ? g->RankOf(w->id) : -1);
    ws->set_state(w->state);
    ws->set_detail(w->detail);
    ws->set_generation(w->generation);
    ws->set_epoch(w->epoch);
    ws->set_step(w->step);
    ws->set_last_loss(w->last_loss);
    ws->set_samples_per_sec(w->samples_per_sec);
    *ws->mutable_reduction() = w->reduction;
    for (const auto& name : w->unused_parameters) ws->add_unused_parameters(name);
    ws->set_seconds_since_heartbeat(absl::ToDoubleSeconds(now - w->last_seen));
    ws->set_phase(w->phase);
    ws->set_reports_dropped(w->reports_dropped);
    *ws->mutable_probe() = w->probe;
    ws->set_stale_messages(w->stale_messages);
    ws->set_parameter_digest(w->parameter_digest);
    ws->set_digest_step(w->digest_step);
  }
  status->set_attached_workers(attached);
  dirty_ = false;
  published_at_ = now;
  absl::MutexLock lock(&snapshot_mu_);
  snapshot_ = std::move(status);
}

std::shared_ptr<const v1::JobStatus> Coordinator::Snapshot() const {
  absl::MutexLock lock(&snapshot_mu_);
  return snapshot_;
}

v1::JobState Coordinator::job_state() const {
  absl::MutexLock lock(&mu_);
  return job_.state();
}

void Coordinator::StopAllWorkers(const std::string& reason) {
  Effects fx;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, channel] : channels_) {
      v1::CoordinatorMessage message;
      message.mutable_stop()->set_reason(reason);
      fx.sends.emplace_back(channel.second, std::move(message));
    }
  }
  Apply(fx);
}

}  // namespace ddp
