// Which files a job may name: its model and data must lie under folders the
// operator allows for inputs (--data_root), its output under folders allowed
// for outputs (--output_root). Checked at submission, before anything reads
// a file.
//
// Looks at the filesystem (realpath, stat) but never opens a file: a FIFO, a
// device or a huge file is refused by its type and size, not by trying it.
// Reading a file is the validation helper's business (helper_check.h).
//
// What is refused, with INVALID_ARGUMENT naming the field (and the roots):
//  - a relative path, a ".." component, a NUL byte;
//  - a path whose real location (every symlink resolved) is not under a
//    root: a symlink can't lead out;
//  - an input that is not a regular file (FIFO, device, socket, folder), or
//    larger than max_input_bytes; a missing one;
//  - an output whose folder is missing or outside the output roots, that is
//    a folder or anything but a regular file, or a file that exists (unless
//    the job sets overwrite_output), or has other hard links.
//
// The check and the later read are not atomic: someone who can write under
// a root can still swap a file in between. The roots are for folders only
// trusted people write to.
#ifndef DDP_COORDINATOR_PATH_POLICY_H_
#define DDP_COORDINATOR_PATH_POLICY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ddp/v1/job.pb.h"

namespace ddp {

struct PathRoots {
  // Folders models and data files may come from (absolute).
  std::vector<std::string> data;
  // Folders outputs may be written to (absolute).
  std::vector<std::string> output;
  // Largest model or data file accepted.
  uint64_t max_input_bytes = uint64_t{1} << 30;
};

// Parses a comma-separated list of absolute folders (a flag's value).
// INVALID_ARGUMENT names `flag` for an empty list or a relative entry.
absl::StatusOr<std::vector<std::string>> ParseRootList(absl::string_view flag,
                                                       absl::string_view list);

// Checks every path `spec` names. Roots are resolved (realpath) on every
// call, so a root created after start-up counts; a missing root allows
// nothing. Thread-safe; never blocks on anything but the filesystem's
// metadata.
absl::Status CheckJobPaths(const v1::JobSpec& spec, const PathRoots& roots);

// Checks that every input file the job's check pinned (input_files) really
// lay under a data root: INVALID_ARGUMENT naming it otherwise.
absl::Status CheckPinnedInputs(const v1::JobSpec& spec, const PathRoots& roots);

// Records in `spec` where its write folders (checkpoint.dir, output_path's
// folder) lead now, every link resolved (JobSpec.write_folders): workers
// confine the job's writes to those, following no link. After
// CheckJobPaths; FAILED_PRECONDITION-like refusals as it gives.
absl::Status PinWriteFolders(v1::JobSpec* spec, const PathRoots& roots);

}  // namespace ddp

#endif  // DDP_COORDINATOR_PATH_POLICY_H_
