// The kinds a job names, read from its JobSpec: readable names on the wire
// and in job files ("gloo", "fashion-mnist"), ddp/v1/kinds.proto's enums in
// the code. One table per kind holds every name; ValidateJobSpec refuses a
// name that is not in it (listing the choices), so for a checked spec no
// ...Of() below returns an UNKNOWN kind.
#ifndef DDP_COMMON_JOB_KINDS_H_
#define DDP_COMMON_JOB_KINDS_H_

#include <string>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "ddp/v1/job.pb.h"
#include "ddp/v1/kinds.pb.h"

namespace ddp {

template <typename Kind>
struct KindName {
  Kind kind;
  const char* name;
};

// Every name of each kind, in the order an error lists them.
absl::Span<const KindName<v1::ModelKind>> ModelKindNames();
absl::Span<const KindName<v1::DatasetKind>> DatasetKindNames();
absl::Span<const KindName<v1::OptimizerKind>> OptimizerKindNames();
absl::Span<const KindName<v1::LossKind>> LossKindNames();
absl::Span<const KindName<v1::LrScaling>> LrScalingNames();
absl::Span<const KindName<v1::Backend>> BackendNames();
absl::Span<const KindName<v1::Compression>> CompressionNames();

// The kind `name` names in `names`; the table's UNKNOWN (0) for none.
template <typename Kind>
Kind KindNamed(absl::Span<const KindName<Kind>> names, absl::string_view name) {
  for (const KindName<Kind>& entry : names) {
    if (name == entry.name) return entry.kind;
  }
  return static_cast<Kind>(0);
}

// The names of `names` quoted and joined ("a", "b", "c"), for a message.
template <typename Kind>
std::string QuotedNames(absl::Span<const KindName<Kind>> names) {
  std::string out;
  for (const KindName<Kind>& entry : names) {
    if (!out.empty()) out += ", ";
    out += "\"";
    out += entry.name;
    out += "\"";
  }
  return out;
}

v1::ModelKind ModelKindOf(const v1::ModelSpec& model);
v1::DatasetKind DatasetKindOf(const v1::DatasetSpec& dataset);
v1::OptimizerKind OptimizerKindOf(const v1::OptimizerSpec& optimizer);
v1::LossKind LossKindOf(const v1::JobSpec& spec);
v1::LrScaling LrScalingOf(const v1::JobSpec& spec);
v1::Backend BackendOf(const v1::JobSpec& spec);
v1::Compression CompressionOf(const v1::JobSpec& spec);

}  // namespace ddp

#endif  // DDP_COMMON_JOB_KINDS_H_
