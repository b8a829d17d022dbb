#include "worker/data/image_decode.h"

#include <fcntl.h>
#include <png.h>
#include <sys/stat.h>
#include <turbojpeg.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"

namespace ddp {
namespace {

absl::Status Bad(absl::string_view name, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(name, ": ", what));
}

absl::Status CheckSize(absl::string_view name, int64_t width, int64_t height) {
  if (width <= 0 || height <= 0) return Bad(name, "the image has no pixels");
  // Divided, not multiplied: a header may claim 2^32 - 1 by 2^32 - 1.
  if (width > kMaxImagePixels / height) {
    return Bad(name, absl::StrCat("the image is ", width, "x", height, ", over the ",
                                  kMaxImagePixels, " pixels an image may have"));
  }
  return absl::OkStatus();
}

// A CMYK JPEG's stored values to RGB, as PIL does: it takes them as Adobe
// writes them, inverted (C = 255 - stored), then R = (255 - K) - C (255 - K)
// / 255 with its own rounding, and likewise G and B.
void StoredCmykToRgb(const uint8_t* stored, size_t count, uint8_t* rgb) {
  for (size_t i = 0; i < count; ++i) {
    const int not_k = stored[4 * i + 3];  // 255 - K
    for (int c = 0; c < 3; ++c) {
      const int t = (255 - stored[4 * i + c]) * not_k + 128;
      const int v = not_k - (((t >> 8) + t) >> 8);
      rgb[3 * i + c] = static_cast<uint8_t>(v < 0 ? 0 : v > 255 ? 255 : v);
    }
  }
}

// A PNG's size from its IHDR chunk, which must come first: the budget is
// held before libpng allocates anything (its longjmps skip destructors, so
// nothing of ours lives in DecodePngInto's frame).
absl::Status PngSize(absl::string_view bytes, absl::string_view name, int64_t* width,
                     int64_t* height) {
  if (bytes.size() < 24 || bytes.substr(12, 4) != "IHDR") {
    return Bad(name, "a corrupt or truncated PNG: no IHDR chunk first");
  }
  auto be32 = [&](size_t at) {
    const auto* b = reinterpret_cast<const unsigned char*>(bytes.data() + at);
    return (int64_t{b[0]} << 24) | (int64_t{b[1]} << 16) | (int64_t{b[2]} << 8) | b[3];
  };
  *width = be32(16);
  *height = be32(20);
  return CheckSize(name, *width, *height);
}

bool IsJpeg(absl::string_view bytes) {
  return bytes.size() >= 3 && static_cast<unsigned char>(bytes[0]) == 0xff &&
         static_cast<unsigned char>(bytes[1]) == 0xd8 &&
         static_cast<unsigned char>(bytes[2]) == 0xff;
}

bool IsPng(absl::string_view bytes) {
  static constexpr unsigned char kPng[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  return bytes.size() >= sizeof(kPng) && std::memcmp(bytes.data(), kPng, sizeof(kPng)) == 0;
}

using TurboJpeg = std::unique_ptr<void, int (*)(tjhandle)>;

// A JPEG's size and colour space from its header, held to kMaxImagePixels.
absl::Status JpegHeader(tjhandle tj, absl::string_view bytes, absl::string_view name, int* width,
                        int* height, int* colorspace) {
  int subsamp = 0;
  if (tjDecompressHeader3(tj, reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(),
                          width, height, &subsamp, colorspace) != 0) {
    return Bad(name, absl::StrCat("not a JPEG it can read: ", tjGetErrorStr2(tj)));
  }
  return CheckSize(name, *width, *height);
}

absl::Status NotAnImage(absl::string_view bytes, absl::string_view name) {
  return Bad(name, bytes.empty() ? "an empty file, not an image"
                                 : "neither a JPEG nor a PNG (by its first bytes)");
}

absl::StatusOr<RgbImage> DecodeJpeg(absl::string_view bytes, absl::string_view name) {
  TurboJpeg tj(tjInitDecompress(), tjDestroy);
  if (tj == nullptr) return absl::InternalError("tjInitDecompress failed");
  auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
  int width = 0, height = 0, colorspace = 0;
  if (absl::Status s = JpegHeader(tj.get(), bytes, name, &width, &height, &colorspace); !s.ok()) {
    return s;
  }
  const size_t count = static_cast<size_t>(width) * height;
  // CMYK (and YCCK) as PIL reads them (ImageNet has a few): decoded to the
  // values stored, then to RGB below.
  const bool cmyk = colorspace == TJCS_CMYK || colorspace == TJCS_YCCK;
  RgbImage image;
  image.held = ImageDecodeBudget().Hold(count * (cmyk ? 7 : 3));
  std::vector<uint8_t> stored(cmyk ? count * 4 : 0);
  image.width = width;
  image.height = height;
  image.pixels.resize(count * 3);
  // Libjpeg's defaults, which PIL decodes with: the accurate integer IDCT
  // and smooth upsampling. A truncated or corrupt file is an error, not a
  // grey tail (TJFLAG_STOPONWARNING).
  if (tjDecompress2(tj.get(), data, bytes.size(), cmyk ? stored.data() : image.pixels.data(), width,
                    0, height, cmyk ? TJPF_CMYK : TJPF_RGB,
                    TJFLAG_ACCURATEDCT | TJFLAG_STOPONWARNING) != 0) {
    return Bad(name, absl::StrCat("a corrupt or truncated JPEG: ", tjGetErrorStr2(tj.get())));
  }
  if (cmyk) StoredCmykToRgb(stored.data(), count, image.pixels.data());
  return image;
}

// libpng reports errors by longjmp: everything with a destructor lives in
// DecodePng, which calls this only with plain pointers.
struct PngRead {
  const unsigned char* data;
  size_t size;
  size_t offset;
  char error[200];
};

void ReadFromMemory(png_structp png, png_bytep out, png_size_t length) {
  auto* read = static_cast<PngRead*>(png_get_io_ptr(png));
  if (length > read->size - read->offset) png_error(png, "the file ends inside the image");
  std::memcpy(out, read->data + read->offset, length);
  read->offset += length;
}

void OnPngError(png_structp png, png_const_charp message) {
  auto* read = static_cast<PngRead*>(png_get_error_ptr(png));
  std::snprintf(read->error, sizeof(read->error), "%s", message);
  png_longjmp(png, 1);
}

void OnPngWarning(png_structp, png_const_charp) {}

// `count` big-endian 16-bit grey values at `grey` to RGB at `rgb`, each
// clipped to 255 (PIL's "I" to "RGB"). In place too: `grey` the last
// 2 * count bytes of the 3 * count at `rgb`, since pixel i's RGB (bytes 3i
// to 3i + 3) never reaches pixel i + 1's grey (from count + 2i + 2).
void ClipGrey16ToRgb(const uint8_t* grey, size_t count, uint8_t* rgb) {
  for (size_t i = 0; i < count; ++i) {
    const unsigned v = (unsigned{grey[2 * i]} << 8) | grey[2 * i + 1];
    const uint8_t c = v > 255 ? 255 : static_cast<uint8_t>(v);
    rgb[3 * i] = rgb[3 * i + 1] = rgb[3 * i + 2] = c;
  }
}

// Decodes into `pixels` (an object of the caller's frame: a longjmp skips
// no destructor here); false with read->error set on failure.
bool DecodePngInto(PngRead* read, int* width, int* height, std::vector<uint8_t>* pixels) {
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, read, OnPngError, OnPngWarning);
  if (png == nullptr) {
    std::snprintf(read->error, sizeof(read->error), "out of memory");
    return false;
  }
  png_infop info = png_create_info_struct(png);
  // Set after setjmp and read after a longjmp: volatile.
  png_bytep* volatile rows = nullptr;
  if (info == nullptr || setjmp(png_jmpbuf(png))) {
    png_free(png, rows);
    png_destroy_read_struct(&png, &info, nullptr);
    if (read->error[0] == '\0') std::snprintf(read->error, sizeof(read->error), "out of memory");
    return false;
  }
  png_set_read_fn(png, read, ReadFromMemory);
  // A PNG's CRCs are checked; an ancillary chunk's bad CRC is an error too.
  png_set_crc_action(png, PNG_CRC_ERROR_QUIT, PNG_CRC_ERROR_QUIT);
  png_read_info(png, info);
  const png_uint_32 w = png_get_image_width(png, info);
  const png_uint_32 h = png_get_image_height(png, info);
  if (w == 0 || h == 0 || static_cast<int64_t>(w) * h > kMaxImagePixels) {
    std::snprintf(read->error, sizeof(read->error),
                  "the image is %ux%u, over the %lld pixels an image may have", w, h,
                  static_cast<long long>(kMaxImagePixels));
    png_destroy_read_struct(&png, &info, nullptr);
    return false;
  }
  // What PIL's convert("RGB") does: palette and low-bit grey expanded,
  // 16 bits to 8 (the high byte), grey repeated, alpha dropped. Except
  // 16-bit grey, which PIL opens as 32-bit integers ("I") and converts by
  // clipping to 255, not by its high byte: read as 16 bits, clipped below.
  const bool grey16 =
      png_get_color_type(png, info) == PNG_COLOR_TYPE_GRAY && png_get_bit_depth(png, info) == 16;
  png_set_expand(png);
  if (!grey16) {
    png_set_strip_16(png);
    png_set_gray_to_rgb(png);
  }
  png_set_strip_alpha(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  const size_t row_bytes = static_cast<size_t>(w) * (grey16 ? 2 : 3);
  if (png_get_rowbytes(png, info) != row_bytes) {
    std::snprintf(read->error, sizeof(read->error), "an unexpected PNG layout");
    png_destroy_read_struct(&png, &info, nullptr);
    return false;
  }
  // 16-bit grey is read into the buffer's last two thirds, then spread
  // into RGB in place.
  pixels->resize(static_cast<size_t>(w) * h * 3);
  uint8_t* const read_at = pixels->data() + (grey16 ? static_cast<size_t>(w) * h : 0);
  rows = static_cast<png_bytep*>(png_malloc(png, sizeof(png_bytep) * h));
  for (png_uint_32 y = 0; y < h; ++y) rows[y] = read_at + y * row_bytes;
  png_read_image(png, rows);
  png_read_end(png, nullptr);
  png_free(png, rows);
  rows = nullptr;
  png_destroy_read_struct(&png, &info, nullptr);
  if (grey16) ClipGrey16ToRgb(read_at, static_cast<size_t>(w) * h, pixels->data());
  *width = static_cast<int>(w);
  *height = static_cast<int>(h);
  return true;
}

absl::StatusOr<RgbImage> DecodePng(absl::string_view bytes, absl::string_view name) {
  int64_t width = 0, height = 0;
  if (absl::Status s = PngSize(bytes, name, &width, &height); !s.ok()) return s;
  PngRead read{reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), 0, {0}};
  RgbImage image;
  image.held = ImageDecodeBudget().Hold(static_cast<uint64_t>(width) * height * 3);
  if (!DecodePngInto(&read, &image.width, &image.height, &image.pixels))
    return Bad(name, absl::StrCat("a corrupt or truncated PNG: ", read.error));
  return image;
}

}  // namespace

