// torchvision.transforms on a decoded image, with their semantics and
// parameter names, so that a batch equals what torchvision would make of
// the same files: Resize (Pillow's bilinear resampling with its antialias
// and fixed-point rounding, which torchvision uses for PIL images),
// CenterCrop (padding with zeros when the image is smaller, the offset
// rounded as Python rounds), crops at given places (RandomResizedCrop's
// work once its parameters are drawn), horizontal flips, then ToTensor (CHW,
// in [0, 1]) and Normalize (per-channel mean and std).
//
// No LibTorch: the output is float32 CHW in a plain buffer.
//
// Speed: the resize passes run on SSE2 (x86-64's baseline) where the
// compiler targets it, on 16-bit multiplies that still add up Pillow's
// 32-bit integer sums exactly; elsewhere the same sums are scalar.
#ifndef DDP_WORKER_DATA_IMAGE_TRANSFORMS_H_
#define DDP_WORKER_DATA_IMAGE_TRANSFORMS_H_

#include <array>
#include <optional>
#include <vector>

#include "worker/data/image_decode.h"

namespace ddp {

// transforms.CenterCrop((height, width)).
RgbImage CenterCrop(const RgbImage& image, int height, int width);

// Pillow's Image.resize((width, height), Image.BILINEAR): what
// transforms.Resize((height, width)) does to a PIL image.
RgbImage Resize(const RgbImage& image, int height, int width);

// F.resized_crop(img, top, left, crop_height, crop_width, [height, width]):
// Resize(Crop(...)) without copying the crop first. The crop must lie
// within the image.
RgbImage ResizedCrop(const RgbImage& image, int top, int left, int crop_height, int crop_width,
                     int height, int width);

// transforms.Resize(size) with one number: the shorter side becomes `size`,
// the longer in proportion (truncated, as torchvision computes it).
RgbImage ResizeShorter(const RgbImage& image, int size);

// F.crop(img, top, left, height, width) within the image (a part outside
// it is zeros, as Pillow's crop gives).
RgbImage Crop(const RgbImage& image, int top, int left, int height, int width);

// F.hflip.
RgbImage HorizontalFlip(const RgbImage& image);

struct Normalization {
  std::array<float, 3> mean;
  std::array<float, 3> std;
};

// transforms.ToTensor(), then transforms.Normalize(mean, std) when given:
// 3 x height x width floats.
std::vector<float> ToTensorChw(const RgbImage& image,
                               const std::optional<Normalization>& normalize = std::nullopt);

// ToTensorChw into `out` (3 x height x width floats, the caller's), of the
// image mirrored left to right when `flipped` (F.hflip fused in: no copy).
void ToTensorChwInto(const RgbImage& image, const std::optional<Normalization>& normalize,
                     bool flipped, float* out);

// ToTensorChwInto(ResizedCrop(...)), each resized row written on into the
// tensor as it is made: no image between.
void ResizedCropToTensor(const RgbImage& image, int top, int left, int crop_height, int crop_width,
                         int height, int width, const std::optional<Normalization>& normalize,
                         bool flipped, float* out);

}  // namespace ddp

#endif  // DDP_WORKER_DATA_IMAGE_TRANSFORMS_H_
