// Generations: when enough workers are free, a numbered round with members
// in rank order. Decides when to form one (at once with max_workers, or
// after the settle window with min_workers) and which generation is current.
//
// Not thread-safe: the Coordinator calls it under its own lock.
#ifndef DDP_COORDINATOR_GENERATION_MANAGER_H_
#define DDP_COORDINATOR_GENERATION_MANAGER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/clock.h"
#include "coordinator/rank_assignment.h"
#include "ddp/v1/job.pb.h"

namespace ddp {

struct Generation {
  uint64_t number = 0;
  // Rank r is members[r].
  std::vector<RankCandidate> members;
  uint64_t start_epoch = 0;
  uint64_t start_step = 0;
  uint32_t source_rank = 0;
  absl::Time formed_at;

  // The member's rank, or -1.
  int RankOf(const std::string& worker_id) const;
};

class GenerationManager {
 public:
  explicit GenerationManager(const Clock* clock) : clock_(clock) {}

  // Forms the next generation from `free_workers` (attached, idle, able to
  // run the job) when there is no current one and either max_workers are
  // free, or min_workers have been free for the settle window. Takes the
  // first max_workers in rank order. Call whenever the free set may have
  // changed, and periodically so the settle window can end.
  std::optional<Generation> MaybeForm(const v1::JobSpec& spec,
                                      std::vector<RankCandidate> free_workers);

  // The generation in progress, or null.
  const Generation* current() const { return current_ ? &*current_ : nullptr; }
  // The generation in progress, else the one that ended last (operators
  // still want to see who had which rank), or null.
  const Generation* last() const { return last_ ? &*last_ : nullptr; }
  // Whether `number` is the generation in progress.
  bool IsCurrent(uint64_t number) const { return current_ && current_->number == number; }
  // Number of the latest generation formed, 0 before the first. Numbers
  // keep growing across jobs, so a (job, generation) pair is never reused
  // even when a job name is.
  uint64_t latest() const { return latest_; }

  // After a restart: the next generation is numbered after `latest`.
  void RestoreLatest(uint64_t latest) { latest_ = latest; }

  // The current generation is over (finished or aborted).
  void EndCurrent();

 private:
  const Clock* clock_;
  std::optional<Generation> current_;
  std::optional<Generation> last_;
  uint64_t latest_ = 0;
  // When min_workers first became free, while they stay free.
  std::optional<absl::Time> quorum_since_;
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_GENERATION_MANAGER_H_
