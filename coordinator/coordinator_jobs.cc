// The Coordinator's operator side: jobs (submit, cancel), the rendezvous
// store, and the status snapshot operators read.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/quote.h"
#include "common/tokens.h"
#include "coordinator/coordinator.h"
#include "google/protobuf/arena.h"
#include "google/protobuf/util/message_differencer.h"

namespace ddp {
namespace {

// The first field where two specs differ, in words.
std::string FirstDifference(const v1::JobSpec& a, const v1::JobSpec& b) {
  std::string report;
  google::protobuf::util::MessageDifferencer differencer;
  differencer.ReportDifferencesToString(&report);
  differencer.Compare(a, b);
  return Truncated(report.substr(0, report.find('\n')), 4 * kMaxQuotedBytes);
}

// The spec as submitted: without the pins its check added.
v1::JobSpec Unpinned(v1::JobSpec spec) {
  spec.clear_input_files();
  return spec;
}

}  // namespace

std::optional<absl::StatusOr<v1::JobSpec>> Coordinator::AnswerWithoutCheckLocked(
    JobRun& run, const v1::JobSpec& spec) {
  const JobProgress& job = run.progress();
  if (job.state() != v1::JOB_STATE_UNSPECIFIED && job.id() == spec.name()) {
    if (google::protobuf::util::MessageDifferencer::Equals(Unpinned(job.spec()), Unpinned(spec))) {
      return job.spec();  // already held: a restart re-reading its --job, say
    }
    return absl::FailedPreconditionError(
        absl::StrCat("job \"", spec.name(), "\" already exists (", v1::JobState_Name(job.state()),
                     ") with another spec (", FirstDifference(job.spec(), spec),
                     "); give the new job another name",
                     job.active() ? ", or cancel this one first (CancelJob)" : ""));
  }
  if (const QueuedJob* queued = queue_.Find(spec.name())) {
    if (google::protobuf::util::MessageDifferencer::Equals(Unpinned(queued->spec),
                                                           Unpinned(spec))) {
      return queued->spec;  // queued already
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "job \"", spec.name(), "\" is already queued with another spec (",
        FirstDifference(queued->spec, spec),
        "); give the new job another name, or cancel the queued one first (CancelJob)"));
  }
  if (job.active()) {
    if (absl::Status s = queue_.CheckRoom(); !s.ok()) return s;
  }
  return std::nullopt;
}

void Coordinator::SubmitJob(const v1::JobSpec& requested, SubmitDone done,
                            const std::string& owner) {
  if (requested.input_files_size() > 0) {
    return done(absl::InvalidArgumentError(
        "input_files: set by the coordinator from its check of the job's files; leave it out"));
  }
  v1::JobSpec spec = WithDefaults(requested);
  if (absl::Status s = ValidateJobSpec(spec, options_.build); !s.ok()) return done(s);
  std::optional<absl::StatusOr<v1::JobSpec>> answer;
  {
    // Refuse early, before the (slow) check.
    absl::MutexLock lock(&mu_);
    answer = AnswerWithoutCheckLocked(*run_, spec);
  }
  if (answer) return done(std::move(*answer));
  if (!options_.validate_job) return done(AcceptJob(spec, owner));
  options_.validate_job(spec,
                        [this, owner, done = std::move(done)](absl::StatusOr<v1::JobSpec> checked) {
                          if (!checked.ok()) return done(checked.status());
                          done(AcceptJob(*checked, owner));
                        });
}

absl::StatusOr<v1::JobSpec> Coordinator::AcceptJob(const v1::JobSpec& spec,
                                                   const std::string& owner) {
  Effects fx;
  {
    absl::MutexLock lock(&mu_);
    JobRun& run = *run_;
    // Things may have changed while the job was checked.
    if (auto answer = AnswerWithoutCheckLocked(run, spec)) return *answer;
    if (run.active()) {
      if (absl::Status s = queue_.Add(spec, owner, clock_->Now()); !s.ok()) return s;
      DDP_LOG(Info) << "job " << spec.name() << " queued (priority " << spec.priority() << ", "
                    << queue_.size() << " in the queue): job " << run.id() << " holds the pool";
      dirty_ = true;
      PersistLocked(run, &fx);
    } else if (absl::Status s = StartJobLocked(run, spec, owner, &fx); !s.ok()) {
      return s;
    }
  }
  Apply(fx);
  return spec;
}

