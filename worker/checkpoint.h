// Checkpoint files: encoded training states (state_codec.h) written in the
// background, and the newest usable one found again after every worker
// was lost.
//
// Files in the checkpoint folder:
//   ckpt-<step, 20 digits>.ddpstate          a complete checkpoint
//   .ckpt-<step, 20 digits>.ddpstate.tmp.*   a write in progress (or one
//                                            that crashed: removed later)
// Nothing else in the folder is ever read, written or deleted. One writer
// per folder: a second writer would remove the first one's temporary files.
#ifndef DDP_WORKER_CHECKPOINT_H_
#define DDP_WORKER_CHECKPOINT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "ddp/v1/checkpoint.pb.h"
#include "ddp/v1/worker.pb.h"
#include "worker/elastic/state_codec.h"

namespace ddp {

// The file name of the checkpoint of `step`: "ckpt-00000000000000000042.ddpstate".
std::string CheckpointFileName(uint64_t step);

// Writes checkpoints on its own thread, so that training never waits on the
// disk. Each write goes to a temporary file in the folder, is fsynced,
// renamed to its final name and the folder fsynced: a crash leaves either
// the whole checkpoint or none under the final name. After a write, the
// newest `keep` checkpoints stay (and always the one just written); older
// ones and leftover temporary files are deleted.
//
// Submit may be called from any thread; on_done runs on the writer thread.
class CheckpointWriter {
 public:
  struct Options {
    std::string dir;
    // Checkpoints kept after each write; at least 1.
    uint32_t keep = 3;
    // Told of every write's outcome: path, bytes and seconds, or `error`
    // (which names the file and the OS's reason). Runs on the writer thread
    // after the write is done: a Submit from here on is accepted, and its
    // write starts when on_done returns.
    std::function<void(const v1::CheckpointResult&)> on_done;
    const Clock* clock = RealClock::Get();
  };

  // Creates `dir` (with parents) if missing and checks it is writable by
  // writing and removing a probe file. INVALID_ARGUMENT for an empty dir or
  // keep 0; FAILED_PRECONDITION naming the folder and the OS's reason when
  // it can't be created or written.
  static absl::StatusOr<std::unique_ptr<CheckpointWriter>> Create(Options options);

  // Hands `bytes` (an encoded training state) to the writer thread as the
  // checkpoint of `step`. Never blocks on the disk: returns false, and
  // counts it in refused(), when the previous write is still in progress
  // (submitted, and its on_done not yet called).
  bool Submit(uint64_t generation, uint64_t step, uint64_t epoch, std::string bytes);

  // As Submit, but waits for the write in progress (if any) to finish
  // rather than refuse: for the one checkpoint a job must have (it is being
  // preempted). False only when the writer is stopping.
  bool SubmitWhenIdle(uint64_t generation, uint64_t step, uint64_t epoch, std::string bytes);

  // Submits refused because a write was in progress.
  uint64_t refused() const;

  // Finishes the write in progress, then stops the thread.
  ~CheckpointWriter();

  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

 private:
  struct Job {
    uint64_t generation;
    uint64_t step;
    uint64_t epoch;
    std::string bytes;
  };

  explicit CheckpointWriter(Options options);
  void Loop();
  v1::CheckpointResult Write(const Job& job);

  const Options options_;
  mutable absl::Mutex mu_;
  std::optional<Job> pending_ ABSL_GUARDED_BY(mu_);
  // From Submit until the write is done (before its on_done).
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t refused_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

struct LoadedCheckpoint {
  std::string path;
  std::string bytes;
  v1::TrainingStateHeader header;
  // Newer checkpoints passed over, each as "<path>: <why>".
  std::vector<std::string> skipped;
};

// The newest checkpoint in `dir` whose framing and CRC are good and whose
// identity is `expected`; newer ones that are truncated, corrupt,
// unreadable or another job's are skipped and listed. NOT_FOUND when none
// is usable: the message lists what was skipped, or says the folder is
// missing, unreadable or holds no checkpoint. Files are untrusted: a
// symbolic link, anything but a regular file (a FIFO, /dev/zero) or a file
// over `max_bytes` is skipped without being read. Reads whole files: call
// it off any thread that must not block.
absl::StatusOr<LoadedCheckpoint> LoadNewestCheckpoint(const std::string& dir,
                                                      const StateIdentity& expected,
                                                      uint64_t max_bytes);

}  // namespace ddp

#endif  // DDP_WORKER_CHECKPOINT_H_
