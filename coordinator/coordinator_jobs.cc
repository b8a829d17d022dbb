// The Coordinator's operator side: jobs (submit, cancel) and the
// rendezvous store. The status operators read is in coordinator_status.cc.
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

// The spec as submitted: without the pins its check added (the inputs it
// read, the folders it resolved).
v1::JobSpec Unpinned(v1::JobSpec spec) {
  spec.clear_input_files();
  spec.clear_write_folders();
  return spec;
}

// Whether two submissions are of the same job (the check's pins aside).
bool SameSubmission(const v1::JobSpec& a, const v1::JobSpec& b) {
  return google::protobuf::util::MessageDifferencer::Equals(Unpinned(a), Unpinned(b));
}

}  // namespace

std::optional<absl::StatusOr<v1::JobSpec>> Coordinator::AnswerWithoutCheckLocked(
    const v1::JobSpec& spec) {
  if (const JobRun* run = FindRunLocked(spec.name())) {
    const JobProgress& job = run->progress();
    if (google::protobuf::util::MessageDifferencer::Equals(Unpinned(job.spec()), Unpinned(spec))) {
      return job.spec();  // already held: a restart re-reading its --job, say
    }
    return absl::FailedPreconditionError(
        absl::StrCat("job \"", spec.name(), "\" already exists (", v1::JobState_Name(job.state()),
                     ") with another spec (", FirstDifference(Unpinned(job.spec()), Unpinned(spec)),
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
        FirstDifference(Unpinned(queued->spec), Unpinned(spec)),
        "); give the new job another name, or cancel the queued one first (CancelJob)"));
  }
  if (const JobHistory::Entry* ended = history_.Find(spec.name())) {
    const v1::JobRecord& r = ended->record;
    if (r.submission_digest() == SubmissionDigest(spec)) {
      DDP_LOG(Info) << "job " << spec.name() << " ended already (" << v1::JobState_Name(r.state())
                    << "): not run again";
      return spec;
    }
    return absl::FailedPreconditionError(
        absl::StrCat("job \"", spec.name(), "\" already ran (", v1::JobState_Name(r.state()), ": ",
                     r.message(), ") with another spec; give the new job another name"));
  }
  if (const PendingChanges::Admission* pending = pending_.FindAdmission(spec.name());
      pending != nullptr && !SameSubmission(pending->job.spec, spec)) {
    return absl::FailedPreconditionError(
        absl::StrCat("job \"", spec.name(), "\" is being submitted already, with another spec (",
                     FirstDifference(Unpinned(pending->job.spec), Unpinned(spec)),
                     "); give the new job another name"));
  }
  if (AnyActiveLocked()) {
    if (absl::Status s = queue_.CheckRoom(pending_.admissions()); !s.ok()) return s;
  }
  return std::nullopt;
}

bool Coordinator::JoinAdmissionLocked(const v1::JobSpec& spec, SubmitDone& done) {
  PendingChanges::Admission* pending = pending_.FindAdmission(spec.name());
  if (pending == nullptr || !SameSubmission(pending->job.spec, spec)) return false;
  pending->answers.push_back(std::move(done));
  return true;
}

void Coordinator::SubmitJob(const v1::JobSpec& requested, SubmitDone done,
                            const std::string& owner) {
  if (requested.input_files_size() > 0) {
    return done(absl::InvalidArgumentError(
        "input_files: set by the coordinator from its check of the job's files; leave it out"));
  }
  if (requested.write_folders_size() > 0) {
    return done(absl::InvalidArgumentError(
        "write_folders: set by the coordinator from its check of the job's folders; leave it "
        "out"));
  }
  v1::JobSpec spec = WithDefaults(requested);
  if (absl::Status s = ValidateJobSpec(spec, options_.build); !s.ok()) return done(s);
  std::optional<absl::StatusOr<v1::JobSpec>> answer;
  {
    // Refuse early, before the (slow) check.
    absl::MutexLock lock(&mu_);
    answer = AnswerWithoutCheckLocked(spec);
    if (!answer) {
      if (absl::Status s = CheckOwnerLimitsLocked(spec, owner); !s.ok()) answer = s;
    }
    // The same job submitted again while its first submission is saved: one
    // write answers both.
    if (!answer && JoinAdmissionLocked(spec, done)) return;
  }
  if (answer) return done(std::move(*answer));
  if (!options_.validate_job) return AcceptJob(spec, owner, std::move(done));
  options_.validate_job(spec,
                        [this, owner, done = std::move(done)](absl::StatusOr<v1::JobSpec> checked) {
                          if (!checked.ok()) return done(checked.status());
                          AcceptJob(*checked, owner, std::move(done));
                        });
}

