#include "coordinator/stall_watch.h"

#include <algorithm>

namespace ddp {

StallWatch::Options StallWatch::ForHeartbeats(absl::Duration timeout, absl::Duration interval) {
  Options options;
  options.max_tick_gap = timeout / 4;
  options.deaf_after = std::min(timeout, std::max(timeout / 2, 2 * interval));
  return options;
}

absl::Duration StallWatch::OnTick(absl::Time now, size_t attached) {
  const absl::Duration gap = now - last_tick_;
  last_tick_ = std::max(last_tick_, now);
  // With nobody attached there is nobody to hear: no deafness to count.
  if (attached == 0) heard_ = now;
  if (gap <= options_.max_tick_gap) return absl::ZeroDuration();
  // The grace covers the silence up to now: heartbeats read after this
  // tick don't end a deafness.
  heard_ = std::max(heard_, now);
  return gap;
}

absl::Duration StallWatch::OnHeard(absl::Time now, size_t attached) {
  const absl::Duration deaf = Deaf(now, attached) ? now - heard_ : absl::ZeroDuration();
  heard_ = std::max(heard_, now);
  // The grace covers the ticks missed meanwhile too (a stopped process).
  if (deaf > absl::ZeroDuration()) last_tick_ = std::max(last_tick_, now);
  return deaf;
}

bool StallWatch::Deaf(absl::Time now, size_t attached) const {
  return attached > 0 && now - heard_ > options_.deaf_after;
}

}  // namespace ddp
