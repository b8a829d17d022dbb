// The coordinators a client may talk to, and which of them to call now.
//
// --coordinator and DDP_COORDINATOR take a comma list ("a:29400,b:29400");
// with several coordinators one is the leader, and a standby answers every
// call with UNAVAILABLE and the leader's address in the "ddp-leader"
// trailer (empty or absent while no leader is known). A client calls
// current(), and after a failure asks OnFailure where to go next: to the
// leader a standby named (listed or not: it is the leader's own advertised
// address), or else, when the coordinator could not be reached, to the next
// address of the list. A single address behaves as it always did: every
// move lands on it again, unless a standby names another.
//
// Thread-safe: every method may be called from any thread.
#ifndef DDP_COMMON_COORDINATOR_TARGETS_H_
#define DDP_COMMON_COORDINATOR_TARGETS_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/status.h"

namespace ddp {

// The trailing metadata key in which a standby names the leader.
inline constexpr char kLeaderMetadata[] = "ddp-leader";

// Standbys that name one another (views that differ during an election)
// are followed at once this many times in a row, no more: then a client
// waits its backoff, or gives up the call.
inline constexpr int kMaxLeaderHops = 3;

// The leader that the coordinator answering a finished call named in its
// trailing metadata; "" when it named none.
std::string LeaderHint(const grpc::ClientContext& context);

// Splits a --coordinator list at its commas (spaces around an entry are
// dropped) and checks every entry as a HOST:PORT (common/net_address.h) or
// a "unix:PATH". INVALID_ARGUMENT naming the entry that is wrong, an empty
// one included.
absl::StatusOr<std::vector<std::string>> ParseCoordinatorList(absl::string_view list);

class CoordinatorTargets {
 public:
  // What a failure did to the target.
  enum class Move {
    // Not the address's fault (a refusal for now, a dropped worker): the
    // same target again.
    kStay,
    // A standby named the leader: the target is the leader now.
    kLeader,
    // The target could not be reached: the next address of the list.
    kNextAddress,
    // The same, and this move completes a round: every address of the list
    // has failed once since the last success (with one address, every
    // failure does).
    kNewRound,
  };
  struct Next {
    std::string target;
    Move move = Move::kStay;
  };

  // `list` as --coordinator takes it; check it first with
  // ParseCoordinatorList (an entry that is wrong is tried as it is, and its
  // calls fail).
  explicit CoordinatorTargets(absl::string_view list);

  CoordinatorTargets(const CoordinatorTargets&) = delete;
  CoordinatorTargets& operator=(const CoordinatorTargets&) = delete;

  // The address to call now.
  std::string current() const;
  // The list's addresses, in order (never empty).
  const std::vector<std::string>& addresses() const { return addresses_; }

  // A call to `tried` failed with `status`; `context` is the call's, after
  // it finished (its trailing metadata are read). A leader named in them
  // (with UNAVAILABLE) becomes the target; otherwise UNAVAILABLE or
  // DEADLINE_EXCEEDED moves to the next address of the list, and any other
  // code stays. When another caller already moved on from `tried`, this
  // does not move again (but a named leader is still taken).
  Next OnFailure(absl::string_view tried, const grpc::Status& status,
                 const grpc::ClientContext& context);
  // `tried` gave no answer in time (the caller cancelled the call): the next
  // address of the list, as for UNAVAILABLE.
  Next OnUnreachable(absl::string_view tried);
  // A call succeeded: the next failure starts a new round.
  void OnSuccess();

 private:
  Next AdvanceLocked(absl::string_view tried) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::vector<std::string> addresses_;

  mutable absl::Mutex mu_;
  std::string current_ ABSL_GUARDED_BY(mu_);
  // The list entry the target is, or (a leader not listed) was reached
  // from: the next address of the list comes after it.
  size_t index_ ABSL_GUARDED_BY(mu_) = 0;
  // Moves to the next address since the last success or completed round.
  size_t moves_in_round_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ddp

#endif  // DDP_COMMON_COORDINATOR_TARGETS_H_