void Coordinator::AcceptJob(const v1::JobSpec& spec, const std::string& owner, SubmitDone done) {
  Effects fx;
  std::optional<absl::StatusOr<v1::JobSpec>> answer;
  {
    absl::MutexLock lock(&mu_);
    // Things may have changed while the job was checked.
    answer = AnswerWithoutCheckLocked(spec);
    if (!answer && JoinAdmissionLocked(spec, done)) return;
    if (const auto quota = options_.owner_quotas.find(owner);
        !answer && quota != options_.owner_quotas.end() && spec.min_workers() > quota->second) {
      answer = absl::FailedPreconditionError(absl::StrCat(
          "minWorkers ", spec.min_workers(), " is more than the ", quota->second,
          " worker(s) the jobs of ", Quote(owner),
          " may hold (max_workers in the coordinator's tokens file): lower minWorkers, or ask "
          "an admin for a larger quota"));
    }
    if (!answer) {
      if (absl::Status s = CheckOwnerLimitsLocked(spec, owner); !s.ok()) answer = s;
    }
    if (!answer) {
      // Saved as queued first; it takes effect (and the caller hears) once
      // that write is done.
      pending_.AddAdmission(
          QueuedJob{spec, owner, queue_.ReserveSequence(), clock_->Now(), nullptr},
          std::move(done));
      dirty_ = true;
      PersistLocked(&fx);
      fx.on_durable.push_back(
          [this, id = spec.name()](absl::Status saved) { OnAdmissionSaved(id, saved); });
    }
  }
  if (answer) return done(std::move(*answer));
  Apply(fx);
}

void Coordinator::OnAdmissionSaved(const std::string& id, const absl::Status& saved) {
  Effects fx;
  std::optional<PendingChanges::Admission> admitted;
  absl::StatusOr<v1::JobSpec> answer = absl::UnknownError("not answered");
  {
    absl::MutexLock lock(&mu_);
    admitted = pending_.TakeAdmission(id);
    if (!admitted) return;
    if (!saved.ok()) {
      answer = saved;
      // Nothing happened: the next save holds no trace of it either.
      dirty_ = true;
      PersistLocked(&fx);
    } else {
      answer = admitted->job.spec;
      // A coordinator stopping decides nothing more: the job is saved as
      // queued, and the next start runs it.
      if (!shutting_down_) {
        if (AnyActiveLocked()) {
          absl::Status queued = queue_.Add(admitted->job);
          if (queued.ok()) {
            DDP_LOG(Info) << "job " << id << " queued (priority " << admitted->job.spec.priority()
                          << ", " << queue_.size() << " in the queue)";
            // It may fit the free workers at once.
            AllocateLocked(&fx);
          } else {
            answer = queued;
          }
        } else if (absl::Status s =
                       StartJobLocked(admitted->job.spec, admitted->job.owner, &fx, &admitted->job);
                   !s.ok()) {
          answer = s;
        }
        dirty_ = true;
        PersistLocked(&fx);
      }
    }
  }
  Apply(fx);
  for (SubmitDone& done : admitted->answers) done(answer);
}

