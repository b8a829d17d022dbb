#include "worker/data/skipping_source.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace ddp {
namespace {

// Names waiting to be reported; beyond, bad samples are only counted.
constexpr size_t kMaxPendingNames = 1024;

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

int64_t SkippingSource::Replacement(int64_t index, int attempt, size_t size) {
  const uint64_t mixed =
      SplitMix64(static_cast<uint64_t>(index) * 0x100000001b3ull + static_cast<uint64_t>(attempt));
  return static_cast<int64_t>(mixed % size);
}

void SkippingSource::NoteBad(int64_t index, const absl::Status& error) const {
  absl::MutexLock lock(&mu_);
  if (bad_.insert(index).second && pending_names_.size() < kMaxPendingNames) {
    pending_names_.emplace_back(error.message());
  }
}

absl::StatusOr<int64_t> SkippingSource::Read(int64_t index, uint64_t epoch, float* out) const {
  absl::StatusOr<int64_t> label = inner_->Read(index, epoch, out);
  if (label.ok()) return label;
  NoteBad(index, label.status());
  absl::Status last = label.status();
  for (int attempt = 1; attempt <= kMaxReplacements; ++attempt) {
    const int64_t candidate = Replacement(index, attempt, size());
    label = inner_->Read(candidate, epoch, out);
    if (label.ok()) {
      absl::MutexLock lock(&mu_);
      ++replaced_;
      return label;
    }
    NoteBad(candidate, label.status());
    last = label.status();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "sample ", index, " and the ", kMaxReplacements,
      " samples tried in its place are all bad (is most of the dataset unreadable?); the last: ",
      last.message()));
}

absl::Status SkippingSource::Check(int64_t index) const {
  absl::Status last = inner_->Check(index);
  for (int attempt = 1; !last.ok() && attempt <= kMaxReplacements; ++attempt) {
    const absl::Status tried = inner_->Check(Replacement(index, attempt, size()));
    if (tried.ok()) return tried;
    last = tried;
  }
  if (last.ok()) return last;
  return absl::InvalidArgumentError(absl::StrCat(
      "sample ", index, " and the ", kMaxReplacements,
      " samples tried in its place are all bad (is most of the dataset unreadable?); the last: ",
      last.message()));
}

SkippingSource::Skipped SkippingSource::Take(size_t max_named) const {
  absl::MutexLock lock(&mu_);
  Skipped taken;
  taken.replaced = std::exchange(replaced_, 0);
  while (!pending_names_.empty() && taken.newly_bad.size() < max_named) {
    taken.newly_bad.push_back(std::move(pending_names_.front()));
    pending_names_.pop_front();
  }
  return taken;
}

}  // namespace ddp
