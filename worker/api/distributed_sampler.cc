#include "ddp/distributed_sampler.h"

#include <algorithm>

#include <torch/serialize/archive.h>

#include "absl/strings/str_cat.h"
#include "common/sampler.h"
#include "ddp/error.h"
#include "ddp/session.h"
#include "worker/api/session_impl.h"

namespace ddp {

struct DistributedSampler::State {
  // (epoch, cursor) once the indices handed out so far are trained.
  std::pair<uint64_t, uint64_t> Position() const {
    if (!started) return {next_epoch, std::min(cursor, sampler.dataset_size)};
    if (position >= indices.size()) return {sampler.epoch + 1, 0};
    return {sampler.epoch, start + sampler.world_size * position};
  }
  // Elastic: go on from (epoch, cursor) in a world of `world` ranks.
  bool Reposition(uint64_t epoch, uint64_t at, int rank, int world) {
    sampler.rank = static_cast<uint32_t>(rank);
    sampler.world_size = static_cast<uint32_t>(world);
    if (!started) {
      // Not iterated yet (a program started into the job): its loader's
      // first reset() begins there.
      next_epoch = epoch;
      cursor = at;
      return false;
    }
    if (epoch > sampler.epoch) {
      // This epoch is over where the state came from: end it here too, so
      // that the program's loop moves on with the others.
      indices.clear();
      position = 0;
      next_epoch = epoch;
      cursor = at;
      return true;
    }
    sampler.epoch = epoch;
    next_epoch = epoch + 1;
    start = std::min(at, sampler.dataset_size);
    indices = ElasticSamplerIndices(sampler, start);
    position = 0;
    cursor = 0;
    started = true;
    return false;
  }

  SamplerOptions sampler;
  uint64_t next_epoch = 0;
  // Where the next reset()'s epoch starts, and where the current one did.
  uint64_t cursor = 0;
  uint64_t start = 0;
  bool started = false;
  std::vector<int64_t> indices;
  size_t position = 0;
  // The session made with, for its step boundaries (null: none).
  std::shared_ptr<SessionGate> gate;
};

DistributedSampler::DistributedSampler(size_t dataset_size, int rank, int world_size,
                                       Options options)
    : state_(std::make_shared<State>()) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw Error(absl::StrCat("DistributedSampler: rank ", rank, " of world size ", world_size,
                             ": the rank must be in [0, world size)"));
  }
  state_->sampler.dataset_size = dataset_size;
  state_->sampler.seed = options.seed;
  state_->sampler.rank = static_cast<uint32_t>(rank);
  state_->sampler.world_size = static_cast<uint32_t>(world_size);
  state_->sampler.shuffle = options.shuffle;
  state_->sampler.drop_last = options.drop_last;
  state_->sampler.epoch = options.epoch;
  state_->next_epoch = options.epoch;
}

DistributedSampler::DistributedSampler(size_t dataset_size, const Session& session, Options options)
    : DistributedSampler(dataset_size, session.rank(), session.world_size(), options) {
  Session::Impl& s = *session.impl_;
  state_->gate = s.gate;
  std::weak_ptr<State> weak = state_;
  s.sampler = SamplerLink{[weak] {
                            auto state = weak.lock();
                            return state ? state->Position() : std::pair<uint64_t, uint64_t>{0, 0};
                          },
                          [weak](uint64_t epoch, uint64_t cursor, int rank, int world) {
                            auto state = weak.lock();
                            return state && state->Reposition(epoch, cursor, rank, world);
                          }};
}

void DistributedSampler::set_epoch(uint64_t epoch) { state_->next_epoch = epoch; }

uint64_t DistributedSampler::epoch() const {
  return state_->started ? state_->sampler.epoch : state_->next_epoch;
}

void DistributedSampler::set_cursor(uint64_t cursor) { state_->cursor = cursor; }

size_t DistributedSampler::size() const {
  const State& s = *state_;
  if (s.started) return s.indices.size();
  return SamplesPerRankFrom(s.sampler.dataset_size, std::min(s.cursor, s.sampler.dataset_size),
                            s.sampler.world_size, s.sampler.drop_last);
}

void DistributedSampler::reset(torch::optional<size_t> new_size) {
  State& s = *state_;
  if (new_size) s.sampler.dataset_size = *new_size;
  s.sampler.epoch = s.next_epoch;
  s.next_epoch = s.sampler.epoch + 1;
  s.started = true;
  s.start = std::min(s.cursor, s.sampler.dataset_size);
  s.indices = ElasticSamplerIndices(s.sampler, s.start);
  s.cursor = 0;  // a cursor is for one epoch
  s.position = 0;
}

torch::optional<std::vector<size_t>> DistributedSampler::next(size_t batch_size) {
  State& s = *state_;
  if (batch_size == 0) return torch::nullopt;
  Session::Impl* session = s.gate ? s.gate->impl : nullptr;
  // A step boundary: where a job that lost or gained a rank re-forms, once
  // this rank saw the generation end in a collective (Session::Impl::SawEnd).
  // Not the call that ends a pass, as a rule: the program's end-of-epoch
  // code (an all-reduce of its loss, say) runs in the generation that
  // trained the epoch, since a joiner starts at the next one and never runs
  // it; a generation ended there re-forms in that code's collective.
  // Unless the pass's last step was dropped (a rank lost in it): then the
  // pass goes on with that step, trained again in the new generation
  // before anyone's end-of-epoch code, and a joiner starts there too.
  const bool more = s.position < s.indices.size();
  if (session &&
      ((more && session->SawEnd()) || (s.started && session->DroppedStepIn(s.sampler.epoch)))) {
    session->AtSamplersStepBoundary();
  }
  if (s.position >= s.indices.size()) return torch::nullopt;
  const size_t n = std::min(batch_size, s.indices.size() - s.position);
  std::vector<size_t> batch(s.indices.begin() + s.position, s.indices.begin() + s.position + n);
  s.position += n;
  if (session) session->OnBatch(batch, s.sampler.epoch);
  return batch;
}

void DistributedSampler::save(torch::serialize::OutputArchive& archive) const {
  const State& s = *state_;
  archive.write("epoch", torch::tensor(static_cast<int64_t>(s.sampler.epoch)));
  archive.write("position", torch::tensor(static_cast<int64_t>(s.position)));
}

void DistributedSampler::load(torch::serialize::InputArchive& archive) {
  torch::Tensor epoch, position;
  archive.read("epoch", epoch);
  archive.read("position", position);
  State& s = *state_;
  s.next_epoch = static_cast<uint64_t>(epoch.item<int64_t>());
  reset();
  s.position = std::min<size_t>(static_cast<size_t>(position.item<int64_t>()), s.indices.size());
}

}  // namespace ddp