absl::Status Coordinator::StartJobLocked(JobRun& run, const v1::JobSpec& spec,
                                         const std::string& owner, Effects* fx) {
  if (absl::Status s = run.Start(spec, owner); !s.ok()) return s;
  DDP_LOG(Info) << "job " << spec.name() << " submitted: " << spec.model().kind() << " on "
                << spec.dataset().kind() << ", " << spec.min_workers() << "-" << spec.max_workers()
                << " workers";
  // Held states belong to the previous job.
  registry_.ForgetJobStates();
  for (const WorkerRecord* w : registry_.All()) {
    MaybePrepareLocked(run, registry_.Find(w->id), fx);
  }
  dirty_ = true;
  PersistLocked(run, fx);
  MaybeFormGenerationLocked(run, fx);
  return absl::OkStatus();
}

absl::Status Coordinator::CancelJob(const std::string& job_id, const std::string& given_reason) {
  // Kept in the job's message and the change log.
  const std::string reason = Truncated(given_reason, kMaxReportedTextBytes);
  Effects fx;
  {
    absl::MutexLock lock(&mu_);
    JobRun& run = *run_;
    if (queue_.Remove(job_id)) {
      DDP_LOG(Info) << "job " << job_id << " cancelled while queued: " << reason;
    } else {
      if (absl::Status s = run.Cancel(job_id, reason); !s.ok()) return s;
      DDP_LOG(Info) << "job " << job_id << " cancelled: " << reason;
      EndGenerationLocked(
          run, reason.empty() ? "job cancelled" : absl::StrCat("job cancelled: ", reason), &fx);
    }
    dirty_ = true;
    PersistLocked(run, &fx);
  }
  Apply(fx);
  return absl::OkStatus();
}

absl::StatusOr<std::string> Coordinator::StoreNamespace(const std::string& job_id,
                                                        uint64_t generation, const std::string& key,
                                                        absl::string_view store_token) {
  if (absl::Status s = store_.CheckKey(key); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  const JobRun& run = *run_;  // the job the key names, if it is running
  if (!run.active() || job_id != run.id()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", Quote(job_id), " is not running",
                     run.active() ? absl::StrCat("; the current job is \"", run.id(), "\"") : ""));
  }
  const Generation* current = run.generations().current();
  if (current == nullptr || current->number != generation) {
    return absl::FailedPreconditionError(absl::StrCat("stale generation ", generation, " for job ",
                                                      Quote(job_id), ": the current generation is ",
                                                      current ? current->number : 0));
  }
  if (options_.require_store_tokens) {
    if (store_token.empty()) {
      return absl::PermissionDeniedError(absl::StrCat(
          "no store token: the store of generation ", generation,
          " is open to its members only, with the store_token of their Assignment in the "
          "ddp-store-token metadata"));
    }
    // Every member's token is compared: the time says nothing of which.
    bool member = false;
    for (const std::string& token : current->store_tokens) {
      if (ConstantTimeEquals(token, store_token)) member = true;
    }
    if (!member) {
      return absl::PermissionDeniedError(
          absl::StrCat("the store token is not one of generation ", generation,
                       "'s members': the store is open only to the generation a worker is "
                       "assigned to"));
    }
  }
  return run.StoreNamespace(generation);
}

absl::Status Coordinator::StoreSet(const v1::StoreSetRequest& request,
                                   absl::string_view store_token) {
  absl::StatusOr<std::string> ns =
      StoreNamespace(request.job_id(), request.generation(), request.key(), store_token);
  if (!ns.ok()) return ns.status();
  return store_.Set(*ns, request.key(), request.value());
}

KvStore::WaiterId Coordinator::StoreGet(const v1::StoreGetRequest& request,
                                        KvStore::GetCallback done, absl::string_view store_token) {
  absl::StatusOr<std::string> ns =
      StoreNamespace(request.job_id(), request.generation(), request.key(), store_token);
  if (!ns.ok()) {
    done(ns.status());
    return 0;
  }
  if (!(request.timeout_seconds() >= 0)) {  // NaN too
    done(absl::InvalidArgumentError("timeout_seconds must be a number >= 0"));
    return 0;
  }
  absl::Duration wait = request.timeout_seconds() == 0 ? options_.default_store_wait
                                                       : absl::Seconds(request.timeout_seconds());
  wait = std::min(wait, options_.max_store_wait);
  return store_.Get(*ns, request.key(), clock_->Now() + wait, std::move(done));
}