absl::Status Coordinator::StartJobLocked(const v1::JobSpec& spec, const std::string& owner,
                                         Effects* fx, const QueuedJob* queued,
                                         const std::vector<std::string>* workers) {
  auto started = std::make_unique<JobRun>(clock_);
  if (queued != nullptr && queued->preempted != nullptr) {
    // Where it stood when preempted: its progress, newest checkpoint,
    // changes (the preemption still open) and epoch results.
    started->Restore(*queued->preempted, absl::ZeroDuration());
    started->progress().Recover(
        absl::StrCat("resuming after its preemption, from its checkpoint of step ",
                     queued->preempted->last_checkpoint_step()));
  } else if (absl::Status s = started->Start(
                 spec, owner, queued != nullptr ? queued->submitted_at : clock_->Now());
             !s.ok()) {
    return s;
  }
  // Its generations are numbered after every job's.
  started->generations().RestoreLatest(LatestGenerationLocked());
  if (queued != nullptr) started->set_queue_sequence(queued->sequence);
  started->set_start_sequence(next_run_sequence_++);
  runs_.push_back(std::move(started));
  JobRun& run = *runs_.back();
  PruneEndedLocked();
  DDP_LOG(Info) << "job " << spec.name() << " submitted: " << spec.model().kind() << " on "
                << spec.dataset().kind() << ", " << spec.min_workers() << "-" << spec.max_workers()
                << " workers";
  dirty_ = true;
  // Workers let go for it that it does not take are anyone's: the promise
  // must not come back if it is preempted and queued again.
  for (const WorkerRecord* w : registry_.All()) {
    if (w->promised_to == run.id()) registry_.Find(w->id)->promised_to.clear();
  }
  if (workers == nullptr) {
    GiveWorkersLocked(run, run.spec().max_workers(), fx);
  } else {
    for (const std::string& id : *workers) GiveWorkerLocked(run, registry_.Find(id), fx);
  }
  PersistLocked(fx);
  MaybeFormGenerationLocked(run, fx);
  return absl::OkStatus();
}

void Coordinator::CancelJob(const std::string& job_id, const std::string& given_reason,
                            CancelDone done, const Caller& caller) {
  // Kept in the job's message, its history and the change log, with who.
  const std::string who = caller.owner.empty() ? "" : absl::StrCat("by ", caller.owner);
  const std::string reason = absl::StrCat(who, !who.empty() && !given_reason.empty() ? ": " : "",
                                          Truncated(given_reason, kMaxReportedTextBytes));
  Effects fx;
  absl::Status refused;
  {
    absl::MutexLock lock(&mu_);
    refused = CanCancelLocked(job_id);
    if (refused.ok()) refused = MayActOnLocked(job_id, caller);
    if (refused.ok()) {
      if (PendingChanges::Cancellation* pending = pending_.FindCancellation(job_id)) {
        pending->answers.push_back(std::move(done));  // one write answers both
        return;
      }
      // Saved as cancelled first; carried out (and answered) once that
      // write is done.
      pending_.AddCancellation(job_id, reason, std::move(done));
      dirty_ = true;
      PersistLocked(&fx);
      fx.on_durable.push_back(
          [this, job_id](absl::Status saved) { OnCancellationSaved(job_id, saved); });
    }
  }
  if (!refused.ok()) return done(refused);
  Apply(fx);
}

absl::Status Coordinator::CanCancelLocked(const std::string& job_id) const {
  if (queue_.Find(job_id) != nullptr) return absl::OkStatus();
  const JobRun* run = FindRunLocked(job_id);
  if (const JobHistory::Entry* ended = history_.Find(job_id); run == nullptr && ended) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", Quote(job_id), " already ended (", v1::JobState_Name(ended->record.state()), ")"));
  }
  if (run == nullptr) {
    return absl::NotFoundError(absl::StrCat("no job ", Quote(job_id),
                                            " is running or queued (running: ", RunningJobsLocked(),
                                            "; ListJobs lists every job)"));
  }
  if (!run->active()) {
    return absl::FailedPreconditionError(absl::StrCat("job ", Quote(job_id), " already ended (",
                                                      v1::JobState_Name(run->progress().state()),
                                                      ")"));
  }
  return absl::OkStatus();
}

