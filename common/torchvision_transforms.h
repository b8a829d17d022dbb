// Image transforms as torchvision users write them: the list a
// `transforms.Compose([...])` holds, ToTensor and Normalize included, with
// what is not supported named before protobuf's parser says "Cannot find
// field".
#ifndef DDP_COMMON_TORCHVISION_TRANSFORMS_H_
#define DDP_COMMON_TORCHVISION_TRANSFORMS_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "ddp/v1/job.pb.h"

namespace ddp {

// The transforms a job's image pipeline runs, in words, for error messages.
inline constexpr char kSupportedTransforms[] =
    "Resize, CenterCrop, RandomResizedCrop, RandomHorizontalFlip, ToTensor, Normalize";

// Looks at dataset.transforms and dataset.testTransforms of a job's JSON
// (before it is parsed as a JobSpec): INVALID_ARGUMENT naming the step for
// a transform kind the pipeline does not have ("ColorJitter is not
// supported") or a parameter its kind does not take. Text that is not JSON
// passes: the parser that follows says what is wrong with it.
absl::Status CheckTransformsJson(absl::string_view json);

// torchvision's list made the pipeline's: ToTensor steps dropped (every
// pipeline ends in a tensor), a Normalize that ends a list moved into
// `data.normalize` (when that is unset or the same). What can't be moved
// stays, for the job's check to refuse by name.
void CanonicalTransforms(v1::DatasetSpec* data);

}  // namespace ddp

#endif  // DDP_COMMON_TORCHVISION_TRANSFORMS_H_
