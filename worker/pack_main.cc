// ddp-pack: writes what dataset.kind "shards" and dataset.manifest read
// (worker/data/pack_index.h).
//
//   ddp-pack images ROOT OUT_DIR   an image folder's files (torchvision
//                                  ImageFolder's order, labels and classes)
//                                  into record shards: sample i of the
//                                  shards is sample i of the folder
//   ddp-pack tensors FILE OUT_DIR  an (x, y) torch.save'd file's samples as
//                                  float32 records
//   ddp-pack manifest ROOT FILE    an image folder's manifest: every image's
//                                  name, size and CRC-32, in index order
//   ddp-pack show INDEX            what an index or manifest holds
//
// Shards are about --shard_mb megabytes each (default 256); OUT_DIR must be
// empty or new. Exit 0 on success, 1 with the reason on stderr.
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/process.h"
#include "worker/data/image_decode.h"
#include "worker/data/image_folder.h"
#include "worker/data/pack_index.h"
#include "worker/dataset.h"

ABSL_FLAG(double, shard_mb, 256, "about this many megabytes per shard");
ABSL_FLAG(bool, keep_undecodable, false,
          "pack images that do not decode as JPEG or PNG anyway (named on stderr), and images of "
          "other formats torchvision reads (.webp, .bmp, .tif, ...) in their place: a job with "
          "dataset.skipBadSamples replaces them; by default ddp-pack refuses them, naming the "
          "first");

namespace {

constexpr char kUsage[] =
    "ddp-pack: writes record shards and manifests for dataset.kind \"shards\" and "
    "dataset.manifest\n"
    "  ddp-pack images ROOT OUT_DIR    an image folder's files (torchvision ImageFolder's order, "
    "labels and classes) into record shards\n"
    "  ddp-pack tensors FILE OUT_DIR   a torch.save'd (x, y) file's samples as float32 records\n"
    "  ddp-pack manifest ROOT FILE     an image folder's manifest: every image's name, size and "
    "CRC-32\n"
    "  ddp-pack show INDEX             what an index or manifest holds\n"
    "OUT_DIR (and its parents) are made if missing; it must be empty.";

// `dir`, made if missing (its parents too), and empty: a pack never mixes
// with other files.
absl::Status MakeFolder(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    return absl::FailedPreconditionError(absl::StrCat(dir, ": can't be made: ", ec.message()));
  if (!std::filesystem::is_empty(dir, ec) || ec) {
    return absl::FailedPreconditionError(
        absl::StrCat(dir, ": is not an empty folder (pack into an empty or new one)"));
  }
  return absl::OkStatus();
}

// --shard_mb in bytes, within [0, 1 TiB] (0: a shard per record; NaN as 0).
uint64_t ShardBytes() {
  const double mb = absl::GetFlag(FLAGS_shard_mb);
  return static_cast<uint64_t>((mb > 0 ? std::min(mb, 1048576.0) : 0.0) * (1 << 20));
}

// --keep_undecodable keeps images of other formats in their place too.
ddp::OtherFormats Others() {
  return absl::GetFlag(FLAGS_keep_undecodable) ? ddp::OtherFormats::kKeep
                                               : ddp::OtherFormats::kRefuse;
}

absl::StatusOr<uint64_t> PackImages(const std::string& root, const std::string& out) {
  absl::StatusOr<ddp::ImageFolder> folder = ddp::ImageFolder::Scan(root, 0, Others());
  if (!folder.ok()) return folder.status();
  if (absl::Status s = MakeFolder(out); !s.ok()) return s;
  ddp::PackWriter writer(out, ddp::kPayloadImage, {}, folder->classes(), ShardBytes());
  const std::string prefix = absl::StrCat(root, absl::EndsWith(root, "/") ? "" : "/");
  uint64_t kept_bad = 0;
  for (const ddp::ImageSample& sample : folder->samples()) {
    absl::StatusOr<std::string> bytes = ddp::ReadWholeFile(sample.path);
    if (!bytes.ok()) return bytes.status();
    // A record the training can't decode is found now, not at its epoch.
    if (absl::StatusOr<ddp::RgbImage> decoded = ddp::DecodeImage(*bytes, sample.path);
        !decoded.ok()) {
      if (!absl::GetFlag(FLAGS_keep_undecodable)) {
        return absl::InvalidArgumentError(absl::StrCat(
            decoded.status().message(),
            "; convert or remove it, or pack it anyway with --keep_undecodable (a job with "
            "dataset.skipBadSamples then replaces it)"));
      }
      std::cerr << "ddp-pack: keeping an undecodable image: " << decoded.status().message() << "\n";
      ++kept_bad;
    }
    const std::string relative =
        absl::StartsWith(sample.path, prefix) ? sample.path.substr(prefix.size()) : sample.path;
    if (absl::Status s = writer.Add(*bytes, static_cast<uint32_t>(sample.label), relative);
        !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(sample.path, ": ", s.message()));
    }
  }
  if (kept_bad > 0) std::cerr << "ddp-pack: " << kept_bad << " undecodable image(s) kept\n";
  return writer.Finish(absl::StrCat("image folder ", root));
}

