#include "worker/input_files.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace ddp {
namespace {

absl::Status Refuse(absl::string_view field, absl::string_view path, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", path, " ", why));
}

// `real`'s bytes as an input, refusals in the loaders' words.
absl::StatusOr<std::string> ReadRegular(absl::string_view field, const std::string& shown,
                                        const std::string& real, uint64_t max_bytes,
                                        std::optional<uint64_t> expected_size) {
  RegularFileRead read = ReadRegularFile(real, max_bytes, expected_size);
  using R = RegularFileRead::Refusal;
  switch (read.refusal) {
    case R::kNone:
      return std::move(read.bytes);
    case R::kLink:
      return Refuse(field, shown,
                    absl::StrCat("(", real,
                                 ") is now a symbolic link; it was a file when the job "
                                 "was checked"));
    case R::kCantOpen:
      return Refuse(field, shown, absl::StrCat("can't be opened: ", std::strerror(read.error)));
    case R::kNotRegular:
      return Refuse(field, shown, absl::StrCat("is ", FileKind(read.mode), ", not a regular file"));
    case R::kTooLarge:
      return Refuse(field, shown,
                    absl::StrCat("has ", read.size, " bytes; the limit is ", max_bytes));
    case R::kWrongSize:
      return Refuse(field, shown,
                    absl::StrCat("has ", read.size, " bytes, not the ", *expected_size,
                                 " it had when the job was checked: it changed since"));
    case R::kCantRead:
      return Refuse(field, shown, absl::StrCat("can't be read: ", std::strerror(read.error)));
    case R::kChanged:
      return Refuse(field, shown, "changed size while being read");
  }
  return absl::InternalError("unreachable");
}

}  // namespace

const char* FileKind(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

RegularFileRead ReadRegularFile(const std::string& path, uint64_t max_bytes,
                                std::optional<uint64_t> exact_size) {
  using R = RegularFileRead::Refusal;
  RegularFileRead read;
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    read.error = errno;
    read.refusal = read.error == ELOOP ? R::kLink : R::kCantOpen;
    return read;
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    read.error = errno;
    read.refusal = R::kCantOpen;
    return read;
  }
  read.mode = st.st_mode;
  read.size = static_cast<uint64_t>(st.st_size);
  if (!S_ISREG(st.st_mode)) {
    read.refusal = R::kNotRegular;
  } else if (read.size > max_bytes) {
    read.refusal = R::kTooLarge;
  } else if (exact_size.has_value() && read.size != *exact_size) {
    read.refusal = R::kWrongSize;
  }
  if (read.refusal != R::kNone) return read;
  read.bytes.resize(read.size);
  uint64_t got = 0;
  while (got < read.size) {
    const ssize_t n = ::read(fd, read.bytes.data() + got, read.size - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      read.error = errno;
      read.refusal = R::kCantRead;
      return read;
    }
    if (n == 0) break;
    got += static_cast<uint64_t>(n);
  }
  char extra;
  if (got != read.size || ::read(fd, &extra, 1) > 0) read.refusal = R::kChanged;
  if (read.refusal != R::kNone) read.bytes.clear();
  return read;
}

std::string Sha256Hex(absl::string_view bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_Digest(bytes.data(), bytes.size(), digest, &length, EVP_sha256(), nullptr);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(digest), length));
}

InputFiles::InputFiles(const google::protobuf::RepeatedPtrField<v1::InputFile>& pins)
    : verifying_(!pins.empty()) {
  for (const v1::InputFile& pin : pins) {
    pins_[pin.path()] = pin;
    order_.push_back(pin.path());
  }
}

absl::StatusOr<std::string> InputFiles::Read(absl::string_view field, const std::string& path,
                                             uint64_t max_bytes) {
  auto pinned = pins_.find(path);
  if (pinned == pins_.end()) {
    if (verifying_) {
      return Refuse(field, path, "was not among the files checked when the job was submitted");
    }
    // First read (the check, or an unpinned job): where the path leads now.
    std::unique_ptr<char, decltype(&::free)> real(::realpath(path.c_str(), nullptr), &::free);
    if (!real) return Refuse(field, path, absl::StrCat("can't be read: ", std::strerror(errno)));
    absl::StatusOr<std::string> bytes =
        ReadRegular(field, path, real.get(), max_bytes, std::nullopt);
    if (!bytes.ok()) return bytes.status();
    v1::InputFile pin;
    pin.set_path(path);
    pin.set_real_path(real.get());
    pin.set_size(bytes->size());
    pin.set_sha256(Sha256Hex(*bytes));
    pins_[path] = pin;
    order_.push_back(path);
    return bytes;
  }
  const v1::InputFile& pin = pinned->second;
  absl::StatusOr<std::string> bytes =
      ReadRegular(field, path, pin.real_path(), max_bytes, pin.size());
  if (!bytes.ok()) return bytes.status();
  if (Sha256Hex(*bytes) != pin.sha256()) {
    return Refuse(field, path,
                  absl::StrCat("(", pin.real_path(),
                               ") holds other bytes than when the job was checked (SHA-256 ",
                               pin.sha256().substr(0, 16), "...): it was rewritten since"));
  }
  return bytes;
}

absl::Status InputFiles::PinListing(absl::string_view field, const std::string& path,
                                    uint64_t images, const std::string& digest) {
  auto pinned = pins_.find(path);
  if (pinned == pins_.end()) {
    // A job checked by a coordinator from before folders were pinned (pins
    // are only ever the coordinator's: a submission carrying its own is
    // refused): its folder is read as it is.
    if (verifying_) return absl::OkStatus();
    std::unique_ptr<char, decltype(&::free)> real(::realpath(path.c_str(), nullptr), &::free);
    if (!real) return Refuse(field, path, absl::StrCat("can't be read: ", std::strerror(errno)));
    v1::InputFile pin;
    pin.set_path(path);
    pin.set_real_path(real.get());
    pin.set_size(images);
    pin.set_sha256(digest);
    pins_[path] = pin;
    order_.push_back(path);
    return absl::OkStatus();
  }
  const v1::InputFile& pin = pinned->second;
  if (pin.size() != images || pin.sha256() != digest) {
    return Refuse(
        field, path,
        absl::StrCat("changed since the job was checked: ", images, " images now, ", pin.size(),
                     " then, and an image was added, removed, renamed or resized (to "
                     "have the changed file named, make the folder a manifest with "
                     "ddp-pack manifest and set dataset.manifest)"));
  }
  return absl::OkStatus();
}

std::vector<v1::InputFile> InputFiles::Recorded() const {
  std::vector<v1::InputFile> out;
  for (const std::string& path : order_) out.push_back(pins_.at(path));
  return out;
}

}  // namespace ddp
