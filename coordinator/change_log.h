// The job's generation changes, for operators: when and why each generation
// ended, who left and who joined, which state the next one started from,
// the steps lost and how long training paused. A change opens when a
// generation ends and closes when the next one forms; its pause runs from
// the last step completed before it to the first step completed after it
// (by any later generation: one that never trained pauses on). Both ends
// are kept in the change itself, so a restarted coordinator goes on
// measuring.
//
// Not thread-safe: the Coordinator calls it under its own lock.
#ifndef DDP_COORDINATOR_CHANGE_LOG_H_
#define DDP_COORDINATOR_CHANGE_LOG_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "coordinator/reform_policy.h"
#include "ddp/v1/status.pb.h"

namespace ddp {

class ChangeLog {
 public:
  // Changes kept; older ones are forgotten.
  static constexpr size_t kMaxChanges = 100;

  explicit ChangeLog(const Clock* clock) : clock_(clock) {}

  // Generation `from` ended (0: the job starts) for `cause`. A further fault
  // before the next generation forms joins the open change: its reason is
  // appended, its workers added to `left`, and its cause replaces JOINED.
  void Open(v1::ChangeCause cause, uint64_t from, const std::string& reason,
            const std::vector<std::string>& left);
  bool is_open() const { return open_; }
  // A member of the ended generation left it too (lost or evicted while
  // the change is open): named in the open change's `left`.
  void OnLeft(const std::string& worker_id);

  // The next generation formed with `members` (rank order), from `source`.
  // `previous` are the last generation's members: whoever is not among the
  // new ones left, whoever is new joined.
  void Formed(uint64_t generation, const std::vector<std::string>& members,
              const std::vector<std::string>& previous, const SourceChoice& source);
  // A restarted coordinator adopted `generation`: nothing paused.
  void Adopted(uint64_t generation, const std::vector<std::string>& members, uint64_t step);
  // The new generation's source rank started from `step` (which may differ
  // from what was expected: a corrupt checkpoint falls back to an older
  // one); `detail` says where the state came from.
  void OnStarted(uint64_t generation, uint64_t step, const std::string& detail);
  // A step of `generation` completed: ends the pause of every change it
  // is the first step after. True when one ended (worth saving).
  bool OnStep(uint64_t generation);

  void Restore(const google::protobuf::RepeatedPtrField<v1::GenerationChange>& changes);
  void Fill(google::protobuf::RepeatedPtrField<v1::GenerationChange>* out) const;
  // The newest change, or null.
  const v1::GenerationChange* latest() const {
    return changes_.empty() ? nullptr : &changes_.back();
  }

 private:
  void Push(v1::GenerationChange change);

  const Clock* clock_;
  std::deque<v1::GenerationChange> changes_;
  // The newest change waits for its generation to form.
  bool open_ = false;
  // Some formed change waits for the first step after it.
  bool pausing_ = false;
  // When the job's latest step completed (unset: none since this
  // coordinator started).
  std::optional<absl::Time> last_step_at_;
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_CHANGE_LOG_H_
