// A StateStore in memory whose saves a test holds back and fails at will:
// what a slow disk, a full one, or an etcd that refuses the write looks
// like to the coordinator.
#ifndef DDP_TESTS_UNIT_GATED_STORE_H_
#define DDP_TESTS_UNIT_GATED_STORE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/state_store.h"

namespace ddp {

class GatedStore final : public StateStore {
 public:
  // Open: saves go through at once. Closed: each waits for Open().
  explicit GatedStore(bool open = true) : open_(open) {}

  absl::StatusOr<std::optional<v1::DurableState>> Load() const override {
    absl::MutexLock lock(&mu_);
    return state_;
  }
  absl::Status Save(const v1::DurableState& state, uint64_t sequence) override {
    absl::MutexLock lock(&mu_);
    ++entered_;
    mu_.Await(absl::Condition(&open_));
    if (fail_) return absl::FailedPreconditionError("disk full");
    saved_.push_back(sequence);
    state_ = state;
    return absl::OkStatus();
  }
  std::string Describe() const override { return "the gated store"; }

  void Open() {
    absl::MutexLock lock(&mu_);
    open_ = true;
  }
  void Close() {
    absl::MutexLock lock(&mu_);
    open_ = false;
  }
  // Every save from now fails (or, false, succeeds again).
  void Fail(bool fail = true) {
    absl::MutexLock lock(&mu_);
    fail_ = fail;
  }
  // Waits until `n` saves have begun.
  void AwaitSaves(int n) {
    absl::MutexLock lock(&mu_);
    struct Arg {
      const GatedStore* store;
      int n;
    } arg{this, n};
    mu_.Await(absl::Condition(
        +[](Arg* a) ABSL_NO_THREAD_SAFETY_ANALYSIS { return a->store->entered_ >= a->n; }, &arg));
  }
  // The versions saved, in order.
  std::vector<uint64_t> saved() const {
    absl::MutexLock lock(&mu_);
    return saved_;
  }

 private:
  mutable absl::Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_);
  bool fail_ ABSL_GUARDED_BY(mu_) = false;
  int entered_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<uint64_t> saved_ ABSL_GUARDED_BY(mu_);
  std::optional<v1::DurableState> state_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ddp

#endif  // DDP_TESTS_UNIT_GATED_STORE_H_