std::shared_ptr<const void> DecodeBudget::Hold(uint64_t bytes) {
  {
    absl::MutexLock lock(&mu_);
    // Fits beside what is held, or, larger than the budget, goes alone.
    auto fits = [this, bytes]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return held_ + bytes <= budget_ || held_ == 0;
    };
    mu_.Await(absl::Condition(&fits));
    held_ += bytes;
    peak_ = std::max(peak_, held_);
  }
  return std::shared_ptr<const void>(static_cast<const void*>(this), [this, bytes](const void*) {
    absl::MutexLock lock(&mu_);
    held_ -= bytes;
  });
}

uint64_t DecodeBudget::held() const {
  absl::MutexLock lock(&mu_);
  return held_;
}

uint64_t DecodeBudget::peak() const {
  absl::MutexLock lock(&mu_);
  return peak_;
}

DecodeBudget& ImageDecodeBudget() {
  static DecodeBudget* budget = new DecodeBudget(kDecodeBudgetBytes);
  return *budget;
}

absl::Status CheckImageHeader(absl::string_view bytes, absl::string_view name) {
  if (IsJpeg(bytes)) {
    TurboJpeg tj(tjInitDecompress(), tjDestroy);
    if (tj == nullptr) return absl::InternalError("tjInitDecompress failed");
    int width = 0, height = 0, colorspace = 0;
    return JpegHeader(tj.get(), bytes, name, &width, &height, &colorspace);
  }
  int64_t width = 0, height = 0;
  if (IsPng(bytes)) return PngSize(bytes, name, &width, &height);
  return NotAnImage(bytes, name);
}

