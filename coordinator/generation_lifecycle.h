// Where the job stands between generations, beside the generations
// themselves (GenerationManager): members told to leave and not yet gone,
// a running generation pausing at a step boundary to admit joiners, a
// restored generation waiting for its members to come back after a
// coordinator restart, since when a quorum has been free, since when the
// job recovers, when a generation last formed, and who the last one's
// members were. Methods are named for what happened; what to do about it
// is decided in reform_policy.h, from the inputs this object fills in.
//
// Not thread-safe: the Coordinator holds it under its own lock.
#ifndef DDP_COORDINATOR_GENERATION_LIFECYCLE_H_
#define DDP_COORDINATOR_GENERATION_LIFECYCLE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "common/clock.h"
#include "coordinator/reform_policy.h"

namespace ddp {

class GenerationLifecycle {
 public:
  explicit GenerationLifecycle(const Clock* clock) : clock_(clock) {}

  // A new job: nothing of the last job's generations counts any more.
  void StartJob();
  // The coordinator did not run or did not hear for `paused`: no deadline
  // here runs out for it.
  void Grace(absl::Duration paused);
  // The job's inputs to DecideFormation: leaving members, quorum_since,
  // recovering_since and last_formed_at.
  void FillFormationInput(FormationInput* in) const;

  // ---- Forming and ending.

  // A generation formed now: nobody is leaving the last one any more, and
  // the next quorum is counted afresh.
  void Formed();
  // `members` were the last generation's (it ended, or was saved before a
  // restart).
  void RememberMembers(std::vector<std::string> members) { last_members_ = std::move(members); }
  // The job recovers from now (its generation ended, or the coordinator
  // restarted).
  void BeginRecovery() { recovering_since_ = clock_->Now(); }
  // Whether `worker_id` was a member of the generation that ended last.
  bool WasLastMember(const std::string& worker_id) const;
  // New to a running job, holding a state that never trained: a joiner.
  bool IsJoiner(const Candidate& candidate) const;
  const std::vector<std::string>& last_members() const { return last_members_; }

  // ---- A quorum before the first generation.

  // Whether min_workers are free now: the settle window starts when they
  // first are, and starts over once they are not.
  void NoteQuorum(bool has_quorum);

  // ---- Members told to leave the generation that ended.

  // Told to leave now (a member already told keeps its first time).
  void ToldToLeave(const std::string& worker_id) { leaving_.emplace(worker_id, clock_->Now()); }
  // When the Coordinator last weighed forming a generation (it rations how
  // often it does for jobs of thousands of workers).
  absl::Time formation_checked_at() const { return formation_checked_at_; }
  void set_formation_checked_at(absl::Time at) { formation_checked_at_ = at; }
  // It left (or is gone).
  void Left(const std::string& worker_id) { leaving_.erase(worker_id); }
  void ClearLeaving() { leaving_.clear(); }
  bool anyone_leaving() const { return !leaving_.empty(); }
  // Removes those told more than `limit` ago, and returns each with how
  // long ago it was told.
  std::vector<std::pair<std::string, absl::Duration>> TakeOverdueLeavers(absl::Duration limit);

  // ---- Admitting joiners at a step boundary.

  bool admitting() const { return admitting_; }
  // The members were asked now to leave at the next step boundary.
  void BeginAdmitting();
  void EndAdmitting() { admitting_ = false; }
  // A member ended a phase with a bound of its own (an evaluation): the
  // members reach a step boundary a step after it, so the wait counts from
  // now.
  void BoundedPhaseEnded();
  // Admitting, and the members have not all left at a step boundary within
  // `limit`.
  bool AdmittingOverdue(absl::Duration limit) const;

  // ---- Adopting a generation restored after a coordinator restart.

  bool adopting() const { return adoption_.has_value(); }
  // The restored generation waits for its members until `deadline`.
  void BeginAdoption(absl::Time deadline);
  // A member came back claiming its rank.
  void MemberReturned(const std::string& worker_id);
  // A member came back having left the generation.
  void MemberReturnedIdle();
  // Adopting, and `worker_id` has not come back yet.
  bool AwaitingReturn(const std::string& worker_id) const;
  // The inputs to DecideAdoption for a generation of `members` members.
  AdoptionInput AdoptionState(uint32_t members) const;
  // Of `members`, those that have not come back.
  std::vector<std::string> NotReturned(const std::vector<std::string>& members) const;
  // Every member came back: the generation goes on, counted as formed now.
  void Adopted();
  // The restored generation is over (given up, faulted, the job ended).
  void EndAdoption() { adoption_.reset(); }

 private:
  struct AdoptionWindow {
    absl::Time deadline;
    std::set<std::string> returned;
    uint32_t returned_idle = 0;
  };

  const Clock* clock_;
  // Members told to leave the last generation who have not said they left,
  // with when they were told.
  std::map<std::string, absl::Time> leaving_;
  // The running generation's members were asked to leave at a step
  // boundary, since admitting_since_.
  bool admitting_ = false;
  absl::Time admitting_since_;
  std::optional<AdoptionWindow> adoption_;
  // Since when min_workers have been free (first generation's settle window).
  std::optional<absl::Time> quorum_since_;
  absl::Time recovering_since_;
  absl::Time last_formed_at_;
  absl::Time formation_checked_at_ = absl::InfinitePast();
  // Members of the last generation that ended, for the change log.
  std::vector<std::string> last_members_;
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_GENERATION_LIFECYCLE_H_
