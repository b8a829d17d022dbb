// Keeps a repeating complaint from flooding a log: the first one is let
// through, then one of the same kind at most every `interval` (saying how
// many were held back meanwhile); a new kind is let through at once. A
// worker waiting out a long coordinator outage logs a line a minute, not
// one per retry.
//
// Not thread-safe: one owner calls it. Time is passed in.
#ifndef DDP_COMMON_LOG_LIMITER_H_
#define DDP_COMMON_LOG_LIMITER_H_

#include <cstdint>
#include <optional>

#include "absl/time/time.h"

namespace ddp {

class LogLimiter {
 public:
  explicit LogLimiter(absl::Duration interval) : interval_(interval) {}

  // Whether to log an event of `kind` (a status code, say) happening at
  // `now`. When it returns true, *held_back is how many events were not
  // logged since the last one that was.
  bool ShouldLog(int kind, absl::Time now, uint64_t* held_back) {
    if (last_kind_ && *last_kind_ == kind && now - last_logged_ < interval_) {
      ++held_back_;
      return false;
    }
    *held_back = held_back_;
    held_back_ = 0;
    last_kind_ = kind;
    last_logged_ = now;
    return true;
  }

  // Things went well: the next complaint is news, and is logged at once.
  void Reset() {
    last_kind_.reset();
    held_back_ = 0;
  }

 private:
  const absl::Duration interval_;
  std::optional<int> last_kind_;
  absl::Time last_logged_;
  uint64_t held_back_ = 0;
};

}  // namespace ddp

#endif  // DDP_COMMON_LOG_LIMITER_H_
