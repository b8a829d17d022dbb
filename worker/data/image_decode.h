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
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ddp {

// Height x width x 3 bytes, rows top to bottom.
struct RgbImage {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> pixels;
};

// Images larger than this many pixels are refused before they are decoded
// (a small file can claim a huge image).
inline constexpr int64_t kMaxImagePixels = 89'478'485;  // PIL's own bound

// Decodes `bytes` (a JPEG or a PNG, told by its first bytes) to the RGB
// pixels PIL's convert("RGB") gives (CMYK JPEGs and 16-bit PNGs included);
// `name` (the file's path) is in every error. INVALID_ARGUMENT for anything
// else, a truncated or corrupt file, or an image over kMaxImagePixels.
absl::StatusOr<RgbImage> DecodeImage(absl::string_view bytes, absl::string_view name);

// Largest image file read.
inline constexpr uint64_t kMaxImageFileBytes = uint64_t{256} << 20;

// Reads `path` (at most kMaxImageFileBytes; of `expected_size` bytes when
// that is non-zero, else INVALID_ARGUMENT saying it changed) and decodes it.
absl::StatusOr<RgbImage> ReadImage(const std::string& path, uint64_t expected_size = 0);

}  // namespace ddp

#endif  // DDP_WORKER_DATA_IMAGE_DECODE_H_
