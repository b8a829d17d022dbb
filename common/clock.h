// Time, injected: managers ask a Clock for the time, so tests move it by hand
// and never sleep to wait for a timeout.
#ifndef DDP_COMMON_CLOCK_H_
#define DDP_COMMON_CLOCK_H_

#include <set>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace ddp {

class Clock {
 public:
  virtual ~Clock() = default;
  // Thread-safe.
  virtual absl::Time Now() const = 0;
  // With `mu` held: waits until `condition` holds or this clock reaches
  // `deadline`, and returns whether the condition holds. What a thread that
  // waits for a time (a heartbeat, a backoff, a timeout) calls, so that a
  // test moves it with the clock.
  virtual bool AwaitWithDeadline(absl::Mutex& mu, const absl::Condition& condition,
                                 absl::Time deadline) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) = 0;
};

// The system's wall clock.
class RealClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
  bool AwaitWithDeadline(absl::Mutex& mu, const absl::Condition& condition,
                         absl::Time deadline) const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return mu.AwaitWithDeadline(condition, deadline);
  }
  // A process-wide instance; never destroyed.
  static Clock* Get() {
    static RealClock* clock = new RealClock();
    return clock;
  }
};

// A clock whose time moves only when the test says so.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1700000000)) : now_(start) {}
  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }
  // Wakes within a millisecond of the condition holding or of Advance
  // passing the deadline (the waiter's mutex is not this clock's, so it
  // looks again at that pace rather than being signalled).
  bool AwaitWithDeadline(absl::Mutex& mu, const absl::Condition& condition,
                         absl::Time deadline) const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    Waiting(deadline, +1);
    bool held = true;
    while (!mu.AwaitWithTimeout(condition, absl::Milliseconds(1))) {
      if (Now() >= deadline) {
        held = condition.Eval();
        break;
      }
    }
    Waiting(deadline, -1);
    return held;
  }
  // The deadlines threads wait for on this clock now, soonest first: a test
  // moves time once the thread it drives is waiting, not before it has
  // chosen its deadline.
  std::vector<absl::Time> Deadlines() const {
    absl::MutexLock lock(&mu_);
    return std::vector<absl::Time>(deadlines_.begin(), deadlines_.end());
  }

 private:
  void Waiting(absl::Time deadline, int change) const {
    absl::MutexLock lock(&mu_);
    if (change > 0) {
      deadlines_.insert(deadline);
    } else {
      deadlines_.erase(deadlines_.find(deadline));
    }
  }

  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
  mutable std::multiset<absl::Time> deadlines_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ddp

#endif  // DDP_COMMON_CLOCK_H_
