#include "worker/data/packed_source.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/data/image_decode.h"
#include "worker/data/image_sample.h"
#include "worker/data/pack_index.h"

namespace ddp {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "float32 records are little-endian");

// Packs of at most this many files keep them open; more (an image folder's
// manifest, many shards) open each file as it is read (an open and an
// fstat, a few microseconds beside a decode), so that a pack never takes
// more than a few of the process's descriptors (the job check's helper may
// hold 64).
constexpr int kMaxOpenFiles = 16;

// `path` opened for reading as the regular file of `size` bytes its index
// lists. Links are followed, as torchvision follows them in an image
// folder: what is read is held to its CRC-32, and the worker's confinement
// keeps a link from leading out of the dataset.
absl::StatusOr<int> OpenListed(const std::string& path, uint64_t size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": can't be opened: ", std::strerror(errno),
        errno == ENOENT ? " (it was there when its index was made: it vanished since)" : ""));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) != size) {
    const uint64_t now = static_cast<uint64_t>(st.st_size);
    ::close(fd);
    return absl::InvalidArgumentError(
        !S_ISREG(st.st_mode)
            ? absl::StrCat(path, ": is not a regular file")
            : absl::StrCat(path, ": has ", now, " bytes, not the ", size,
                           " its index lists: it changed since the index was made"));
  }
  return fd;
}

}  // namespace

PackedSource::PackedSource(v1::PackIndex index, std::string folder, ImagePipeline pipeline,
                           uint64_t seed)
    : index_(std::move(index)),
      folder_(std::move(folder)),
      pipeline_(std::move(pipeline)),
      seed_(seed),
      image_(index_.payload() == kPayloadImage),
      classes_(index_.classes().begin(), index_.classes().end()) {}

PackedSource::~PackedSource() {
  for (int fd : fds_) ::close(fd);
}

absl::StatusOr<std::shared_ptr<const PackedSource>> PackedSource::Open(v1::PackIndex index,
                                                                       std::string folder,
                                                                       ImagePipeline pipeline,
                                                                       uint64_t seed) {
  if (absl::Status s = ValidatePipeline(pipeline); !s.ok()) return s;
  const bool image = index.payload() == kPayloadImage;
  if (!image && (!pipeline.steps.empty() || pipeline.normalize.has_value())) {
    return absl::InvalidArgumentError(
        "this pack holds float32 samples, used as they are: transforms and normalize are for "
        "packed images");
  }
  std::shared_ptr<PackedSource> source(
      new PackedSource(std::move(index), std::move(folder), std::move(pipeline), seed));
  if (source->index_.files_size() <= kMaxOpenFiles) {
    for (int f = 0; f < source->index_.files_size(); ++f) {
      absl::StatusOr<int> fd = OpenListed(source->FilePath(f), source->index_.files(f).size());
      if (!fd.ok()) return fd.status();
      source->fds_.push_back(*fd);
    }
  }
  if (image) {
    absl::StatusOr<std::string> bytes = source->ReadRecord(0);
    if (!bytes.ok()) return bytes.status();
    absl::StatusOr<RgbImage> decoded = DecodeImage(*bytes, source->RecordName(0));
    if (!decoded.ok()) return decoded.status();
    source->shape_ = TransformedShape(source->pipeline_, *std::move(decoded), seed);
  } else {
    source->shape_.assign(source->index_.sample_shape().begin(),
                          source->index_.sample_shape().end());
  }
  return std::shared_ptr<const PackedSource>(std::move(source));
}

std::string PackedSource::FilePath(uint32_t file) const {
  return absl::StrCat(folder_, "/", index_.files(static_cast<int>(file)).name());
}

std::string PackedSource::RecordName(int64_t i) const {
  const int r = static_cast<int>(i);
  const std::string path = FilePath(index_.record_file(r));
  if (r < index_.record_source_size()) {
    // Named by the image it was packed from.
    return absl::StrCat(path, " (record ", i, ", packed from ", index_.record_source(r), ")");
  }
  if (index_.record_offset(r) == 0 &&
      index_.record_length(r) == index_.files(static_cast<int>(index_.record_file(r))).size()) {
    return path;
  }
  return absl::StrCat(path, " (record ", i, ")");
}

absl::StatusOr<std::string> PackedSource::ReadRecord(int64_t i) const {
  const int r = static_cast<int>(i);
  const uint32_t file = index_.record_file(r);
  int fd = -1;
  if (!fds_.empty()) {
    fd = fds_[file];
  } else {
    absl::StatusOr<int> opened = OpenListed(FilePath(file), index_.files(file).size());
    if (!opened.ok()) return opened.status();
    fd = *opened;
  }
  std::string bytes(index_.record_length(r), '\0');
  size_t done = 0;
  int error = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::pread(fd, bytes.data() + done, bytes.size() - done,
                              static_cast<off_t>(index_.record_offset(r) + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      error = n < 0 ? errno : 0;
      break;
    }
    done += static_cast<size_t>(n);
  }
  if (fds_.empty()) ::close(fd);
  if (done < bytes.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        RecordName(i), ": ",
        error
            ? absl::StrCat("can't be read: ", std::strerror(error))
            : std::string("is shorter than its index says: it changed since the index was made")));
  }
  if (Crc32(bytes) != index_.record_crc32(r)) {
    return absl::InvalidArgumentError(
        absl::StrCat(RecordName(i),
                     ": its bytes are not those its index lists (CRC-32 mismatch): it changed "
                     "or was damaged since the index was made"));
  }
  return bytes;
}

absl::StatusOr<int64_t> PackedSource::Read(int64_t index, uint64_t epoch, float* out) const {
  if (index < 0 || index >= static_cast<int64_t>(size())) {
    return absl::OutOfRangeError(absl::StrCat("sample ", index, " of ", size()));
  }
  absl::StatusOr<std::string> bytes = ReadRecord(index);
  if (!bytes.ok()) return bytes.status();
  const int64_t label = index_.record_label(static_cast<int>(index));
  if (!image_) {
    std::memcpy(out, bytes->data(), bytes->size());
    return label;
  }
  const std::string name = RecordName(index);
  absl::StatusOr<RgbImage> decoded = DecodeImage(*bytes, name);
  if (!decoded.ok()) return decoded.status();
  if (absl::Status s =
          TransformInto(pipeline_, *std::move(decoded), seed_, epoch, index, shape_, name, out);
      !s.ok()) {
    return s;
  }
  return label;
}

absl::Status PackedSource::Check(int64_t index) const {
  if (index < 0 || index >= static_cast<int64_t>(size())) {
    return absl::OutOfRangeError(absl::StrCat("sample ", index, " of ", size()));
  }
  absl::StatusOr<std::string> bytes = ReadRecord(index);
  if (!bytes.ok()) return bytes.status();
  return image_ ? CheckImageHeader(*bytes, RecordName(index)) : absl::OkStatus();
}

}  // namespace ddp
