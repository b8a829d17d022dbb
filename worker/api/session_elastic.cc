// A joined session's elastic side: what each rank holds when a generation
// ends, dropping the step in flight, and taking up the new generation at the
// next step boundary.
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/script.h>

#include <cstdlib>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/job_spec.h"
#include "common/logging.h"
#include "ddp/error.h"
#include "worker/api/session_impl.h"
#include "worker/elastic/optimizer_state.h"
#include "worker/elastic/state_transfer.h"

namespace ddp {

void Session::Impl::OnCommitted() {
  ++committed.step;
  if (sampler) std::tie(committed.epoch, committed.cursor) = sampler->position();
  if (joined) joined->SetCommitted(committed.step, committed.epoch, committed.cursor);
}

bool Session::Impl::VoidStep(const absl::Status& failure) {
  // Misaligned collectives are the program's: re-forming would not help.
  if (!joined || !elastic || IsMisaligned(failure)) return false;
  if (!joined->AwaitEnd(failure, absl::Seconds(options.timeout_seconds))) return false;
  GoOnAtLoopsPass(/*at_pass_end=*/false);
  // Nothing has moved since the last committed step yet: keep it, to undo
  // what the optimizer is about to do with these gradients.
  offered = EncodeState();
  saw_end = true;
  if (ddp) ddp->zero_grads();
  DDP_LOG(Warning) << "step " << committed.step + 1 << " dropped: " << joined->ended_reason();
  return true;
}

bool Session::Impl::DroppedStepIn(uint64_t epoch) const {
  // Committed steps that end an epoch leave the position at the next one.
  return SawEnd() && committed.epoch == epoch;
}

void Session::Impl::GoOnAtLoopsPass(bool at_pass_end) {
  // Not after a dropped step: its state (offered) is the one to go on from.
  if (!joined || !elastic || !sampler || offered) return;
  const auto [epoch, cursor] = sampler->position();
  if (epoch <= committed.epoch) return;
  if (!at_pass_end && epoch == committed.epoch + 1 && cursor == 0) return;
  committed.epoch = epoch;
  committed.cursor = 0;
  joined->SetCommitted(committed.step, committed.epoch, committed.cursor);
}

void Session::Impl::AtStepBoundary() {
  if (!joined || !elastic || !joined->ended()) return;
  const std::string why = joined->ended_reason();
  // What this rank offers, frozen now: a failed attempt below may have
  // overwritten some parameters from another rank.
  if (!offered) offered = EncodeState();
  const absl::Time deadline = absl::Now() + absl::Seconds(options.timeout_seconds);
  while (true) {
    if (ddp) ddp->release();
    for (absl::Status s = joined->Reform(deadline - absl::Now()); !s.ok();
         s = joined->Reform(deadline - absl::Now())) {
      // ABORTED: the new generation ended too before it formed; wait for the
      // next one.
      if (!absl::IsAborted(s) || !joined->ended() || absl::Now() >= deadline) {
        // The job ended (it failed, say) rather than re-forming: say why.
        if (const std::string failure = joined->job_failure(); !failure.empty()) {
          throw Error(failure);
        }
        throw Error(absl::StrCat("the job could not re-form: ", s.message()));
      }
    }
    const v1::Assignment& a = joined->assignment();
    UseCommunicator(&joined->communicator());
    rank = static_cast<int>(a.rank());
    world_size = static_cast<int>(a.world_size());
    const int source = static_cast<int>(a.source_rank());
    try {
      if (ddp) ddp->rejoin(source);
      TakeUpState(source);
      saw_end = false;
      break;
    } catch (const Error& e) {
      // Another rank lost while taking up the state: go round again.
      if (!joined->ended() || absl::Now() >= deadline) throw;
      DDP_LOG(Warning) << "re-forming again: " << e.what();
    }
  }
  LogGenerationStart();
  DDP_LOG(Info) << "re-formed into generation " << joined->assignment().generation() << " as rank "
                << rank << " of " << world_size << " at step " << committed.step << " (epoch "
                << committed.epoch << ", cursor " << committed.cursor << ") after: " << why;
}

void Session::Impl::AtSamplersStepBoundary() {
  state_ended_pass = false;
  AtStepBoundary();
  if (!state_ended_pass) return;
  skip_cut_short = true;
  DDP_LOG(Info) << "the state taken up ends this pass: the program's next collective before the "
                   "next batch is skipped (the other ranks' was cut short by the re-formation)";
}

bool Session::Impl::SkipsCutShortCollective() {
  if (!skip_cut_short) return false;
  skip_cut_short = false;
  DDP_LOG(Warning) << "a collective of the program's own skipped: the other ranks had it cut short "
                      "by the re-formation; it keeps this rank's values";
  return true;
}

void Session::Impl::OnBatch(const std::vector<size_t>& batch, uint64_t epoch) {
  skip_cut_short = false;
  LogBatch(batch, epoch);
}

bool Session::Impl::OpenIndexLog() {
  if (!index_log_looked_up) {
    index_log_looked_up = true;
    const char* path = std::getenv("DDP_INDEX_LOG");
    if (path != nullptr && *path != '\0') {
      absl::StatusOr<LineFile> file = LineFile::Open(path);
      if (file.ok()) index_log.emplace(std::move(*file));
      if (!file.ok()) DDP_LOG(Warning) << file.status().message();
    }
  }
  return index_log.has_value();
}

void Session::Impl::LogGenerationStart() {
  if (!OpenIndexLog() || !joined) return;
  // Where the new generation goes on from: earlier lines of later steps
  // were undone.
  index_log->Append(absl::StrFormat(
      "{\"job\": \"%s\", \"generation\": %d, \"rank\": %d, \"world_size\": %d, "
      "\"starts_after_step\": %d, \"note\": \"generation start: earlier lines of steps after %d "
      "were not committed\"}",
      joined->assignment().job_id(), joined->assignment().generation(), rank, world_size,
      committed.step, committed.step));
}

void Session::Impl::LogBatch(const std::vector<size_t>& batch, uint64_t epoch) {
  if (!OpenIndexLog()) return;
  const uint64_t generation = joined ? joined->assignment().generation() : 0;
  const std::string job = joined ? joined->assignment().job_id() : "";
  // The step this batch belongs to: the next one to commit.
  index_log->Append(absl::StrFormat(
      "{\"job\": \"%s\", \"generation\": %d, \"rank\": %d, \"world_size\": %d, \"step\": %d, "
      "\"epoch\": %d, \"indices\": [%s]}",
      job, generation, rank, world_size, committed.step + 1, epoch, absl::StrJoin(batch, ",")));
}

void Session::Impl::TakeUpState(int source) {
  const StateParts parts = ElasticParts();
  absl::StatusOr<std::string> mine = absl::UnavailableError("not the source");
  if (rank == source) mine = offered ? *offered : EncodeState();
  absl::StatusOr<std::string> bytes = absl::UnknownError("not moved");
  if (absl::Status s = check->Agree(Collective{CollectiveKind::kState, 0, 0, source}); !s.ok()) {
    bytes = s;
  } else {
    bytes = BroadcastState(*comm, source, std::move(mine), MaxEncodedStateBytes(parts));
  }
  if (!bytes.ok()) {
    throw Error(Explain(bytes.status(), absl::StrCat("taking up rank ", source, "'s state")));
  }
  // The source too: it undoes what its optimizer did with a dropped step.
  absl::StatusOr<v1::TrainingStateHeader> header =
      DecodeTrainingState(*bytes, ElasticIdentity(), parts);
  if (!header.ok()) {
    throw Error(
        absl::StrCat("can't take up rank ", source, "'s state: ", header.status().message()));
  }
  if (elastic->load) elastic->load(header->program_state());
  committed = ProgressOf(*header);
  offered.reset();
  reported_steps = committed.step;
  if (sampler) {
    state_ended_pass = sampler->reposition(committed.epoch, committed.cursor, rank, world_size);
  }
  joined->SetCommitted(committed.step, committed.epoch, committed.cursor);
  if (ddp) ddp->zero_grads();
}

namespace {

// The elastic module's parameters or buffers, whichever kind it is.
std::vector<NamedTensor> ElasticTensors(const Session::ElasticState& state, bool buffers) {
  std::vector<NamedTensor> out;
  if (state.module) {
    for (const auto& t :
         buffers ? state.module->named_buffers() : state.module->named_parameters()) {
      out.emplace_back(t.key(), t.value());
    }
  } else if (buffers) {
    for (const auto& t : state.script_module->named_buffers()) out.emplace_back(t.name, t.value);
  } else {
    for (const auto& t : state.script_module->named_parameters()) out.emplace_back(t.name, t.value);
  }
  return out;
}

}  // namespace

StateIdentity Session::Impl::ElasticIdentity() const {
  const v1::Assignment& a = joined->assignment();
  return StateIdentity{a.job_id(), SpecDigest(a.spec())};
}

StateParts Session::Impl::ElasticParts() const {
  // Values only, copied in place: a parameter replaced (as Module::load
  // would set_() it) would no longer run the reducer's gradient hooks. The
  // RNG is the program's own.
  return StateParts{ElasticTensors(*elastic, false), ElasticTensors(*elastic, true),
                    elastic->optimizer, /*rng=*/false};
}

absl::StatusOr<std::string> Session::Impl::EncodeState() {
  const v1::Assignment& a = joined->assignment();
  v1::TrainingStateHeader header =
      StateHeader(ElasticIdentity(), committed, a.generation(), a.world_size());
  if (elastic->save) header.set_program_state(elastic->save());
  return EncodeTrainingState(std::move(header), ElasticParts());
}

void Session::set_elastic_state(ElasticState state) {
  if (!state.module == (state.script_module == nullptr)) {
    throw Error("set_elastic_state: give the module, or a TorchScript script_module (one of them)");
  }
  if (impl_->elastic) throw Error("set_elastic_state: call it once");
  if (!impl_->joined) return;  // nothing re-forms without a coordinator
  // Only with a coordinator: a torchrun-started program's optimizer never
  // travels, whatever its kind.
  if (absl::Status s = state_records::CheckOptimizerCarried(state.optimizer); !s.ok()) {
    throw Error(absl::StrCat("set_elastic_state: ", s.message()));
  }
  impl_->elastic = std::move(state);
  impl_->joined->set_elastic(true);
  const v1::Assignment& a = impl_->joined->assignment();
  // Started into a running job: take up the state the others hold.
  if (a.state_source() != v1::STATE_SOURCE_FRESH) {
    impl_->TakeUpState(static_cast<int>(a.source_rank()));
    DDP_LOG(Info) << "took up rank " << a.source_rank() << "'s state at step "
                  << impl_->committed.step << " (epoch " << impl_->committed.epoch << ")";
  }
}

}  // namespace ddp
