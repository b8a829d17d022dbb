// The coordinator's durable state in --state-dir: one file, replaced
// atomically (write a temporary, fsync, rename), so a crash leaves either
// the old state or the new one.
//
// Thread-safe.
#ifndef DDP_COORDINATOR_FILE_STATE_STORE_H_
#define DDP_COORDINATOR_FILE_STATE_STORE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/state_store.h"

namespace ddp {

class FileStateStore final : public StateStore {
 public:
  // Creates `dir` if needed. FAILED_PRECONDITION if it can't be written.
  static absl::StatusOr<std::unique_ptr<FileStateStore>> Open(const std::string& dir);

  // nullopt in a fresh directory.
  absl::StatusOr<std::optional<v1::DurableState>> Load() const override;
  absl::Status Save(const v1::DurableState& state, uint64_t sequence) override;
  std::string Describe() const override { return path_; }

  const std::string& path() const { return path_; }

 private:
  explicit FileStateStore(std::string path) : path_(std::move(path)) {}
  const std::string path_;
  absl::Mutex mu_;
  uint64_t saved_sequence_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_FILE_STATE_STORE_H_
