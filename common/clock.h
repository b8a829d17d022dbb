// Time, injected: managers ask a Clock for the time, so tests move it by hand
// and never sleep to wait for a timeout.
#ifndef DDP_COMMON_CLOCK_H_
#define DDP_COMMON_CLOCK_H_

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
};

// The system's wall clock.
class RealClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
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

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ddp

#endif  // DDP_COMMON_CLOCK_H_
