#include "coordinator/leader_election.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"

namespace ddp {
namespace {

// How soon a failed renewal or read is tried again.
constexpr absl::Duration kRetry = absl::Milliseconds(100);
// A leader with no renewal confirmed for this many TTLs gives the term up:
// by then etcd has surely let its lease go.
constexpr int kGiveUpTtls = 2;

}  // namespace

LeaderElection::LeaderElection(EtcdClient* etcd, const Clock* clock, Options options)
    : etcd_(etcd),
      clock_(clock),
      options_(std::move(options)),
      candidates_prefix_(absl::StrCat(options_.prefix, "/leader/")),
      // A tenth of the TTL: room for the clocks' rates and the renewal's
      // trip, not for an outage. At the default 2 s the leader stops acting
      // 1.8 s after its last confirmed renewal, with renewals every sixth of
      // the TTL: an etcd member lost (a raft election, about a second) is
      // ridden out.
      renew_every_(options_.lease_ttl / 6),
      margin_(options_.lease_ttl / 10) {}

LeaderElection::~LeaderElection() { Stop(/*resign=*/false); }

absl::StatusOr<LeaderElection::Candidate> LeaderElection::Enter() {
  const absl::Time asked = clock_->Now();
  absl::StatusOr<int64_t> lease = etcd_->LeaseGrant(options_.lease_ttl);
  if (!lease.ok()) return lease.status();
  Candidate me;
  me.lease = *lease;
  {
    absl::MutexLock lock(&mu_);
    me.address = address_;
  }
  me.key = absl::StrFormat("%s%016x", candidates_prefix_, static_cast<uint64_t>(*lease));
  // Created only if absent: the key's create revision is then the
  // transaction's, and names this candidacy for Guard().
  absl::StatusOr<EtcdTxnResult> txn = etcd_->Txn(
      {CreateRevisionIs(me.key, 0)}, {PutOp(me.key, me.address, me.lease)}, {ReadOp(me.key)});
  if (!txn.ok()) return txn.status();
  if (txn->succeeded) {
    me.create_revision = txn->revision;
  } else if (!txn->ranges.empty() && txn->ranges[0].size() == 1 &&
             txn->ranges[0][0].lease == me.lease) {
    // Our own put, applied by a member that timed out and retried on
    // another: the key is ours all the same.
    me.create_revision = txn->ranges[0][0].create_revision;
  } else {
    return absl::InternalError(absl::StrCat("candidate key ", me.key, " exists already"));
  }
  absl::MutexLock lock(&mu_);
  renewed_at_ = asked;
  return me;
}

absl::Status LeaderElection::Start(const std::string& address) {
  {
    absl::MutexLock lock(&mu_);
    if (started_) return absl::FailedPreconditionError("the campaign has started already");
    address_ = address;
  }
  absl::StatusOr<Candidate> me = Enter();
  if (!me.ok()) return me.status();
  absl::MutexLock lock(&mu_);
  started_ = true;
  lease_ = me->lease;
  key_ = me->key;
  create_revision_ = me->create_revision;
  renewer_ = std::thread([this] { RenewLoop(); });
  for (int i = 0; i < kRenewalsInFlight; ++i) senders_.emplace_back([this] { RenewSender(); });
  observer_ = std::thread([this] { ObserveLoop(); });
  DDP_LOG(Info) << "campaigning for leadership as " << address_ << " (key " << key_
                << ", lease TTL " << options_.lease_ttl << ")";
  return absl::OkStatus();
}

void LeaderElection::Stop(bool resign) {
  std::unique_ptr<EtcdWatch> watch;
  int64_t lease = 0;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
    watch = std::move(watch_);
    lease = lease_;
  }
  // Outside the lock: the watch's thread may be waiting for it.
  watch.reset();
  if (renewer_.joinable()) renewer_.join();
  for (std::thread& sender : senders_) sender.join();
  senders_.clear();
  if (observer_.joinable()) observer_.join();
  if (resign && lease != 0) {
    if (absl::Status s = etcd_->LeaseRevoke(lease); !s.ok()) {
      DDP_LOG(Warning) << "couldn't resign (revoke lease " << lease << "): " << s.message()
                       << "; a standby takes over when the lease expires";
    }
  }
}

