// Data read from disk for your own loop, as a job reads it: an image folder
// (torchvision ImageFolder's index, labels and transforms, to the pixel),
// an image folder through its manifest, or ddp-pack's record shards. Made
// from the same JSON as a job's "dataset", so a program and a job train on
// the same samples:
//
//   auto data = ddp::DiskDataset::FromJson(R"({"kind": "image-folder",
//       "path": "/data/train", "loaderThreads": 4,
//       "transforms": [{"kind": "RandomResizedCrop", "size": [224]},
//                      {"kind": "RandomHorizontalFlip"}]})", /*seed=*/1);
//   ddp::DistributedSampler sampler(*data.size(), session);
//   data.follow(sampler);
//   auto loader = torch::data::make_data_loader(data, sampler,
//       torch::data::DataLoaderOptions().batch_size(64));
//
// get_batch reads its samples on loaderThreads threads into one batch
// (x float32 [n, ...], y int64 [n]); nothing else of the data is held, so
// memory does not grow with the dataset. The random transforms draw from
// (seed, epoch, index) alone: the same tensors whatever the threads, and
// after a resume. Copies share their state. Keep the DataLoader's own
// workers at 0 (its default): the reading is already parallel, and a
// followed sampler is read without a lock.
#ifndef DDP_INCLUDE_DDP_DISK_DATASET_H_
#define DDP_INCLUDE_DDP_DISK_DATASET_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/data/datasets/base.h>
#include <torch/data/example.h>

namespace ddp {

class DistributedSampler;

class DiskDataset : public torch::data::datasets::BatchDataset<DiskDataset, torch::data::Example<>,
                                                               std::vector<size_t>> {
 public:
  // `json`: a job spec's "dataset" object of kind "image-folder" or
  // "shards". Throws ddp::Error naming the field or file that is wrong.
  static DiskDataset FromJson(const std::string& json, uint64_t seed = 0);

  // The held-out part (the JSON's testPath, with testTransforms). Throws
  // ddp::Error when it names none.
  DiskDataset Test() const;

  // The epoch of the random transforms follows `sampler`'s (a copy of it
  // shares its state): no set_epoch to forget.
  void follow(const DistributedSampler& sampler);
  // Or set it by hand (ignored while following a sampler).
  void set_epoch(uint64_t epoch);

  // Samples `indices`, in that order. Throws ddp::Error naming a file that
  // can't be read (unless skipBadSamples: then it is replaced).
  torch::data::Example<> get_batch(std::vector<size_t> indices) override;
  torch::optional<size_t> size() const override;

  // Label i names classes()[i].
  const std::vector<std::string>& classes() const;
  // One sample's shape ([3, height, width] for images).
  std::vector<int64_t> sample_shape() const;
  // skipBadSamples: samples replaced so far, and each bad one's error.
  uint64_t samples_skipped() const;
  std::vector<std::string> bad_samples() const;

 private:
  struct State;
  explicit DiskDataset(std::shared_ptr<State> state) : state_(std::move(state)) {}
  std::shared_ptr<State> state_;
};

}  // namespace ddp

#endif  // DDP_INCLUDE_DDP_DISK_DATASET_H_
