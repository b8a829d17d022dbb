// Reads an image folder as the loader does and prints what the parity test
// compares with torchvision's ImageFolder: one JSON line per sample (its
// path and label), and, for the indices named, the transformed tensor as
// float32 CHW appended to OUT (its shape and offset in the line).
//
//   ddp_image_folder_probe ROOT OUT [OP...] [--normalize M0 M1 M2 S0 S1 S2] [INDEX...]
//
// OPs, applied in order: --crop H W (CenterCrop), --resize H W,
// --resize_shorter S, --crop_at TOP LEFT H W, --hflip.
//
// Exit 2 with the loader's error on stderr (a bad folder or file).
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "worker/data/image_decode.h"
#include "worker/data/image_folder.h"
#include "worker/data/image_transforms.h"

namespace {

std::string Json(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: ddp_image_folder_probe ROOT OUT [--crop H W] [--resize H W] "
                 "[--resize_shorter S] [--crop_at T L H W] [--hflip] "
                 "[--normalize M0 M1 M2 S0 S1 S2] [INDEX...]\n";
    return 1;
  }
  const std::string root = argv[1];
  std::ofstream out(argv[2], std::ios::binary);
  std::vector<std::function<ddp::RgbImage(const ddp::RgbImage&)>> ops;
  std::optional<ddp::Normalization> normalize;
  std::set<size_t> wanted;
  auto num = [&](int i) { return std::atoi(argv[i]); };
  for (int i = 3; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--crop" && i + 2 < argc) {
      const int h = num(i + 1), w = num(i + 2);
      ops.push_back([h, w](const ddp::RgbImage& im) { return ddp::CenterCrop(im, h, w); });
      i += 2;
    } else if (arg == "--resize" && i + 2 < argc) {
      const int h = num(i + 1), w = num(i + 2);
      ops.push_back([h, w](const ddp::RgbImage& im) { return ddp::Resize(im, h, w); });
      i += 2;
    } else if (arg == "--resize_shorter" && i + 1 < argc) {
      const int size = num(i + 1);
      ops.push_back([size](const ddp::RgbImage& im) { return ddp::ResizeShorter(im, size); });
      i += 1;
    } else if (arg == "--crop_at" && i + 4 < argc) {
      const int t = num(i + 1), l = num(i + 2), h = num(i + 3), w = num(i + 4);
      ops.push_back([=](const ddp::RgbImage& im) { return ddp::Crop(im, t, l, h, w); });
      i += 4;
    } else if (arg == "--hflip") {
      ops.push_back([](const ddp::RgbImage& im) { return ddp::HorizontalFlip(im); });
    } else if (arg == "--normalize" && i + 6 < argc) {
      ddp::Normalization n;
      for (int c = 0; c < 3; ++c) n.mean[c] = std::strtof(argv[i + 1 + c], nullptr);
      for (int c = 0; c < 3; ++c) n.std[c] = std::strtof(argv[i + 4 + c], nullptr);
      normalize = n;
      i += 6;
    } else {
      wanted.insert(std::strtoull(argv[i], nullptr, 10));
    }
  }
  absl::StatusOr<ddp::ImageFolder> folder = ddp::ImageFolder::Scan(root);
  if (!folder.ok()) {
    std::cerr << folder.status().message() << "\n";
    return 2;
  }
  uint64_t offset = 0;
  for (size_t i = 0; i < folder->size(); ++i) {
    const ddp::ImageSample& s = folder->samples()[i];
    std::cout << "{\"index\": " << i << ", \"path\": " << Json(s.path)
              << ", \"label\": " << s.label;
    if (wanted.count(i) > 0) {
      absl::StatusOr<ddp::RgbImage> image = ddp::ReadImage(s.path);
      if (!image.ok()) {
        std::cerr << image.status().message() << "\n";
        return 2;
      }
      ddp::RgbImage shown = *image;
      for (const auto& op : ops) shown = op(shown);
      const std::vector<float> t = ddp::ToTensorChw(shown, normalize);
      out.write(reinterpret_cast<const char*>(t.data()),
                static_cast<std::streamsize>(t.size() * sizeof(float)));
      std::cout << ", \"shape\": [3, " << shown.height << ", " << shown.width
                << "], \"offset\": " << offset;
      offset += t.size() * sizeof(float);
    }
    std::cout << "}\n";
  }
  return 0;
}
