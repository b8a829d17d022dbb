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

// The spec as submitted: without the pins its check added.
v1::JobSpec Unpinned(v1::JobSpec spec) {
  spec.clear_input_files();
  return spec;
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
  if (AnyActiveLocked()) {
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
    answer = AnswerWithoutCheckLocked(spec);
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
    // Things may have changed while the job was checked.
    if (auto answer = AnswerWithoutCheckLocked(spec)) return *answer;
    if (const auto quota = options_.owner_quotas.find(owner);
        quota != options_.owner_quotas.end() && spec.min_workers() > quota->second) {
      return absl::FailedPreconditionError(absl::StrCat(
          "minWorkers ", spec.min_workers(), " is more than the ", quota->second,
          " worker(s) the jobs of ", Quote(owner),
          " may hold (max_workers in the coordinator's tokens file): lower minWorkers, or ask "
          "an admin for a larger quota"));
    }
    if (AnyActiveLocked()) {
      if (absl::Status s = queue_.Add(spec, owner, clock_->Now()); !s.ok()) return s;
      DDP_LOG(Info) << "job " << spec.name() << " queued (priority " << spec.priority() << ", "
                    << queue_.size() << " in the queue)";
      dirty_ = true;
      // It may fit the free workers at once.
      AllocateLocked(&fx);
      PersistLocked(&fx);
    } else if (absl::Status s = StartJobLocked(spec, owner, &fx); !s.ok()) {
      return s;
    }
  }
  Apply(fx);
  return spec;
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
  } else if (absl::Status s = started->Start(spec, owner); !s.ok()) {
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

absl::Status Coordinator::CancelJob(const std::string& job_id, const std::string& given_reason) {
  // Kept in the job's message and the change log.
  const std::string reason = Truncated(given_reason, kMaxReportedTextBytes);
  Effects fx;
  {
    absl::MutexLock lock(&mu_);
    if (queue_.Remove(job_id)) {
      DDP_LOG(Info) << "job " << job_id << " cancelled while queued: " << reason;
    } else {
      JobRun* found = FindRunLocked(job_id);
      if (found == nullptr) {
        return absl::NotFoundError(absl::StrCat(
            "no job ", Quote(job_id), " is running or queued (running: ", RunningJobsLocked(),
            "; ListJobs lists every job)"));
      }
      JobRun& run = *found;
      if (absl::Status s = run.Cancel(job_id, reason); !s.ok()) return s;
      DDP_LOG(Info) << "job " << job_id << " cancelled: " << reason;
      EndGenerationLocked(
          run, reason.empty() ? "job cancelled" : absl::StrCat("job cancelled: ", reason), &fx);
      // Its workers go to the queue's next job, or to the jobs running.
      AllocateLocked(&fx);
    }
    dirty_ = true;
    PersistLocked(&fx);
  }
  Apply(fx);
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
