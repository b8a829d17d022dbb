// A joined session's elastic side: what each rank holds when a generation
// ends, dropping the step in flight, and taking up the new generation at the
// next step boundary.
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/script.h>
#include <torch/serialize/archive.h>

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "ddp/error.h"
#include "worker/api/session_impl.h"

namespace ddp {

void Session::Impl::OnCommitted() {
  ++committed_step;
  if (sampler) std::tie(committed_epoch, committed_cursor) = sampler->position();
  if (joined) joined->SetCommitted(committed_step, committed_epoch, committed_cursor);
}

bool Session::Impl::VoidStep(const absl::Status& failure) {
  // Misaligned collectives are the program's: re-forming would not help.
  if (!joined || !elastic || IsMisaligned(failure)) return false;
  if (!joined->AwaitEnd(failure, absl::Seconds(options.timeout_seconds))) return false;
  // Nothing has moved since the last committed step yet: keep it, to undo
  // what the optimizer is about to do with these gradients.
  offered = Serialize(committed_step, committed_epoch, committed_cursor);
  if (ddp) ddp->zero_grads();
  DDP_LOG(Warning) << "step " << committed_step + 1 << " dropped: " << joined->ended_reason();
  return true;
}

void Session::Impl::AtStepBoundary() {
  if (!joined || !elastic || !joined->ended()) return;
  const std::string why = joined->ended_reason();
  // What this rank offers, frozen now: a failed attempt below may have
  // overwritten some parameters from another rank.
  if (!offered) offered = Serialize(committed_step, committed_epoch, committed_cursor);
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
      break;
    } catch (const Error& e) {
      // Another rank lost while taking up the state: go round again.
      if (!joined->ended() || absl::Now() >= deadline) throw;
      DDP_LOG(Warning) << "re-forming again: " << e.what();
    }
  }
  DDP_LOG(Info) << "re-formed into generation " << joined->assignment().generation() << " as rank "
                << rank << " of " << world_size << " at step " << committed_step << " (epoch "
                << committed_epoch << ", cursor " << committed_cursor << ") after: " << why;
}

void Session::Impl::TakeUpState(int source) {
  std::string bytes;
  if (rank == source) {
    bytes = offered ? *offered : Serialize(committed_step, committed_epoch, committed_cursor);
  }
  uint64_t size = bytes.size();
  absl::Status s = check->Agree(Collective{CollectiveKind::kState, 0, 0, source});
  if (s.ok()) s = comm->Broadcast(&size, sizeof(size), source);
  if (s.ok()) {
    bytes.resize(size);
    s = comm->Broadcast(bytes.data(), size, source);
  }
  if (!s.ok()) throw Error(Explain(s, absl::StrCat("taking up rank ", source, "'s state")));
  // The source too: it undoes what its optimizer did with a dropped step.
  std::tie(committed_step, committed_epoch, committed_cursor) = Deserialize(bytes);
  offered.reset();
  reported_steps = committed_step;
  if (sampler) sampler->reposition(committed_epoch, committed_cursor, rank, world_size);
  joined->SetCommitted(committed_step, committed_epoch, committed_cursor);
  if (ddp) ddp->zero_grads();
}

namespace {

using Named = std::vector<std::pair<std::string, torch::Tensor>>;

// The elastic module's parameters or buffers, whichever kind it is.
Named ElasticTensors(const Session::ElasticState& state, bool buffers) {
  Named out;
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

std::string Session::Impl::Serialize(uint64_t step, uint64_t epoch, uint64_t cursor) {
  torch::serialize::OutputArchive archive;
  // Values only: Module::load would set_() the parameters, and a parameter
  // set_() that way no longer runs the reducer's gradient hooks.
  for (const auto& [name, t] : ElasticTensors(*elastic, false)) archive.write("p." + name, t);
  for (const auto& [name, t] : ElasticTensors(*elastic, true)) archive.write("b." + name, t);
  if (elastic->optimizer != nullptr) {
    torch::serialize::OutputArchive optimizer;
    elastic->optimizer->save(optimizer);
    archive.write("ddp.optimizer", optimizer);
  }
  if (elastic->save) {
    torch::serialize::OutputArchive extra;
    elastic->save(extra);
    archive.write("ddp.extra", extra);
  }
  archive.write("ddp.progress",
                torch::tensor({static_cast<int64_t>(step), static_cast<int64_t>(epoch),
                               static_cast<int64_t>(cursor)}));
  std::string bytes;
  archive.save_to([&bytes](const void* data, size_t n) {
    bytes.append(static_cast<const char*>(data), n);
    return n;
  });
  return bytes;
}

std::tuple<uint64_t, uint64_t, uint64_t> Session::Impl::Deserialize(const std::string& bytes) {
  torch::serialize::InputArchive archive;
  archive.load_from(bytes.data(), bytes.size());
  {
    torch::NoGradGuard no_grad;
    for (auto& [name, t] : ElasticTensors(*elastic, false)) {
      torch::Tensor value;
      archive.read("p." + name, value);
      t.copy_(value);
    }
    for (auto& [name, t] : ElasticTensors(*elastic, true)) {
      torch::Tensor value;
      archive.read("b." + name, value);
      t.copy_(value);
    }
  }
  if (elastic->optimizer != nullptr) {
    torch::serialize::InputArchive optimizer;
    archive.read("ddp.optimizer", optimizer);
    elastic->optimizer->load(optimizer);
  }
  if (elastic->load) {
    torch::serialize::InputArchive extra;
    archive.read("ddp.extra", extra);
    elastic->load(extra);
  }
  torch::Tensor progress;
  archive.read("ddp.progress", progress);
  auto p = progress.accessor<int64_t, 1>();
  return {static_cast<uint64_t>(p[0]), static_cast<uint64_t>(p[1]), static_cast<uint64_t>(p[2])};
}

void Session::set_elastic_state(ElasticState state) {
  if (!state.module == (state.script_module == nullptr)) {
    throw Error("set_elastic_state: give the module, or a TorchScript script_module (one of them)");
  }
  if (impl_->elastic) throw Error("set_elastic_state: call it once");
  if (!impl_->joined) return;  // nothing re-forms without a coordinator
  impl_->elastic = std::move(state);
  impl_->joined->set_elastic(true);
  const v1::Assignment& a = impl_->joined->assignment();
  // Started into a running job: take up the state the others hold.
  if (a.state_source() != v1::STATE_SOURCE_FRESH) {
    impl_->TakeUpState(static_cast<int>(a.source_rank()));
    DDP_LOG(Info) << "took up rank " << a.source_rank() << "'s state at step "
                  << impl_->committed_step << " (epoch " << impl_->committed_epoch << ")";
  }
}

}  // namespace ddp