absl::StatusOr<int64_t> Coordinator::StoreAdd(const v1::StoreAddRequest& request,
                                              absl::string_view store_token) {
  absl::StatusOr<std::string> ns =
      StoreNamespace(request.job_id(), request.generation(), request.key(), store_token);
  if (!ns.ok()) return ns.status();
  return store_.Add(*ns, request.key(), request.delta());
}

void Coordinator::PublishLocked() {
  JobRun& run = *run_;  // the job the status is about
  run.progress().SampleProgress();
  // On an arena: at 4,096 workers the snapshot is ~40k small objects, made
  // and (for the one it replaces) freed under mu_ several times a second.
  google::protobuf::ArenaOptions arena_options;
  arena_options.start_block_size = 64 << 10;
  arena_options.max_block_size = 4 << 20;
  auto arena = std::make_shared<google::protobuf::Arena>(arena_options);
  v1::JobStatus* status = google::protobuf::Arena::CreateMessage<v1::JobStatus>(arena.get());
  run.FillStatus(status);
  const std::string ahead = run.active() ? run.id() : "";
  for (size_t i = 0; i < queue_.size() && i < kQueueInStatus; ++i) {
    *status->add_queue() = queue_.Summary(i, clock_->Now(), ahead);
  }
  status->set_queued_jobs(static_cast<uint32_t>(queue_.size()));
  // Ranks as in the current generation, or once it ended, the last one
  // (operators still want to see who had which rank).
  const Generation* g = run.generations().last();
  // What GetStatus answers: the job as above, with a bounded worker list.
  // Its own heap copy: a WatchStatus stream holding it must not keep the
  // whole snapshot's arena alive.
  auto view = std::make_shared<v1::JobStatus>(*status);
  const absl::Time now = clock_->Now();
  uint32_t attached = 0;
  for (const WorkerRecord* w : registry_.All()) {
    attached += w->lost() ? 0 : 1;
    v1::WorkerStatus* ws = status->add_workers();
    ws->set_worker_id(w->id);
    ws->set_host(w->host);
    ws->set_device(w->device.ToString());
    ws->set_pid(w->pid);
    ws->mutable_labels()->insert(w->labels.begin(), w->labels.end());
    ws->set_version(w->version);
    ws->set_rank(g ? g->RankOf(w->id) : -1);
    ws->set_state(w->state());
    ws->set_detail(w->detail());
    ws->set_generation(w->generation);
    ws->set_epoch(w->epoch);
    ws->set_step(w->step);
    ws->set_last_loss(w->last_loss);
    ws->set_samples_per_sec(w->samples_per_sec);
    *ws->mutable_reduction() = w->reduction;
    *ws->mutable_timings() = w->timings;
    ws->set_step_seconds(w->step_seconds);
    for (const auto& name : w->unused_parameters) ws->add_unused_parameters(name);
    ws->set_seconds_since_heartbeat(absl::ToDoubleSeconds(now - w->last_seen));
    ws->set_phase(w->phase);
    ws->set_reports_dropped(w->reports_dropped);
    *ws->mutable_probe() = w->probe;
    ws->set_stale_messages(w->stale_messages);
    ws->set_unused_parameter_names_dropped(w->unused_names_dropped);
    ws->set_parameter_digest(w->parameter_digest);
    ws->set_digest_step(w->digest_step);
    if (w->held) *ws->mutable_held() = *w->held;
  }
  status->set_attached_workers(attached);
  view->set_attached_workers(attached);
  BoundStatusView(*status, options_.status_workers, view.get());
  dirty_ = false;
  published_at_ = now;
  absl::MutexLock lock(&snapshot_mu_);
  snapshot_ = std::shared_ptr<const v1::JobStatus>(std::move(arena), status);
  view_ = std::move(view);
}

std::shared_ptr<const v1::JobStatus> Coordinator::Snapshot() const {
  absl::MutexLock lock(&snapshot_mu_);
  return snapshot_;
}

std::shared_ptr<const v1::JobStatus> Coordinator::StatusView() const {
  absl::MutexLock lock(&snapshot_mu_);
  return view_;
}

v1::JobState Coordinator::job_state() const {
  absl::MutexLock lock(&mu_);
  return run_->progress().state();
}

}  // namespace ddp
