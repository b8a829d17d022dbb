// The coordinator's durable state in --state-dir: one file, replaced
// atomically (write a temporary, fsync, rename, fsync the folder), so a
// crash leaves either the old state or the new one. One coordinator per
// folder: the store holds an flock on its coordinator.lock (which names its
// pid) for as long as it lives, and a second one is refused.
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
  // Creates `dir` if needed. FAILED_PRECONDITION if it can't be written, or
  // if another coordinator (named by its pid) has it open.
  static absl::StatusOr<std::unique_ptr<FileStateStore>> Open(const std::string& dir);
  ~FileStateStore() override;
  FileStateStore(const FileStateStore&) = delete;
  FileStateStore& operator=(const FileStateStore&) = delete;

  // nullopt in a fresh directory.
  absl::StatusOr<std::optional<v1::DurableState>> Load() const override;
  absl::Status Save(const v1::DurableState& state, uint64_t sequence) override;
  std::string Describe() const override { return path_; }

  const std::string& path() const { return path_; }

 private:
  FileStateStore(std::string dir, std::string path, int lock_fd)
      : dir_(std::move(dir)), path_(std::move(path)), lock_fd_(lock_fd) {}
  const std::string dir_;
  const std::string path_;
  // coordinator.lock, flocked.
  const int lock_fd_;
  absl::Mutex mu_;
  uint64_t saved_sequence_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_FILE_STATE_STORE_H_
