// JPEG (libjpeg-turbo's TurboJPEG) and PNG (libpng) files decoded to 8-bit
// RGB, as torchvision's default loader gives them (PIL's
// Image.open(f).convert("RGB")): grey is repeated in the three channels, a
// palette is looked up, alpha is dropped (not composited), and no gamma is
// applied. JPEGs decode with the accurate integer IDCT and smooth chroma
// upsampling, libjpeg's defaults, which PIL uses; a 16-bit PNG keeps each
// sample's high byte.
//
// No LibTorch.
#ifndef DDP_WORKER_DATA_IMAGE_DECODE_H_
#define DDP_WORKER_DATA_IMAGE_DECODE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace ddp {

// Height x width x 3 bytes, rows top to bottom.
struct RgbImage {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> pixels;
  // Its share of the decoding budget (DecodeBudget), given back when the
  // last copy goes (once it is transformed).
  std::shared_ptr<const void> held;
};

// Images larger than this many pixels are refused, from their header,
// before anything is allocated (a 79 KB PNG can claim 81 M pixels): PIL's
// convention, which warns above 89,478,485 pixels and refuses above twice
// that, so that what torchvision loads loads here too.
inline constexpr int64_t kMaxImagePixels = 2 * int64_t{89'478'485};

// The bytes of decoded images in flight in a process, whatever the number
// of loader threads: a decode waits until its image fits (one larger than
// the whole budget waits until nothing else is held, then goes alone).
class DecodeBudget {
 public:
  explicit DecodeBudget(uint64_t bytes) : budget_(bytes) {}
  // Holds `bytes` until the returned handle (and its copies) go.
  std::shared_ptr<const void> Hold(uint64_t bytes);
  uint64_t held() const;
  // The most held at once so far.
  uint64_t peak() const;

 private:
  const uint64_t budget_;
  mutable absl::Mutex mu_;
  uint64_t held_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t peak_ ABSL_GUARDED_BY(mu_) = 0;
};

// The process's budget: 1 GiB (two of the largest images, or any number of
// ordinary ones).
inline constexpr uint64_t kDecodeBudgetBytes = uint64_t{1} << 30;
DecodeBudget& ImageDecodeBudget();

// Decodes `bytes` (a JPEG or a PNG, told by its first bytes) to the RGB
// pixels PIL's convert("RGB") gives (CMYK JPEGs and 16-bit PNGs included);
// `name` (the file's path) is in every error. INVALID_ARGUMENT for anything
// else, a truncated or corrupt file, or an image over kMaxImagePixels. The
// image holds its bytes of ImageDecodeBudget() from before it is decoded.
absl::StatusOr<RgbImage> DecodeImage(absl::string_view bytes, absl::string_view name);

// What DecodeImage would refuse from the header alone: not a JPEG or a PNG,
// a header that doesn't parse, or more than kMaxImagePixels. Decodes
// nothing (a job's check reads its samples so, in milliseconds, whatever
// they claim).
absl::Status CheckImageHeader(absl::string_view bytes, absl::string_view name);

// Largest image file read.
inline constexpr uint64_t kMaxImageFileBytes = uint64_t{256} << 20;

// Reads `path` (at most kMaxImageFileBytes; of `expected_size` bytes when
// that is non-zero, else INVALID_ARGUMENT saying it changed) and decodes it.
absl::StatusOr<RgbImage> ReadImage(const std::string& path, uint64_t expected_size = 0);
// The same read, then only CheckImageHeader.
absl::Status CheckImageFile(const std::string& path, uint64_t expected_size = 0);

}  // namespace ddp

#endif  // DDP_WORKER_DATA_IMAGE_DECODE_H_