absl::Status Coordinator::CheckOwnerLimitsLocked(const v1::JobSpec& spec,
                                                 const std::string& owner) const {
  const auto limits = options_.owner_limits.find(owner);
  if (limits == options_.owner_limits.end()) return absl::OkStatus();
  const int32_t max_priority = limits->second.max_priority.value_or(0);
  if (spec.priority() > max_priority) {
    return absl::PermissionDeniedError(absl::StrCat(
        "priority ", spec.priority(), " is above the ", max_priority, " the jobs of ", Quote(owner),
        " may have (max_priority in the coordinator's tokens file): a higher priority preempts "
        "other owners' jobs; lower it, or ask an admin for a higher class"));
  }
  const size_t share = limits->second.max_queued.value_or(
      std::max<size_t>(1, kMaxQueuedJobs / options_.owner_limits.size()));
  size_t queued = pending_.AdmissionsOf(owner);
  for (const QueuedJob& q : queue_.jobs()) queued += q.owner == owner ? 1 : 0;
  if (queued >= share) {
    return absl::ResourceExhaustedError(absl::StrCat(
        Quote(owner), " has ", queued, " job(s) queued, its share of the queue (",
        limits->second.max_queued ? "max_queued in the coordinator's tokens file"
                                  : absl::StrCat("the ", kMaxQueuedJobs, " places shared among ",
                                                 options_.owner_limits.size(), " owners"),
        "): wait for one to start, or cancel one"));
  }
  return absl::OkStatus();
}

absl::Status Coordinator::MayActOnLocked(const std::string& job_id, const Caller& caller) const {
  if (caller.all) return absl::OkStatus();
  const QueuedJob* queued = queue_.Find(job_id);
  const JobRun* run = FindRunLocked(job_id);
  const std::string owner = queued ? queued->owner : run ? run->owner() : "";
  if (owner.empty() || owner == caller.owner) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      "job ", Quote(job_id), " belongs to ", Quote(owner), ", not to ", Quote(caller.owner),
      ": only its owner's tokens, or one with scope=all in the coordinator's tokens file, may "
      "act on it"));
}

void Coordinator::OnCancellationSaved(const std::string& id, const absl::Status& saved) {
  Effects fx;
  std::optional<PendingChanges::Cancellation> cancelled;
  absl::Status answer = saved;
  {
    absl::MutexLock lock(&mu_);
    cancelled = pending_.TakeCancellation(id);
    if (!cancelled) return;
    if (saved.ok() && !shutting_down_) answer = CancelNowLocked(id, cancelled->reason, &fx);
    dirty_ = true;
    PersistLocked(&fx);
  }
  Apply(fx);
  for (CancelDone& done : cancelled->answers) done(answer);
}

absl::Status Coordinator::CancelNowLocked(const std::string& job_id, const std::string& reason,
                                          Effects* fx) {
  if (std::optional<QueuedJob> queued = queue_.Take(job_id)) {
    DDP_LOG(Info) << "job " << job_id << " cancelled while queued: " << reason;
    history_.Record(JobHistory::CancelledWhileQueued(queued->spec, queued->owner,
                                                     queued->submitted_at, reason, clock_->Now()),
                    next_run_sequence_++);
    return absl::OkStatus();
  }
  if (absl::Status s = CanCancelLocked(job_id); !s.ok()) return s;  // it ended meanwhile
  JobRun& run = *FindRunLocked(job_id);
  if (absl::Status s = run.Cancel(job_id, reason); !s.ok()) return s;
  DDP_LOG(Info) << "job " << job_id << " cancelled: " << reason;
  EndGenerationLocked(
      run, reason.empty() ? "job cancelled" : absl::StrCat("job cancelled: ", reason), fx);
  // Its workers go to the queue's next job, or to the jobs running.
  AllocateLocked(fx);
  return absl::OkStatus();
}

absl::StatusOr<std::string> Coordinator::StoreNamespace(const std::string& job_id,
                                                        uint64_t generation, const std::string& key,
                                                        absl::string_view store_token) {
  if (absl::Status s = store_.CheckKey(key); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  const JobRun* found = FindRunLocked(job_id);  // the job the key names, if it is running
  if (found == nullptr || !found->active()) {
    return absl::FailedPreconditionError(absl::StrCat("job ", Quote(job_id), " is not running"));
  }
  const JobRun& run = *found;
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

}  // namespace ddp
