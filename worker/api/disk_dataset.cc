#include "ddp/disk_dataset.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/job_kinds.h"
#include "common/job_spec.h"
#include "ddp/distributed_sampler.h"
#include "ddp/error.h"
#include "worker/data/disk_source.h"
#include "worker/data/pack_index.h"
#include "worker/data/skipping_source.h"
#include "worker/sample_batches.h"

namespace ddp {
namespace {

// The program's own files, read as it reads any: no pins (a job's are made
// by the coordinator's check).
absl::StatusOr<std::string> ReadIndex(absl::string_view field, const std::string& path) {
  absl::StatusOr<std::string> bytes = ReadWholeFile(path);
  if (!bytes.ok())
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", bytes.status().message()));
  return bytes;
}

}  // namespace

struct DiskDataset::State {
  v1::DatasetSpec spec;
  uint64_t seed = 0;
  std::shared_ptr<const SampleSource> source;
  std::optional<DistributedSampler> followed;
  mutable absl::Mutex mu;
  uint64_t epoch ABSL_GUARDED_BY(mu) = 0;
  uint64_t skipped ABSL_GUARDED_BY(mu) = 0;
  std::vector<std::string> bad ABSL_GUARDED_BY(mu);

  void TakeSkipped() {
    if (!spec.skip_bad_samples()) return;
    const auto* skipping = dynamic_cast<const SkippingSource*>(source.get());
    if (skipping == nullptr) return;
    SkippingSource::Skipped taken = skipping->Take(1024);
    absl::MutexLock lock(&mu);
    skipped += taken.replaced;
    for (std::string& b : taken.newly_bad) {
      if (bad.size() < 1024) bad.push_back(std::move(b));
    }
  }
};

DiskDataset DiskDataset::FromJson(const std::string& json, uint64_t seed) {
  // Checked as a job's dataset is, defaults included.
  absl::StatusOr<v1::JobSpec> job =
      ParseJobSpecJson(absl::StrCat(R"({"name": "program", "dataset": )", json, "}"), ThisBuild());
  if (!job.ok()) throw Error(std::string(job.status().message()));
  const v1::DatasetKind kind = DatasetKindOf(job->dataset());
  if (kind != v1::DATASET_KIND_IMAGE_FOLDER && kind != v1::DATASET_KIND_SHARDS) {
    throw Error("ddp::DiskDataset reads dataset.kind \"image-folder\" or \"shards\"");
  }
  auto state = std::make_shared<State>();
  state->spec = job->dataset();
  state->seed = seed;
  absl::StatusOr<std::shared_ptr<const SampleSource>> source =
      OpenDiskSource(state->spec, /*test=*/false, seed, DiskInputs{ReadIndex, nullptr});
  if (!source.ok()) throw Error(std::string(source.status().message()));
  state->source = *std::move(source);
  return DiskDataset(std::move(state));
}

DiskDataset DiskDataset::Test() const {
  if (state_->spec.test_path().empty()) throw Error("this dataset names no testPath");
  auto state = std::make_shared<State>();
  state->spec = state_->spec;
  state->seed = state_->seed;
  absl::StatusOr<std::shared_ptr<const SampleSource>> source =
      OpenDiskSource(state->spec, /*test=*/true, state->seed, DiskInputs{ReadIndex, nullptr});
  if (!source.ok()) throw Error(std::string(source.status().message()));
  state->source = *std::move(source);
  return DiskDataset(std::move(state));
}

void DiskDataset::follow(const DistributedSampler& sampler) { state_->followed = sampler; }

void DiskDataset::set_epoch(uint64_t epoch) {
  absl::MutexLock lock(&state_->mu);
  state_->epoch = epoch;
}

torch::data::Example<> DiskDataset::get_batch(std::vector<size_t> indices) {
  uint64_t epoch = 0;
  if (state_->followed.has_value()) {
    epoch = state_->followed->epoch();
  } else {
    absl::MutexLock lock(&state_->mu);
    epoch = state_->epoch;
  }
  const std::vector<int64_t> wanted(indices.begin(), indices.end());
  absl::StatusOr<Batch> batch = ReadSampleBatch(*state_->source, wanted, epoch,
                                                static_cast<int>(state_->spec.loader_threads()));
  state_->TakeSkipped();
  if (!batch.ok()) throw Error(std::string(batch.status().message()));
  return {batch->x, batch->y};
}

torch::optional<size_t> DiskDataset::size() const { return state_->source->size(); }

const std::vector<std::string>& DiskDataset::classes() const { return state_->source->classes(); }

std::vector<int64_t> DiskDataset::sample_shape() const { return state_->source->sample_shape(); }

uint64_t DiskDataset::samples_skipped() const {
  absl::MutexLock lock(&state_->mu);
  return state_->skipped;
}

std::vector<std::string> DiskDataset::bad_samples() const {
  absl::MutexLock lock(&state_->mu);
  return state_->bad;
}

}  // namespace ddp
