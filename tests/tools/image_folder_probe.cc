// Reads an image folder as the loader does and prints what the parity test
// compares with torchvision's ImageFolder: one JSON line per sample (its
// path and label), and, for the indices named, the transformed tensor as
// float32 CHW appended to OUT (its shape and offset in the line).
//
//   ddp_image_folder_probe ROOT OUT [--crop H W] [--normalize M0 M1 M2 S0 S1 S2] [INDEX...]
//
// Exit 2 with the loader's error on stderr (a bad folder or file).
#include <cstdio>
#include <cstdlib>
#include <fstream>
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
    std::cerr << "usage: ddp_image_folder_probe ROOT OUT [--crop H W] "
                 "[--normalize M0 M1 M2 S0 S1 S2] [INDEX...]\n";
    return 1;
  }
  const std::string root = argv[1];
  std::ofstream out(argv[2], std::ios::binary);
  std::optional<std::pair<int, int>> crop;
  std::optional<ddp::Normalization> normalize;
  std::set<size_t> wanted;
  for (int i = 3; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--crop" && i + 2 < argc) {
      crop = {std::atoi(argv[i + 1]), std::atoi(argv[i + 2])};
      i += 2;
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
      ddp::RgbImage shown = crop ? ddp::CenterCrop(*image, crop->first, crop->second) : *image;
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
