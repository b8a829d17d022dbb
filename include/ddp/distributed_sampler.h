// A torch::data sampler with Python's DistributedSampler order, element for
// element: shuffle the dataset with seed + epoch, pad by wrapping around (or
// drop the tail), and give rank r every world_size-th index from r.
//
// The epoch moves on by itself: every reset() (each time a DataLoader
// begins an iteration) starts the next epoch, so a forgotten set_epoch
// can't repeat last epoch's shuffle. set_epoch() still chooses one.
//
// Copies share their state: keep one and pass a copy to
// torch::data::make_data_loader, and set_epoch/set_cursor on yours reach
// the loader's. Not thread-safe.
#ifndef DDP_INCLUDE_DDP_DISTRIBUTED_SAMPLER_H_
#define DDP_INCLUDE_DDP_DISTRIBUTED_SAMPLER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include <torch/data/samplers/base.h>

namespace ddp {

class Session;

class DistributedSampler : public torch::data::samplers::Sampler<> {
 public:
  struct Options {
    uint64_t seed = 0;
    bool shuffle = true;
    bool drop_last = false;
    // The epoch of the first reset().
    uint64_t epoch = 0;
  };

  // Throws ddp::Error unless 0 <= rank < world_size.
  DistributedSampler(size_t dataset_size, int rank, int world_size, Options options);
  DistributedSampler(size_t dataset_size, int rank, int world_size)
      : DistributedSampler(dataset_size, rank, world_size, Options{}) {}
  // The session's rank and world size.
  DistributedSampler(size_t dataset_size, const Session& session, Options options);
  DistributedSampler(size_t dataset_size, const Session& session)
      : DistributedSampler(dataset_size, session, Options{}) {}

  // The epoch the next reset() starts.
  void set_epoch(uint64_t epoch);
  // The epoch the last reset() started (or the next one's, before any).
  uint64_t epoch() const;
  // Elastic training: the next reset() starts its epoch at `cursor`, the
  // number of leading positions of the epoch's permutation already trained
  // (by any world size); the rest is split among this world as
  // DistributedSampler splits a dataset. 0 is DistributedSampler exactly.
  void set_cursor(uint64_t cursor);
  // Indices this rank gets in the current epoch (its len()).
  size_t size() const;

  // torch::data::samplers::Sampler: reset() starts an epoch (the dataset
  // size may change); next() hands out up to batch_size of this rank's
  // indices, none at the epoch's end.
  void reset(torch::optional<size_t> new_size = torch::nullopt) override;
  torch::optional<std::vector<size_t>> next(size_t batch_size) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace ddp

#endif  // DDP_INCLUDE_DDP_DISTRIBUTED_SAMPLER_H_