absl::StatusOr<uint64_t> PackTensors(const std::string& file, const std::string& out) {
  ddp::v1::DatasetSpec spec;
  spec.set_kind("tensors");
  spec.set_path(file);
  absl::StatusOr<ddp::Dataset> data = ddp::LoadDataset(spec, 0);
  if (!data.ok()) return data.status();
  if (absl::Status s = MakeFolder(out); !s.ok()) return s;
  std::vector<uint32_t> shape;
  for (int64_t d : data->sample_shape()) shape.push_back(static_cast<uint32_t>(d));
  std::vector<std::string> classes;
  for (int64_t c = 0; c < data->num_classes; ++c) classes.push_back(absl::StrCat(c));
  ddp::PackWriter writer(out, ddp::kPayloadFloat32, shape, classes, ShardBytes());
  const at::Tensor x = data->train_x.contiguous();
  const at::Tensor y = data->train_y.contiguous();
  const int64_t n = x.size(0);
  const size_t row = static_cast<size_t>(x.numel() / std::max<int64_t>(n, 1)) * sizeof(float);
  const char* bytes = static_cast<const char*>(x.data_ptr());
  const int64_t* labels = y.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    if (absl::Status s =
            writer.Add(absl::string_view(bytes + i * row, row), static_cast<uint32_t>(labels[i]));
        !s.ok()) {
      return s;
    }
  }
  return writer.Finish(absl::StrCat("tensors ", file));
}

absl::StatusOr<uint64_t> WriteManifest(const std::string& root, const std::string& out) {
  absl::StatusOr<ddp::ImageFolder> folder = ddp::ImageFolder::Scan(root, 0, Others());
  if (!folder.ok()) return folder.status();
  absl::StatusOr<ddp::v1::PackIndex> manifest = ddp::MakeImageManifest(*folder, root);
  if (!manifest.ok()) return manifest.status();
  if (const std::filesystem::path parent = std::filesystem::path(out).parent_path();
      !parent.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(parent, ec);
    if (ec) {
      return absl::FailedPreconditionError(
          absl::StrCat(parent.string(), ": can't be made: ", ec.message()));
    }
  }
  if (absl::Status s = ddp::WritePackIndex(*manifest, out); !s.ok()) return s;
  return static_cast<uint64_t>(manifest->record_file_size());
}

absl::Status Show(const std::string& path) {
  absl::StatusOr<std::string> bytes = ddp::ReadWholeFile(path);
  if (!bytes.ok()) return bytes.status();
  absl::StatusOr<ddp::v1::PackIndex> index = ddp::ParsePackIndex(*bytes, path);
  if (!index.ok()) return index.status();
  uint64_t total = 0;
  for (uint32_t length : index->record_length()) total += length;
  std::cout << path << ": " << index->record_file_size() << " " << index->payload() << " samples ("
            << total << " bytes) in " << index->files_size() << " files, " << index->classes_size()
            << " classes; from " << index->source() << "\n";
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args = ddp::ParseFlagsAndArgumentsOrExit(argc, argv, kUsage);
  args.insert(args.begin(), argv[0]);
  const std::string command = args.size() > 1 ? args[1] : "";
  absl::StatusOr<uint64_t> packed = uint64_t{0};
  if (command == "images" && args.size() == 4) {
    packed = PackImages(args[2], args[3]);
  } else if (command == "tensors" && args.size() == 4) {
    packed = PackTensors(args[2], args[3]);
  } else if (command == "manifest" && args.size() == 4) {
    packed = WriteManifest(args[2], args[3]);
  } else if (command == "show" && args.size() == 3) {
    if (absl::Status s = Show(args[2]); !s.ok()) packed = s;
  } else {
    std::cerr << "usage: " << absl::ProgramUsageMessage() << "\nsee ddp-pack --help\n";
    return 2;
  }
  if (!packed.ok()) {
    std::cerr << "ddp-pack: " << packed.status().message() << "\n";
    return 1;
  }
  if (command != "show") std::cout << "ddp-pack: " << *packed << " samples in " << args[3] << "\n";
  return 0;
}
