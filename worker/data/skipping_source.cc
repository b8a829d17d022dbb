#include "worker/data/skipping_source.h"

#include <utility>

#include "absl/functional/function_ref.h"
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

absl::StatusOr<int> SkippingSource::FirstGood(int64_t index,
                                              absl::FunctionRef<absl::Status(int64_t)> try_sample,
                                              bool note_bad) const {
  absl::Status last;
  for (int attempt = 0; attempt <= kMaxReplacements; ++attempt) {
    const int64_t candidate = attempt == 0 ? index : Replacement(index, attempt, size());
    last = try_sample(candidate);
    if (last.ok()) return attempt;
    if (note_bad) NoteBad(candidate, last);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "sample ", index, " and the ", kMaxReplacements,
      " samples tried in its place are all bad (is most of the dataset unreadable?); the last: ",
      last.message()));
}

absl::StatusOr<int64_t> SkippingSource::Read(int64_t index, uint64_t epoch, float* out) const {
  int64_t label = 0;
  absl::StatusOr<int> good = FirstGood(
      index,
      [&](int64_t i) {
        absl::StatusOr<int64_t> read = inner_->Read(i, epoch, out);
        if (read.ok()) label = *read;
        return read.status();
      },
      /*note_bad=*/true);
  if (!good.ok()) return good.status();
  if (*good > 0) {
    absl::MutexLock lock(&mu_);
    ++replaced_;
  }
  return label;
}

absl::Status SkippingSource::Check(int64_t index) const {
  return FirstGood(
             index, [&](int64_t i) { return inner_->Check(i); }, /*note_bad=*/false)
      .status();
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
