// One leader among coordinators that share their state in etcd, by etcd's
// election recipe: each candidate puts a key under PREFIX/leader/ bound to a
// lease of its own; the key with the lowest create revision leads. A
// candidate watches the prefix (no polling) and looks again at every change.
//
// Safety does not rest on timing: every write of the leader is a
// transaction guarded by Guard() (its key still exists with the create
// revision it was made with, so its lease still holds), which a deposed
// leader's writes fail. Timing only makes the leader stop acting early: it
// acts (IsLeader) until the send time of its newest renewal etcd confirmed
// plus the TTL less a margin, which is before the lease can expire on the
// etcd side (the server counts the TTL from when a renewal arrived).
//
// Renewals go out every TTL/6 whether or not the last ones came back (up to
// kRenewalsInFlight at once, each on a thread of its own), so one renewal
// stuck on a slow etcd member or a starved thread does not hold up the
// next. A leader whose renewals come back late stops acting meanwhile and
// acts again once a newer one is confirmed (an etcd raft election, a loaded
// machine): only etcd saying the lease or the key is gone, or no renewal
// confirmed for twice the TTL, ends the term (Deposed).
//
// Losing leadership is final for this object: the coordinator drops the
// term's memory and campaigns anew (ddp-coordinator re-executes itself).
//
// Thread-safe. The campaign runs on threads of its own (the renewal clock,
// the renewals, and reading the candidates after each change); none of them
// ever waits on the coordinator's lock.
#ifndef DDP_COORDINATOR_LEADER_ELECTION_H_
#define DDP_COORDINATOR_LEADER_ELECTION_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/etcd_client.h"
#include "coordinator/leadership.h"

namespace ddp {

class LeaderElection final : public Leadership {
 public:
  struct Options {
    std::string prefix;  // e.g. "/ddp/default", no trailing '/'
    absl::Duration lease_ttl = absl::Seconds(2);
  };

  // `etcd` and `clock` outlive the election.
  LeaderElection(EtcdClient* etcd, const Clock* clock, Options options);
  // Stop(/*resign=*/false): a leader that goes away without resigning is
  // succeeded when its lease expires; Stop(true) hands over at once.
  ~LeaderElection() override;
  LeaderElection(const LeaderElection&) = delete;
  LeaderElection& operator=(const LeaderElection&) = delete;

  // Grants the lease, enters the candidate key (holding `address`, where
  // clients dial this coordinator) and starts the campaign. UNAVAILABLE
  // when etcd can't be reached (the caller may call it again).
  absl::Status Start(const std::string& address);
  // Blocks until this candidate leads (true), or `timeout` passes or Stop
  // (false).
  bool AwaitLeadership(absl::Duration timeout);
  // Blocks until leadership, once held, is lost (true), or `timeout` passes
  // or Stop (false).
  bool AwaitLoss(absl::Duration timeout);
  // Ends the campaign; with `resign`, revokes the lease so a standby takes
  // over without waiting for it to expire. Idempotent.
  void Stop(bool resign);

  bool IsLeader() const override;
  bool Deposed() const override;
  // Renewals sent and not answered yet, at most.
  static constexpr int kRenewalsInFlight = 3;
  std::string LeaderAddress() const override;
  v1::CoordinatorLeadership Describe() const override;

  // What a write of the leader's must compare: this candidate's key still
  // exists with the create revision it was made with.
  std::vector<EtcdCompare> Guard() const;
  int64_t lease() const;
  // Why leadership was lost ("" while it was not).
  std::string loss_reason() const;
  // Changes of leader this candidate saw (the first leader it saw counts).
  uint64_t leader_changes() const override;
  std::string EtcdTrouble() const override;
  // Why etcd could not be reached before the campaign started (claiming
  // the prefix, say), for the refusals meanwhile.
  void NoteEtcdTrouble(const std::string& why);

 private:
  struct Candidate {
    std::string key, address;
    int64_t create_revision = 0;
    int64_t lease = 0;
  };
  // A new lease and a candidate key under it.
  absl::StatusOr<Candidate> Enter();
  void RenewLoop();
  // One renewal thread: sends what RenewLoop hands it, one at a time.
  void RenewSender();
  // Takes up the answer to the renewal of `lease` sent at `sent`.
  void OnRenewed(int64_t lease, absl::Time sent, const absl::StatusOr<absl::Duration>& renewed,
                 const absl::StatusOr<Candidate>& again) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A leader with no renewal confirmed for twice the TTL gives up.
  bool GaveUpLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CheckGiveUpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Logs a leader's pause (its lease unconfirmed past the margin) as it
  // begins and ends.
  void NotePauseLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ObserveLoop();
  // Watches the candidates from `from_revision` on, in place of the watch
  // there was.
  void ReplaceWatch(int64_t from_revision);
  // Reads the candidates and decides who leads.
  // Returns the revision read at.
  absl::StatusOr<int64_t> Observe();
  void LoseLocked(const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Why a leader whose renewals went unanswered past its margin lost.
  std::string NotRenewed() const;
  bool LeadingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  EtcdClient* const etcd_;
  const Clock* const clock_;
  const Options options_;
  const std::string candidates_prefix_;  // PREFIX/leader/
  const absl::Duration renew_every_;
  // The margin before the lease's end at which a leader stops acting.
  const absl::Duration margin_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  std::string address_ ABSL_GUARDED_BY(mu_);
  bool dirty_ ABSL_GUARDED_BY(mu_) = true;  // the candidates changed since read
  int64_t lease_ ABSL_GUARDED_BY(mu_) = 0;
  std::string key_ ABSL_GUARDED_BY(mu_);
  int64_t create_revision_ ABSL_GUARDED_BY(mu_) = 0;
  // The send time of the newest renewal etcd confirmed.
  absl::Time renewed_at_ ABSL_GUARDED_BY(mu_);
  bool won_ ABSL_GUARDED_BY(mu_) = false;
  std::string lost_ ABSL_GUARDED_BY(mu_);
  // The error of the last renewal or read, "" once one succeeded after it.
  std::string trouble_ ABSL_GUARDED_BY(mu_);
  std::vector<Candidate> candidates_ ABSL_GUARDED_BY(mu_);  // oldest first
  std::string leader_key_ ABSL_GUARDED_BY(mu_);
  absl::Time leader_since_ ABSL_GUARDED_BY(mu_);
  uint64_t leader_changes_ ABSL_GUARDED_BY(mu_) = 0;
  std::unique_ptr<EtcdWatch> watch_ ABSL_GUARDED_BY(mu_);
  bool watch_failed_ ABSL_GUARDED_BY(mu_) = false;
  // A renewal RenewLoop asked for that no sender took yet; senders busy
  // with one; a standby standing again now.
  bool renewal_due_ ABSL_GUARDED_BY(mu_) = false;
  int renewals_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  bool entering_ ABSL_GUARDED_BY(mu_) = false;
  // Since when a leader has not been able to act (its lease unconfirmed).
  std::optional<absl::Time> paused_since_ ABSL_GUARDED_BY(mu_);
  std::thread renewer_, observer_;
  std::vector<std::thread> senders_;
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_LEADER_ELECTION_H_