bool LeaderElection::AwaitLeadership(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  clock_->AwaitWithDeadline(mu_,
                            absl::Condition(
                                +[](LeaderElection* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(e->mu_) {
                                  return e->stopping_ || e->won_;
                                },
                                this),
                            clock_->Now() + timeout);
  return LeadingLocked() && !stopping_;
}

bool LeaderElection::AwaitLoss(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  const absl::Time end = clock_->Now() + timeout;
  auto over = +[](LeaderElection* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(e->mu_) {
    return e->stopping_ || !e->lost_.empty();
  };
  while (true) {
    // Wakes when the give-up time comes, too: the term ends then even if no
    // renewal came back to say so (etcd unreachable, or this process was
    // paused).
    absl::Time deadline = end;
    if (won_) deadline = std::min(deadline, renewed_at_ + kGiveUpTtls * options_.lease_ttl);
    clock_->AwaitWithDeadline(mu_, absl::Condition(over, this), deadline);
    CheckGiveUpLocked();
    if (!lost_.empty()) return true;
    if (stopping_) return false;
    if (clock_->Now() >= end) return false;
  }
}

bool LeaderElection::GaveUpLocked() const {
  return won_ && clock_->Now() >= renewed_at_ + kGiveUpTtls * options_.lease_ttl;
}

void LeaderElection::CheckGiveUpLocked() {
  if (lost_.empty() && GaveUpLocked()) LoseLocked(NotRenewed());
}

bool LeaderElection::Deposed() const {
  absl::MutexLock lock(&mu_);
  return (won_ && !lost_.empty()) || GaveUpLocked();
}

bool LeaderElection::LeadingLocked() const {
  return won_ && lost_.empty() && clock_->Now() < renewed_at_ + options_.lease_ttl - margin_;
}

bool LeaderElection::IsLeader() const {
  absl::MutexLock lock(&mu_);
  return LeadingLocked();
}

std::string LeaderElection::LeaderAddress() const {
  absl::MutexLock lock(&mu_);
  if (candidates_.empty()) return "";
  const Candidate& front = candidates_.front();
  // A leader that lost its lease names no one: the next one is not known
  // until etcd says so. Nor does a coordinator name a former process of its
  // own (same address, another key, its lease not yet expired): that would
  // send clients, and its own forwarded reads, back to itself.
  if (front.key == key_ ? !LeadingLocked() : front.address == address_) return "";
  return front.address;
}

v1::CoordinatorLeadership LeaderElection::Describe() const {
  absl::MutexLock lock(&mu_);
  v1::CoordinatorLeadership out;
  out.set_this_coordinator(address_);
  out.set_is_leader(LeadingLocked());
  out.set_lease_ttl_seconds(absl::ToDoubleSeconds(options_.lease_ttl));
  out.set_etcd_prefix(options_.prefix);
  if (!candidates_.empty()) {
    out.set_leader(candidates_.front().address);
    out.set_lease_id(candidates_.front().lease);
    out.set_leader_since_unix_seconds(absl::ToDoubleSeconds(leader_since_ - absl::UnixEpoch()));
    for (size_t i = 1; i < candidates_.size(); ++i) out.add_standbys(candidates_[i].address);
  }
  return out;
}

std::vector<EtcdCompare> LeaderElection::Guard() const {
  absl::MutexLock lock(&mu_);
  return {CreateRevisionIs(key_, create_revision_)};
}

int64_t LeaderElection::lease() const {
  absl::MutexLock lock(&mu_);
  return lease_;
}

std::string LeaderElection::loss_reason() const {
  absl::MutexLock lock(&mu_);
  // Time ran out before a thread of the campaign looked.
  if (lost_.empty() && won_ && !LeadingLocked()) {
    return NotRenewed();
  }
  return lost_;
}

std::string LeaderElection::EtcdTrouble() const {
  absl::MutexLock lock(&mu_);
  // A renewal still waiting on a silent etcd has no error yet.
  if (trouble_.empty() && won_ && !LeadingLocked()) {
    return "no renewal of this coordinator's lease was answered in time";
  }
  return trouble_;
}

void LeaderElection::NoteEtcdTrouble(const std::string& why) {
  absl::MutexLock lock(&mu_);
  trouble_ = why;
}

uint64_t LeaderElection::leader_changes() const {
  absl::MutexLock lock(&mu_);
  return leader_changes_;
}

std::string LeaderElection::NotRenewed() const {
  return absl::StrCat("no renewal of its lease was confirmed for ",
                      absl::FormatDuration(kGiveUpTtls * options_.lease_ttl), " (twice the TTL)");
}

void LeaderElection::LoseLocked(const std::string& why) {
  if (!lost_.empty()) return;
  lost_ = why;
  DDP_LOG(Error) << "lost leadership: " << why;
}

void LeaderElection::RenewLoop() {
  absl::MutexLock lock(&mu_);
  absl::Time next = clock_->Now() + renew_every_;
  auto stopping =
      +[](LeaderElection* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(e->mu_) { return e->stopping_; };
  while (!clock_->AwaitWithDeadline(mu_, absl::Condition(stopping, this), next)) {
    CheckGiveUpLocked();
    // A leader that lost is done: the coordinator starts over.
    if (won_ && !lost_.empty()) return;
    NotePauseLocked();
    // Every renew_every, whether or not the last ones came back: a sender
    // that is free takes it (none free: they are all stuck, and the next
    // goes out as one comes back).
    if (renewals_in_flight_ < kRenewalsInFlight) renewal_due_ = true;
    next = clock_->Now() + renew_every_;
  }
}

void LeaderElection::NotePauseLocked() {
  if (!won_ || !lost_.empty()) return;
  const bool leading = LeadingLocked();
  if (!leading && !paused_since_) {
    paused_since_ = clock_->Now();
    DDP_LOG(Warning) << "leadership unconfirmed: no renewal of the lease confirmed for "
                     << absl::FormatDuration(clock_->Now() - renewed_at_)
                     << "; the coordinator stops acting until one is (the term ends after "
                     << absl::FormatDuration(kGiveUpTtls * options_.lease_ttl) << ")";
  } else if (leading && paused_since_) {
    DDP_LOG(Info) << "leadership confirmed again after a pause of "
                  << absl::FormatDuration(clock_->Now() - *paused_since_);
    paused_since_.reset();
  }
}

void LeaderElection::RenewSender() {
  auto wake = +[](LeaderElection* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(e->mu_) {
    return e->stopping_ || e->renewal_due_;
  };
  absl::MutexLock lock(&mu_);
  while (true) {
    mu_.Await(absl::Condition(wake, this));
    if (stopping_) return;
    renewal_due_ = false;
    ++renewals_in_flight_;
    const int64_t lease = lease_;
    const absl::Time sent = clock_->Now();
    mu_.Unlock();
    absl::StatusOr<absl::Duration> renewed = etcd_->LeaseKeepAlive(lease);
    absl::StatusOr<Candidate> again = absl::UnknownError("not standing again");
    bool stand_again = false;
    if (absl::IsNotFound(renewed.status())) {
      {
        absl::MutexLock relock(&mu_);
        // One sender stands again for a standby; a leader's term is over.
        stand_again = !won_ && !entering_ && lease == lease_;
        if (stand_again) entering_ = true;
      }
      // A standby whose lease lapsed (it was paused, or cut off) stands
      // again at the back of the line.
      if (stand_again) again = Enter();
    }
    mu_.Lock();
    --renewals_in_flight_;
    if (stand_again) entering_ = false;
    OnRenewed(lease, sent, renewed, again);
  }
}

void LeaderElection::OnRenewed(int64_t lease, absl::Time sent,
                               const absl::StatusOr<absl::Duration>& renewed,
                               const absl::StatusOr<Candidate>& again) {
  if (lease != lease_) return;  // about a lease given up since
  trouble_ = renewed.ok() || absl::IsNotFound(renewed.status())
                 ? ""
                 : std::string(renewed.status().message());
  if (renewed.ok()) {
    // Late or not: the lease holds until at least `sent` + TTL.
    renewed_at_ = std::max(renewed_at_, sent);
    NotePauseLocked();
  } else if (absl::IsNotFound(renewed.status()) && won_) {
    LoseLocked("its lease expired");
  } else if (again.ok() && !again->key.empty()) {
    DDP_LOG(Warning) << "lease " << lease << " had expired; standing again with key " << again->key;
    lease_ = again->lease;
    key_ = again->key;
    create_revision_ = again->create_revision;
    dirty_ = true;
  }
}

void LeaderElection::ObserveLoop() {
  auto wake = +[](LeaderElection* e)
                   ABSL_EXCLUSIVE_LOCKS_REQUIRED(e->mu_) { return e->stopping_ || e->dirty_; };
  auto stopping =
      +[](LeaderElection* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(e->mu_) { return e->stopping_; };
  while (true) {
    bool need_watch;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(wake, this));
      if (stopping_) return;
      dirty_ = false;
      need_watch = watch_ == nullptr || watch_failed_;
    }
    absl::StatusOr<int64_t> revision = Observe();
    if (!revision.ok()) {
      // Look again soon; a broken watch is made again then.
      absl::MutexLock lock(&mu_);
      dirty_ = true;
      clock_->AwaitWithDeadline(mu_, absl::Condition(stopping, this), clock_->Now() + kRetry);
      continue;
    }
    // From just after the read: no change between the two is missed.
    if (need_watch) ReplaceWatch(*revision + 1);
  }
}

void LeaderElection::ReplaceWatch(int64_t from_revision) {
  std::unique_ptr<EtcdWatch> watch = etcd_->Watch(
      candidates_prefix_, RangeEndForPrefix(candidates_prefix_), from_revision,
      [this](const std::vector<EtcdEvent>&) {
        absl::MutexLock lock(&mu_);
        dirty_ = true;
      },
      [this](const absl::Status& s) {
        absl::MutexLock lock(&mu_);
        DDP_LOG(Warning) << "watch of " << candidates_prefix_ << " ended: " << s.message();
        watch_failed_ = true;
        dirty_ = true;
      });
  std::unique_ptr<EtcdWatch> old;
  {
    absl::MutexLock lock(&mu_);
    // Stopping: the new watch is not kept either.
    if (!stopping_) {
      old = std::move(watch_);
      watch_ = std::move(watch);
      watch_failed_ = false;
    }
  }
  // Both destroyed outside the lock: their threads may be waiting for it.
  old.reset();
  watch.reset();
}

absl::StatusOr<int64_t> LeaderElection::Observe() {
  absl::StatusOr<EtcdRangeResult> read =
      etcd_->Range(candidates_prefix_, RangeEndForPrefix(candidates_prefix_));
  if (!read.ok()) return read.status();
  std::vector<Candidate> candidates;
  for (const EtcdKeyValue& kv : read->kvs) {
    candidates.push_back(Candidate{kv.key, kv.value, kv.create_revision, kv.lease});
  }
  std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    return a.create_revision < b.create_revision;
  });
  absl::MutexLock lock(&mu_);
  const std::string leader = candidates.empty() ? "" : candidates.front().key;
  if (!leader.empty() && leader != leader_key_) {
    ++leader_changes_;
    leader_since_ = clock_->Now();
    DDP_LOG(Info) << "leader: " << candidates.front().address
                  << (leader == key_ ? " (this coordinator)" : "");
  }
  leader_key_ = leader;
  candidates_ = std::move(candidates);
  const std::string mine = key_;
  const bool mine_present = std::any_of(candidates_.begin(), candidates_.end(),
                                        [&mine](const Candidate& c) { return c.key == mine; });
  if (won_ && !mine_present) LoseLocked("its leader key is gone (the lease expired)");
  if (!won_ && lost_.empty() && leader == key_) {
    won_ = true;
  }
  return read->revision;
}

}  // namespace ddp
