// The coordinator's durable state in --state-dir: one file, replaced
// atomically (write a temporary, fsync, rename), so a crash leaves either
// the old state or the new one.
//
// Thread-safe.
#ifndef DDP_COORDINATOR_STATE_STORE_H_
#define DDP_COORDINATOR_STATE_STORE_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "ddp/v1/state.pb.h"

namespace ddp {

class StateStore {
 public:
  // Creates `dir` if needed. FAILED_PRECONDITION if it can't be written.
  static absl::StatusOr<std::unique_ptr<StateStore>> Open(const std::string& dir);

  // The saved state, or nullopt in a fresh directory. DATA_LOSS if the file
  // is unreadable.
  absl::StatusOr<std::optional<v1::DurableState>> Load() const;

  // Saves `state` as version `sequence`; an older sequence than the last
  // saved one is skipped, so concurrent savers can't go back in time.
  absl::Status Save(const v1::DurableState& state, uint64_t sequence);

  const std::string& path() const { return path_; }

 private:
  explicit StateStore(std::string path) : path_(std::move(path)) {}
  const std::string path_;
  absl::Mutex mu_;
  uint64_t saved_sequence_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_STATE_STORE_H_
