// A job's input files (its TorchScript model, its data) read as untrusted
// files, and pinned: what the check at submission read is what every
// worker trains on, or the worker refuses the file, naming it.
//
// The check (ddp-validate) reads through a recording InputFiles: each file
// is opened once, as a regular file through its real path, read whole and
// hashed (SHA-256); the coordinator stores those pins in the job's spec
// (JobSpec.input_files). A worker reads through a verifying InputFiles made
// from the spec: it opens the pinned real path (O_NOFOLLOW: a symbolic link
// put there since is refused), requires the pinned size before reading and
// the pinned hash after. A path swapped, re-pointed or rewritten after the
// submission was accepted fails the job; it never trains.
#ifndef DDP_WORKER_INPUT_FILES_H_
#define DDP_WORKER_INPUT_FILES_H_

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ddp/v1/job.pb.h"

namespace ddp {

// Most bytes of one input file (as the data loaders' own limit).
inline constexpr uint64_t kMaxInputFileBytes = uint64_t{8} << 30;

// "a folder", "a FIFO", "a device", "a socket", "a symbolic link" or "not a
// regular file": what a file of `mode` is, for a refusal.
const char* FileKind(mode_t mode);

// One untrusted file read whole (an input, a checkpoint): opened without
// following a last symbolic link or blocking on a FIFO, and only when it is
// a regular file of at most `max_bytes` (and of `exact_size` when set),
// checked before anything is allocated. Callers say why in their own words.
struct RegularFileRead {
  enum class Refusal {
    kNone,
    kCantOpen,    // `error`
    kLink,        // the last component is a symbolic link
    kNotRegular,  // `mode`
    kTooLarge,    // `size` > max_bytes
    kWrongSize,   // `size` != exact_size
    kCantRead,    // `error`
    kChanged,     // it grew or shrank while being read
  };
  Refusal refusal = Refusal::kNone;
  int error = 0;
  mode_t mode = 0;
  uint64_t size = 0;
  std::string bytes;
};
RegularFileRead ReadRegularFile(const std::string& path, uint64_t max_bytes,
                                std::optional<uint64_t> exact_size = std::nullopt);

class InputFiles {
 public:
  // Records every file read (the check's side).
  InputFiles() = default;
  // Holds every file read to `pins` (a worker's side). A job without pins
  // (submitted to a coordinator without checks) is read unpinned: still
  // as regular files only.
  explicit InputFiles(const google::protobuf::RepeatedPtrField<v1::InputFile>& pins);

  // `path`'s bytes, for the job's `field` ("model.path", ...). Refusals are
  // INVALID_ARGUMENT naming the field and the file: not a regular file, a
  // symbolic link where the pin says a file was, more than `max_bytes`, or
  // (pinned) another size or content than at submission. Reading a path
  // again gives what was read the first time, or a refusal.
  absl::StatusOr<std::string> Read(absl::string_view field, const std::string& path,
                                   uint64_t max_bytes = kMaxInputFileBytes);

  // A folder of `images` images whose listing (ImageFolder::ListingDigest)
  // is `digest`: recorded as a pin of the folder (size: the image count),
  // or held to its pin, refused (INVALID_ARGUMENT naming the field and
  // folder) when an image was added, removed, renamed or resized since. A
  // folder without a pin (its job checked before folders were pinned) is
  // read as it is.
  absl::Status PinListing(absl::string_view field, const std::string& path, uint64_t images,
                          const std::string& digest);

  // Every file read so far, in the order first read.
  std::vector<v1::InputFile> Recorded() const;

 private:
  bool verifying_ = false;
  std::map<std::string, v1::InputFile> pins_;
  std::vector<std::string> order_;
};

// SHA-256 of `bytes`, lowercase hex.
std::string Sha256Hex(absl::string_view bytes);

}  // namespace ddp

#endif  // DDP_WORKER_INPUT_FILES_H_
