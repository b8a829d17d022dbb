// An image folder as torchvision's ImageFolder reads one, so that index i
// names the same file and label here as there: root/CLASS/**/*.{jpg,jpeg,png}.
//
// torchvision's rules (datasets/folder.py, 0.14): the classes are the
// entries of root that are directories (symbolic links followed), sorted;
// class i is the i-th. Within each class folder, every directory below it
// (links followed) in sorted path order, and in each its files in sorted
// name order; a file belongs when its lower-cased name ends in one of
// torchvision's image extensions. Sorting is by bytes, as Python sorts str.
//
// This loader decodes JPEG and PNG only: a file with another of
// torchvision's extensions (.ppm .bmp .pgm .tif .tiff .webp) would be a
// sample there, so it is an error here (naming the file) rather than an
// index that silently shifts. Files with any other name are left out, as
// torchvision leaves them out. A class folder with no image is an error, as
// it is there.
//
// No LibTorch: the coordinator's check can read the manifest too.
#ifndef DDP_WORKER_DATA_IMAGE_FOLDER_H_
#define DDP_WORKER_DATA_IMAGE_FOLDER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ddp {

struct ImageSample {
  // root/CLASS/..., joined as torchvision joins it.
  std::string path;
  int64_t label = 0;
  // Its size when the folder was scanned (0: it could not be examined).
  uint64_t size = 0;
};

// Images torchvision reads that this loader does not decode (.webp, .bmp,
// .tif, ...): refused, naming the first (a job that would fail on them), or
// kept in their place (each then fails as a bad sample, which
// dataset.skipBadSamples replaces): every other image keeps torchvision's
// index either way.
enum class OtherFormats { kRefuse, kKeep };

class ImageFolder {
 public:
  // At most this many samples (a bound on what a folder can make a worker
  // hold: about 100 bytes each).
  static constexpr size_t kMaxSamples = 50'000'000;

  // INVALID_ARGUMENT naming the path and what is wrong: root missing or not
  // a folder, no class folder, a class with no image, a file this loader
  // can't decode where torchvision would read one, more than kMaxSamples.
  // `limit`: the first `limit` samples only (all when 0).
  static absl::StatusOr<ImageFolder> Scan(const std::string& root, uint64_t limit = 0,
                                          OtherFormats others = OtherFormats::kRefuse);

  // SHA-256 (hex) of what the scan found, in index order: each sample's
  // path below the root, size and label. Equal digests: the same files of
  // the same sizes with the same labels (what a job is pinned to when its
  // folder has no manifest).
  std::string ListingDigest(const std::string& root) const;

  const std::vector<std::string>& classes() const { return classes_; }
  const std::vector<ImageSample>& samples() const { return samples_; }
  size_t size() const { return samples_.size(); }

 private:
  std::vector<std::string> classes_;
  std::vector<ImageSample> samples_;
};

}  // namespace ddp

#endif  // DDP_WORKER_DATA_IMAGE_FOLDER_H_
