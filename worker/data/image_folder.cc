#include "worker/data/image_folder.h"

#include <openssl/evp.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <memory>
#include <system_error>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"

namespace ddp {
namespace {

namespace fs = std::filesystem;

// torchvision's IMG_EXTENSIONS, and the ones of them decoded here.
constexpr const char* kTorchvisionExtensions[] = {".jpg", ".jpeg", ".png",  ".ppm", ".bmp",
                                                  ".pgm", ".tif",  ".tiff", ".webp"};
constexpr const char* kDecodable[] = {".jpg", ".jpeg", ".png"};

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool EndsWithAny(const std::string& lower, absl::Span<const char* const> endings) {
  return std::any_of(endings.begin(), endings.end(),
                     [&](const char* e) { return absl::EndsWith(lower, e); });
}

// os.path.join(a, b) for a relative b.
std::string Join(const std::string& a, const std::string& b) {
  return a.empty() || a.back() == '/' ? a + b : absl::StrCat(a, "/", b);
}

// Every directory under `top` (itself included), links followed, as
// os.walk(top, followlinks=True) lists them, sorted by path; for each, its
// non-directory entries sorted by name. A link to a folder above it would
// make os.walk loop for ever; here a directory that is its own ancestor (by
// device and inode) is not entered again.
struct Walked {
  std::string dir;
  std::vector<std::string> files;
};

using Inode = std::pair<uint64_t, uint64_t>;

absl::Status Walk(const std::string& top, std::vector<Walked>* out) {
  struct Pending {
    std::string dir;
    std::vector<Inode> ancestors;
  };
  std::vector<Pending> pending = {{top, {}}};
  while (!pending.empty()) {
    Pending next = std::move(pending.back());
    pending.pop_back();
    struct stat st;
    if (::stat(next.dir.c_str(), &st) != 0) continue;  // gone since it was listed
    const Inode inode{st.st_dev, st.st_ino};
    if (std::find(next.ancestors.begin(), next.ancestors.end(), inode) != next.ancestors.end()) {
      continue;  // a link loop
    }
    next.ancestors.push_back(inode);
    std::error_code ec;
    const fs::directory_iterator it(next.dir, ec);
    if (ec) {
      return absl::InvalidArgumentError(
          absl::StrCat("image folder: can't list ", next.dir, ": ", ec.message()));
    }
    Walked walked{next.dir, {}};
    for (const fs::directory_entry& entry : it) {
      const std::string name = entry.path().filename().string();
      std::error_code type_ec;
      if (entry.is_directory(type_ec)) {  // follows links, as os.scandir's is_dir() does
        pending.push_back({Join(next.dir, name), next.ancestors});
      } else {
        walked.files.push_back(name);
      }
    }
    std::sort(walked.files.begin(), walked.files.end());
    out->push_back(std::move(walked));
    if (out->size() > ImageFolder::kMaxSamples) {
      return absl::InvalidArgumentError(absl::StrCat(
          "image folder: more than ", ImageFolder::kMaxSamples, " folders under ", top));
    }
  }
  std::sort(out->begin(), out->end(),
            [](const Walked& a, const Walked& b) { return a.dir < b.dir; });
  return absl::OkStatus();
}

}  // namespace

std::string ImageFolder::ListingDigest(const std::string& root) const {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
  EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr);
  const std::string prefix = Join(root, "");
  for (const ImageSample& sample : samples_) {
    const std::string line = absl::StrCat(
        absl::StartsWith(sample.path, prefix) ? sample.path.substr(prefix.size()) : sample.path,
        "\t", sample.size, "\t", sample.label, "\n");
    EVP_DigestUpdate(ctx.get(), line.data(), line.size());
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_DigestFinal_ex(ctx.get(), digest, &length);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<char*>(digest), length));
}

absl::StatusOr<ImageFolder> ImageFolder::Scan(const std::string& root, uint64_t limit,
                                              OtherFormats others) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("image folder: ", root, " is not a folder",
                     ec ? absl::StrCat(" (", ec.message(), ")") : std::string()));
  }
  ImageFolder folder;
  const fs::directory_iterator it(root, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("image folder: can't list ", root, ": ", ec.message()));
  }
  for (const fs::directory_entry& entry : it) {
    std::error_code type_ec;
    if (entry.is_directory(type_ec)) folder.classes_.push_back(entry.path().filename().string());
  }
  std::sort(folder.classes_.begin(), folder.classes_.end());
  if (folder.classes_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("image folder: no class folder in ", root,
                                                   " (it needs one folder per class: ROOT/CLASS/"
                                                   "IMAGE.jpg)"));
  }
  std::vector<std::string> empty;
  for (size_t label = 0; label < folder.classes_.size(); ++label) {
    std::vector<Walked> walked;
    if (absl::Status s = Walk(Join(root, folder.classes_[label]), &walked); !s.ok()) return s;
    const size_t before = folder.samples_.size();
    for (const Walked& dir : walked) {
      for (const std::string& name : dir.files) {
        const std::string lower = Lower(name);
        if (!EndsWithAny(lower, kTorchvisionExtensions)) continue;
        const std::string path = Join(dir.dir, name);
        if (!EndsWithAny(lower, kDecodable) && others == OtherFormats::kRefuse) {
          return absl::InvalidArgumentError(absl::StrCat(
              "image folder: ", path,
              " is an image torchvision's ImageFolder would read, but this loader decodes JPEG "
              "and PNG only: convert it, move it out of the folder, or set "
              "dataset.skipBadSamples to have such images replaced like bad ones (every other "
              "image keeps its torchvision index)"));
        }
        if (folder.samples_.size() == kMaxSamples) {
          return absl::InvalidArgumentError(
              absl::StrCat("image folder: more than ", kMaxSamples, " images under ", root));
        }
        struct stat file;
        const uint64_t size = ::stat(path.c_str(), &file) == 0 ? file.st_size : 0;
        folder.samples_.push_back({path, static_cast<int64_t>(label), size});
      }
    }
    if (folder.samples_.size() == before) empty.push_back(folder.classes_[label]);
  }
  if (!empty.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("image folder: no image (.jpg, .jpeg, .png) in the class folder(s) ",
                     absl::StrJoin(empty, ", "), " of ", root,
                     ": every class needs at least one, as torchvision's ImageFolder requires"));
  }
  if (limit > 0 && limit < folder.samples_.size()) folder.samples_.resize(limit);
  return folder;
}

}  // namespace ddp