absl::StatusOr<RgbImage> DecodeImage(absl::string_view bytes, absl::string_view name) {
  if (IsJpeg(bytes)) return DecodeJpeg(bytes, name);
  if (IsPng(bytes)) return DecodePng(bytes, name);
  return NotAnImage(bytes, name);
}

namespace {

absl::StatusOr<std::string> ReadImageFile(const std::string& path, uint64_t expected_size) {
  constexpr uint64_t max_bytes = kMaxImageFileBytes;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return Bad(path, absl::StrCat("can't open: ", std::strerror(errno)));
  std::unique_ptr<int, void (*)(int*)> closer(new int(fd), [](int* f) {
    ::close(*f);
    delete f;
  });
  struct stat st;
  if (::fstat(fd, &st) != 0) return Bad(path, absl::StrCat("can't stat: ", std::strerror(errno)));
  if (!S_ISREG(st.st_mode)) return Bad(path, "not a regular file");
  if (expected_size != 0 && static_cast<uint64_t>(st.st_size) != expected_size) {
    return Bad(path, absl::StrCat("the file has ", st.st_size, " bytes, not the ", expected_size,
                                  " it had when its folder was listed: it changed since"));
  }
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    return Bad(path, absl::StrCat("the file is ", st.st_size, " bytes, over the ", max_bytes,
                                  " an image file may have"));
  }
  std::string bytes(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < bytes.size()) {
    const ssize_t n = ::read(fd, bytes.data() + got, bytes.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Bad(path, absl::StrCat("can't read: ", std::strerror(errno)));
    if (n == 0) return Bad(path, "the file shrank while it was read");
    got += static_cast<size_t>(n);
  }
  return bytes;
}

}  // namespace

absl::StatusOr<RgbImage> ReadImage(const std::string& path, uint64_t expected_size) {
  absl::StatusOr<std::string> bytes = ReadImageFile(path, expected_size);
  if (!bytes.ok()) return bytes.status();
  return DecodeImage(*bytes, path);
}

absl::Status CheckImageFile(const std::string& path, uint64_t expected_size) {
  absl::StatusOr<std::string> bytes = ReadImageFile(path, expected_size);
  if (!bytes.ok()) return bytes.status();
  return CheckImageHeader(*bytes, path);
}

}  // namespace ddp
