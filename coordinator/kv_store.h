// The rendezvous store: keys and values under namespaces ("job/generation/"),
// with get-that-waits. Knows nothing of gRPC: a waiting get is a callback,
// so no thread blocks while peers are still starting.
//
// Thread-safe. Callbacks run on the calling thread of Set/Add/Get/
// ExpireWaiters/DropNamespace, never under the store's lock.
#ifndef DDP_COORDINATOR_KV_STORE_H_
#define DDP_COORDINATOR_KV_STORE_H_

#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace ddp {

class KvStore {
 public:
  using GetCallback = std::function<void(absl::StatusOr<std::string>)>;

  explicit KvStore(const Clock* clock) : clock_(clock) {}
  KvStore(const KvStore&) = delete;
  KvStore& operator=(const KvStore&) = delete;

  // Sets `key` in namespace `ns` and wakes its waiters.
  void Set(const std::string& ns, const std::string& key, std::string value);

  // Adds `delta` to the decimal integer at `key` (absent counts as 0) and
  // returns the sum. INVALID_ARGUMENT if the value there is not an integer.
  absl::StatusOr<int64_t> Add(const std::string& ns, const std::string& key, int64_t delta);

  // Calls `done` with the value once `key` exists: at once if it does, or
  // later from Set/Add. DEADLINE_EXCEEDED from ExpireWaiters once `deadline`
  // has passed, ABORTED from DropNamespace.
  void Get(const std::string& ns, const std::string& key, absl::Time deadline, GetCallback done);

  // Fails every waiter whose deadline has passed. Called periodically.
  void ExpireWaiters();

  // Removes every key under namespaces starting with `prefix` and fails
  // their waiters with ABORTED (their generation is over).
  void DropNamespaces(const std::string& prefix, const std::string& why);

  size_t num_keys() const;
  size_t num_waiters() const;

 private:
  struct Waiter {
    absl::Time deadline;
    GetCallback done;
  };
  using Fired = std::list<std::pair<GetCallback, absl::StatusOr<std::string>>>;

  // Moves the waiters of `full_key` into `fired` with `value`.
  void WakeLocked(const std::string& full_key, const std::string& value, Fired* fired)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void Run(Fired& fired);

  const Clock* clock_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
  std::multimap<std::string, Waiter> waiters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_KV_STORE_H_
