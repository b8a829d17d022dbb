// Worker labels and job selectors: what a worker declares about itself
// (ddp-worker --labels zone=a,gpu=h200) and what a job requires of its
// workers (the spec's workerSelector), in Kubernetes' spirit: keys and
// values are short names, and a selector matches a worker carrying every
// one of its labels with the same value.
//
// Thread-safe: pure functions.
#ifndef DDP_COMMON_LABELS_H_
#define DDP_COMMON_LABELS_H_

#include <cstddef>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ddp {

using Labels = std::map<std::string, std::string>;

// Bounds on what a worker or a job may declare (the coordinator holds them
// for every worker).
inline constexpr size_t kMaxLabels = 16;
inline constexpr size_t kMaxLabelKeyBytes = 63;
inline constexpr size_t kMaxLabelValueBytes = 63;

// OK when there are at most kMaxLabels, every key is 1 to 63 of
// [A-Za-z0-9._/-] starting with a letter or digit, and every value at most
// 63 of [A-Za-z0-9._-]. INVALID_ARGUMENT starts with `what` and names the
// offending label.
absl::Status CheckLabels(absl::string_view what, const Labels& labels);

// Parses "k=v,k2=v2" (empty: no labels) and checks it as CheckLabels.
// INVALID_ARGUMENT starts with `what`; a key given twice is refused.
absl::StatusOr<Labels> ParseLabels(absl::string_view what, absl::string_view text);

// Whether `labels` carries every key of `selector` with the same value.
bool LabelsMatch(const Labels& labels, const Labels& selector);

// "k=v,k2=v2", as ParseLabels reads it.
std::string FormatLabels(const Labels& labels);

}  // namespace ddp

#endif  // DDP_COMMON_LABELS_H_
