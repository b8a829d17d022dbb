// A strict pre-scan of JSON text for keys given twice in one object.
// Protobuf's JSON parser keeps the last of two equal keys without a word, so
// a job file saying "lr" twice would train with whichever came last.
#ifndef DDP_COMMON_JSON_KEYS_H_
#define DDP_COMMON_JSON_KEYS_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ddp {

// INVALID_ARGUMENT naming the key's path ("job.optimizer.lr") when an
// object has the same key twice. A field's two JSON names ("train_size" and
// "trainSize") count as the same key, as protobuf maps both to one field.
// Text that is not well-formed JSON passes: the JSON parser that follows
// says what is wrong with it. Runs in linear time and constant stack.
absl::Status CheckNoDuplicateKeys(absl::string_view json);

}  // namespace ddp

#endif  // DDP_COMMON_JSON_KEYS_H_
