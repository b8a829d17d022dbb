// The rendezvous store: keys and values under namespaces ("job/generation/"),
// with get-that-waits. Knows nothing of gRPC: a waiting get is a callback,
// so no thread blocks while peers are still starting.
//
// Everything a client can make it hold is bounded (Options): a refusal is
// INVALID_ARGUMENT for a malformed key, RESOURCE_EXHAUSTED for a value,
// namespace or waiter limit, and names the limit and the value allowed.
//
// Thread-safe. Callbacks run on the calling thread of Set/Add/Get/Cancel/
// ExpireWaiters/DropNamespaces, never under the store's lock.
#ifndef DDP_COMMON_KV_STORE_H_
#define DDP_COMMON_KV_STORE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace ddp {

class KvStore {
 public:
  using GetCallback = std::function<void(absl::StatusOr<std::string>)>;
  // Names one waiting Get, for Cancel. 0 names none.
  using WaiterId = uint64_t;

  struct Options {
    // Bytes of a key (INVALID_ARGUMENT beyond).
    size_t max_key_bytes = 512;
    // Bytes of a value (RESOURCE_EXHAUSTED beyond, as the ones below).
    size_t max_value_bytes = size_t{1} << 20;
    // Keys in one namespace, and their keys' and values' bytes together.
    // A generation of N Gloo ranks needs a few keys per rank.
    size_t max_keys_per_namespace = 100'000;
    size_t max_namespace_bytes = size_t{64} << 20;
    // Gets waiting at once, in all namespaces.
    size_t max_waiters = 100'000;
  };

  explicit KvStore(const Clock* clock) : KvStore(clock, Options()) {}
  KvStore(const Clock* clock, Options options) : clock_(clock), options_(options) {}
  KvStore(const KvStore&) = delete;
  KvStore& operator=(const KvStore&) = delete;

  // INVALID_ARGUMENT for an empty key or one over max_key_bytes.
  absl::Status CheckKey(const std::string& key) const;

  // Sets `key` in namespace `ns` and wakes its waiters. CheckKey's errors;
  // RESOURCE_EXHAUSTED when the value or the namespace would exceed a limit
  // (the namespace is left as it was).
  absl::Status Set(const std::string& ns, const std::string& key, std::string value);

  // Adds `delta` to the decimal integer at `key` (absent counts as 0) and
  // returns the sum. INVALID_ARGUMENT if the value there is not an integer,
  // OUT_OF_RANGE if the sum does not fit in int64 (it never wraps), and
  // Set's errors.
  absl::StatusOr<int64_t> Add(const std::string& ns, const std::string& key, int64_t delta);

  // Calls `done` with the value once `key` exists: at once if it does, or
  // later from Set/Add. DEADLINE_EXCEEDED from ExpireWaiters once `deadline`
  // has passed, ABORTED from DropNamespaces, CANCELLED from Cancel. At once
  // with CheckKey's errors, or RESOURCE_EXHAUSTED when max_waiters are
  // waiting. Returns the waiter's id, or 0 when `done` was already called.
  WaiterId Get(const std::string& ns, const std::string& key, absl::Time deadline,
               GetCallback done);

  // The caller of a waiting Get went away (its RPC was cancelled): drops the
  // waiter at once and calls its callback with CANCELLED. Does nothing if it
  // was already answered. O(log n).
  void Cancel(WaiterId id);

  // Fails every waiter whose deadline has passed. Called periodically;
  // O(log n) per waiter it fails.
  void ExpireWaiters();

  // Removes every key under namespaces starting with `prefix` and fails
  // their waiters with ABORTED (their generation is over).
  void DropNamespaces(const std::string& prefix, const std::string& why);

  const Options& options() const { return options_; }
  size_t num_keys() const;
  size_t num_waiters() const;
  // Bytes of keys and values held in every namespace.
  size_t num_bytes() const;
  // Bytes of keys and values held in namespace `ns`.
  size_t namespace_bytes(const std::string& ns) const;

 private:
  struct Waiter {
    std::string full_key;
    absl::Time deadline;
    GetCallback done;
  };
  struct Usage {
    size_t keys = 0;
    size_t bytes = 0;
  };
  using Fired = std::vector<std::pair<GetCallback, absl::StatusOr<std::string>>>;

  // Stores `value` at ns + key within the namespace's limits.
  absl::Status PutLocked(const std::string& ns, const std::string& key, std::string value,
                         Fired* fired) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves the waiters of `full_key` into `fired` with `value`.
  void WakeLocked(const std::string& full_key, const std::string& value, Fired* fired)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes waiter `id` (which must exist), moving its callback into `fired`
  // with `result`.
  void FireLocked(WaiterId id, absl::StatusOr<std::string> result, Fired* fired)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void Run(Fired& fired);

  const Clock* clock_;
  const Options options_;
  mutable absl::Mutex mu_;
  // Full key (namespace + key) -> value.
  std::map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Usage> usage_ ABSL_GUARDED_BY(mu_);
  // Each waiter once, and two indexes into it: by key (to wake) and by
  // deadline (to expire).
  std::map<WaiterId, Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<std::string, WaiterId>> waiters_by_key_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<absl::Time, WaiterId>> waiters_by_deadline_ ABSL_GUARDED_BY(mu_);
  WaiterId next_waiter_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace ddp

#endif  // DDP_COMMON_KV_STORE_H_
