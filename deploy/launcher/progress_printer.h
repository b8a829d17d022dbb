// Turns status snapshots into the lines ddp-run prints.
#ifndef DDP_DEPLOY_LAUNCHER_PROGRESS_PRINTER_H_
#define DDP_DEPLOY_LAUNCHER_PROGRESS_PRINTER_H_

#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "ddp/v1/status.pb.h"

namespace ddp {

// Seconds as "1h02m03s", "2m05s" or "7s".
std::string FormatSeconds(double seconds);

class ProgressPrinter {
 public:
  explicit ProgressPrinter(absl::Duration every = absl::Seconds(2)) : every_(every) {}

  // The lines to print for this snapshot: epoch results as they arrive, state
  // changes (and attached workers) at once, a progress line at most every
  // `every` while training, and before training what the job waits for,
  // again after each `every` without a line.
  std::vector<std::string> Update(const v1::JobStatus& status, absl::Time now);

  // A one-line summary of how the job ended.
  static std::string Summary(const v1::JobStatus& status);

 private:
  // Notes that `lines` were printed now, and returns them.
  std::vector<std::string> Printed(std::vector<std::string> lines, absl::Time now);

  const absl::Duration every_;
  // The last line of any kind, and the last progress line.
  absl::Time last_line_ = absl::InfinitePast();
  absl::Time last_progress_ = absl::InfinitePast();
  std::string last_state_;
  std::set<uint64_t> epochs_printed_;
};

}  // namespace ddp

#endif  // DDP_DEPLOY_LAUNCHER_PROGRESS_PRINTER_H_
