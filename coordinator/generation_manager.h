// Generations: numbered rounds of training, each with its members in rank
// order and the state it starts from. Which generation is current, and the
// numbering that fences everything a worker says (numbers only grow, across
// jobs and coordinator restarts). When to form one, and with whom, is
// decided in reform_policy.h.
//
// Not thread-safe: the Coordinator calls it under its own lock.
#ifndef DDP_COORDINATOR_GENERATION_MANAGER_H_
#define DDP_COORDINATOR_GENERATION_MANAGER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "coordinator/rank_assignment.h"
#include "coordinator/reform_policy.h"
#include "ddp/v1/state.pb.h"

namespace ddp {

struct Generation {
  uint64_t number = 0;
  // Rank r is members[r].
  std::vector<RankCandidate> members;
  // Rank r's capability for this generation's rendezvous store: 128 random
  // bits, made when the generation forms, sent only in r's Assignment.
  std::vector<std::string> store_tokens;
  // The state it starts from, as the coordinator expects it.
  SourceChoice source;
  double lr = 0;
  // Every member runs on one machine (shared memory is possible).
  bool single_machine = false;
  // Why not every member has a GPU of its own (WhyNotOwnGpus); empty when
  // each has: "auto" may then pick NCCL.
  std::string why_not_own_gpus;
  absl::Time formed_at;
  // Members that joined the job with this generation holding no trained
  // state: a fault before it trains re-forms without waiting for them to
  // leave (they hold nothing the others lack). Not saved across restarts.
  absl::flat_hash_set<std::string> joiners;

  // Worker id -> rank, so that looking a worker up costs the same at 4,096
  // members as at 2 (the status snapshot does it for every worker).
  absl::flat_hash_map<std::string, int> rank_of;
  // First rank of each machine (a run of consecutive members with one
  // machine_id; a member without one is a machine of its own), then the
  // world size.
  std::vector<int> machine_starts;

  // The member's rank, or -1.
  int RankOf(const std::string& worker_id) const;
  // Fills rank_of and machine_starts from members.
  void IndexMembers();
  // Which machine rank `rank` is on (an index into machine_starts), how many
  // ranks machine `m` holds, and the most any machine holds.
  int MachineOf(int rank) const;
  int MachineSize(int m) const { return machine_starts[m + 1] - machine_starts[m]; }
  int LargestMachine() const;
  std::vector<std::string> MemberIds() const;
};

class GenerationManager {
 public:
  explicit GenerationManager(const Clock* clock) : clock_(clock) {}

  // Makes the next generation current: `members` in rank order, `joiners`
  // among them (see Generation::joiners).
  const Generation& Form(std::vector<RankCandidate> members, const SourceChoice& source, double lr,
                         absl::flat_hash_set<std::string> joiners = {});

  // The generation in progress, or null.
  const Generation* current() const { return current_ ? &*current_ : nullptr; }
  // The generation in progress, else the one that ended last (operators
  // still want to see who had which rank), or null.
  const Generation* last() const { return last_ ? &*last_ : nullptr; }
  // Whether `number` is the generation in progress.
  bool IsCurrent(uint64_t number) const { return current_ && current_->number == number; }
  // Number of the latest generation formed, 0 before the first.
  uint64_t latest() const { return latest_; }

  // After a restart: the next generation is numbered after `latest` (never
  // lowers it).
  void RestoreLatest(uint64_t latest) { latest_ = std::max(latest_, latest); }
  // After a restart: `saved` is current again, waiting to be adopted.
  void RestoreCurrent(const v1::DurableGeneration& saved);
  // The current generation for the durable state.
  void FillDurable(v1::DurableGeneration* out) const;

  // The current generation is over (finished or aborted).
  void EndCurrent() { current_.reset(); }

 private:
  const Clock* clock_;
  std::optional<Generation> current_;
  std::optional<Generation> last_;
  uint64_t latest_ = 0;
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_GENERATION_MANAGER_H_
